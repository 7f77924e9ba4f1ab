#include "audit/samples.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "util/fs.h"

namespace phasekv {

using json = nlohmann::json;
namespace fs = std::filesystem;

void write_samples(const AuditOptions& a, HttpBackend& http, const RunResult& run,
                   const std::string& condition, const SamplePrompts& prompts) {
  if (a.log_samples <= 0) return;
  const int64_t total = static_cast<int64_t>(a.examples) * a.modulus;
  const int64_t step = std::max<int64_t>(1, total / a.log_samples);
  std::vector<std::pair<int64_t, int>> pairs;
  for (int64_t i = 0; i < total && static_cast<int>(pairs.size()) < a.log_samples; i += step)
    pairs.push_back({i / a.modulus, static_cast<int>(i % a.modulus)});
  const auto ids = prompts(pairs);
  const auto texts = http.detokenize_many(ids);
  std::string lines;
  for (size_t i = 0; i < pairs.size(); ++i) {
    json line = {{"example_id", pairs[i].first},
                 {"phase", pairs[i].second},
                 {"prompt_tokens", ids[i].size()},
                 {"prompt_ids", ids[i]},
                 {"prompt_text", texts[i]}};
    const auto r = run.latest.find(ItemKey{condition, pairs[i].first, pairs[i].second});
    if (r != run.latest.end()) {
      line["key_pos"] = r->second.key_pos;
      line["target"] = r->second.target;
      line["prediction"] = r->second.prediction;
      line["correct"] = r->second.correct;
      if (!r->second.ok()) line["error"] = r->second.error;
    }
    lines += line.dump() + "\n";
  }
  write_file_atomic((fs::path(a.out) / "samples.jsonl").string(), lines);
  std::cerr << fmt::format("audit: wrote {} sample prompts to {}/samples.jsonl\n", pairs.size(),
                           a.out);
}

}  // namespace phasekv
