#include "eval/mitigations.h"

#include <fmt/format.h>

#include <cmath>

#include "util/error.h"

namespace phasekv {
std::string mitigation_condition(const SweepOptions& o) {
  std::string c = o.recent_copy ? "recent_copy" : "";
  if (o.ensemble > 1) c += fmt::format("{}ensemble={}", c.empty() ? "" : "+", o.ensemble);
  return c;
}

std::vector<int> ensemble_shifts(const SweepOptions& o, int model_stride) {
  if (o.recent_copy && o.task.kind != TaskKind::kLookup)
    throw Error("--recent-copy: the task is " + to_string(o.task.kind) +
                " (allowed: lookup, whose harness knows the target record and ends the context "
                "at its key)");
  if (o.ensemble < 1)
    throw Error(fmt::format("--ensemble is {} (allowed: >= 1; 1 = one copy, the plain sweep)",
                            o.ensemble));
  if (o.ensemble == 1) return {0};
  const int stride = o.stride > 0 ? o.stride : model_stride;
  if (stride <= 0)
    throw Error(fmt::format(
        "--ensemble {} needs a stride S to spread its shifts k S / K over, and this model has no "
        "single chunked stride (give --stride S, e.g. the stride of the chunked model it is "
        "compared with)",
        o.ensemble));
  if (o.ensemble > stride)
    throw Error(fmt::format(
        "--ensemble {} exceeds the stride {} (allowed: 1 to {}; more copies would repeat a shift "
        "mod S)",
        o.ensemble, stride, stride));
  std::vector<int> shifts;
  for (int k = 0; k < o.ensemble; ++k) shifts.push_back(k * stride / o.ensemble);
  return shifts;
}

std::vector<ScoreResult> score_ensemble(Backend& backend, const std::vector<ScoreRequest>& requests,
                                        size_t copies) {
  if (copies == 0 || requests.size() % copies != 0)
    throw Error(fmt::format("internal: {} requests are not items of {} copies", requests.size(),
                            copies));
  const std::vector<Distribution> dists = backend.next_token_distributions(requests);
  if (dists.size() != requests.size())
    throw Error(fmt::format("backend {} returned {} distributions for {} requests",
                            backend.model_id(), dists.size(), requests.size()));
  std::vector<ScoreResult> out(requests.size() / copies);
  for (size_t item = 0; item < out.size(); ++item) {
    ScoreResult& r = out[item];
    std::vector<double> avg;
    for (size_t c = 0; c < copies; ++c) {
      const Distribution& d = dists[item * copies + c];
      if (!d.error.empty()) {
        r.error = d.error;
        break;
      }
      if (avg.empty()) avg.assign(d.probs.size(), 0.0);
      if (d.probs.empty() || d.probs.size() != avg.size()) {
        r.error = "the copies of one item returned distributions of different or no size";
        break;
      }
      for (size_t v = 0; v < avg.size(); ++v) avg[v] += d.probs[v] / static_cast<double>(copies);
    }
    if (!r.error.empty()) continue;
    const int32_t target = requests[item * copies].target;
    if (target < 0 || static_cast<size_t>(target) >= avg.size()) {
      r.error = fmt::format("target id {} outside the distribution of {} ids", target, avg.size());
      continue;
    }
    size_t best = 0;
    for (size_t v = 1; v < avg.size(); ++v)
      if (avg[v] > avg[best]) best = v;
    r.argmax = static_cast<int32_t>(best);
    r.argmax_logprob = std::log(avg[best]);
    r.target_logprob = std::log(avg[static_cast<size_t>(target)]);
  }
  return out;
}

}  // namespace phasekv
