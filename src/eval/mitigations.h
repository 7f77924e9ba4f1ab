// Inference-time mitigations of the phase sweep (docs/MITIGATIONS.md): SweepOptions::ensemble and
// SweepOptions::recent_copy. SweepMode applies them to every item it scores; the defaults
// (ensemble 1, no recent copy) are the plain sweep, request for request.
//
//   phase ensembling (--ensemble K): each item is scored K times, the k-th copy shifted by
//     floor(k S / K) extra prefix fillers (task/prompt_edits.h), k = 0 .. K-1, so the copies put
//     the target record at K phases spread evenly over the stride S. The K next-token
//     distributions are averaged (probabilities) and the top-1 of the average is the answer. The
//     record keeps the phase of the unshifted copy. Cost: K forwards per item.
//   recent copy (--recent-copy, lookup only): the target record's `key value` is put again right
//     before the target key, inside the raw window, before answering. The harness knows the
//     record; a real system would have to find it, so this is an upper bound of the idea.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "eval/sweep.h"

namespace phasekv {

// The condition of the items (results.jsonl's "condition"): "" for the plain sweep, else
// "ensemble=K", "recent_copy" or "recent_copy+ensemble=K". One results.jsonl may then hold
// several settings of one sweep without ever summarising them together.
std::string mitigation_condition(const SweepOptions& o);

// The extra prefix shifts of the K copies, ascending: {0} for K = 1, else floor(k S / K) with
// S = o.stride when given, else the model's stride (Backend::model_stride). Throws phasekv::Error
// naming the flag: K < 1, K > 1 without a stride, K > S (copies would repeat a shift),
// --recent-copy on a task other than lookup.
std::vector<int> ensemble_shifts(const SweepOptions& o, int model_stride);

// Scores items of `copies` requests each (consecutive in `requests`): the average of their
// next-token distributions (Backend::next_token_distributions), its top-1 (lowest id among ties)
// as argmax and log(average probability of the target) as target_logprob. An item fails when
// one of its copies fails. Returns requests.size() / copies results.
std::vector<ScoreResult> score_ensemble(Backend& backend, const std::vector<ScoreRequest>& requests,
                                        size_t copies);

}  // namespace phasekv
