// What a served model answers: every response parser of the HTTP client, for each dialect, on
// the same JSON body (a server may send anything; the audit must fail with a sentence).
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace phasekv;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(fuzz::as_string(data, size));
  } catch (const nlohmann::json::exception&) {  // parse_error, or out_of_range for 1e99999
    return 0;  // not JSON: the client rejects the body before any parser sees it
  }
  const ScoreRequest request{{1, 2, 3}, 5};
  for (Dialect d : {Dialect::kVllm, Dialect::kSglang, Dialect::kLlamacpp}) {
    fuzz::expect_only_phasekv_errors([&] { parse_score(d, j, request); });
    fuzz::expect_only_phasekv_errors([&] { parse_generate(d, j); });
  }
  fuzz::expect_only_phasekv_errors([&] { parse_tokenize(j); });
  fuzz::expect_only_phasekv_errors([&] { parse_detokenize(j); });
  fuzz::expect_only_phasekv_errors([&] { parse_models(j); });
  fuzz::expect_only_phasekv_errors([&] { llamacpp_context(j); });
  return 0;
}
