// results.jsonl, the file every resumed sweep, audit and analysis reads back (a torn last line
// included), and the round trip of each record it keeps.
#include "eval/results_file.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace phasekv;
  const std::string path = fuzz::input_file("results.jsonl", data, size);
  fuzz::expect_only_phasekv_errors([&] {
    const ResultsFile file = read_results(path);
    for (const EvalRecord& r : file.records) {
      const nlohmann::json j = record_to_json(r);
      if (record_to_json(record_from_json(j, "round trip")) != j) {
        std::fprintf(stderr, "fuzz finding: record round trip differs: %s\n", j.dump().c_str());
        std::abort();
      }
    }
  });
  return 0;
}
