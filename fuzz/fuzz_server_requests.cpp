// What `phasekv serve` reads from a client before any model work: the request head (checked
// before its body is read: framing, Content-Length, size) and the JSON body of every route
// (parsed and validated against the model's limits, chat messages rendered by the template).
// Oracle besides the sanitizers: only ApiError (a 4xx naming the field) escapes, and a request
// that parses respects the limits it was checked against.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "io/tokenizer.h"
#include "server/http_front.h"
#include "server/server_requests.h"

namespace {

using namespace phasekv;

const ModelLimits& limits() {
  static const std::optional<Tokenizer> tokenizer =
      load_tokenizer_if_present(PHASEKV_SOURCE_DIR "/models/kv-chunked");
  static const ModelLimits l = [] {
    ModelLimits m;
    m.name = "fuzz";
    m.vocab_size = tokenizer ? tokenizer->size() : 85;
    m.max_context = 64;
    m.max_tokens = 32;
    m.max_logprobs = 5;
    m.max_prompts = 4;
    m.max_logprob_entries = 2000;
    m.tokenizer = tokenizer ? &*tokenizer : nullptr;
    return m;
  }();
  return l;
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz finding: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input = fuzz::as_string(data, size);
  // The whole input as a request head.
  const HeadCheck h = check_request_head(input, 1024);
  check(h.status != 0 || h.content_length <= 1024, "a head over the body limit passed");
  check(h.status == 0 || !h.message.empty(), "a refused head without a message");
  // The input after its first byte as a body of the route the first byte picks.
  if (size == 0) return 0;
  static const char* routes[] = {"/v1/completions", "/v1/chat/completions", "/tokenize",
                                 "/detokenize"};
  const std::string route = routes[data[0] % 4];
  const std::string body_text = input.substr(1);
  try {
    const nlohmann::json body = parse_body(body_text);
    unknown_fields(body, route);
    const ModelLimits& l = limits();
    if (route == routes[0]) {
      const CompletionRequest r = parse_completion(body, l);
      check(!r.prompts.empty() && static_cast<int>(r.prompts.size()) <= l.max_prompts,
            "completion prompts outside the limits");
      for (const auto& p : r.prompts)
        check(!p.empty() && static_cast<int64_t>(p.size()) + r.max_tokens <= l.max_context,
              "a completion prompt over the context");
    } else if (route == routes[1]) {
      const ChatRequest r = parse_chat(body, l);
      check(static_cast<int64_t>(r.prompt.size()) + r.max_tokens <= l.max_context,
            "a chat over the context");
    } else if (route == routes[2]) {
      parse_tokenize(body, l);
    } else {
      for (int32_t id : parse_detokenize(body, l))
        check(id >= 0 && id < l.vocab_size, "a detokenize id outside the vocabulary");
    }
  } catch (const ApiError& e) {
    check(e.status >= 400 && e.status < 500, "an ApiError that is not a 4xx");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz finding: unexpected %s\n", e.what());
    std::abort();
  }
  return 0;
}
