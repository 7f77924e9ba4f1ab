// Inference-time prompt edits behind the sweep's mitigations (eval/mitigations.h,
// docs/MITIGATIONS.md). They change what a model is shown, not the example: the phase a sweep
// reports stays the phase of the unedited example from materialize().
#pragma once
#include <cstdint>
#include <vector>

#include "task/tasks.h"

namespace phasekv {

// Phase ensembling: `tokens` (a materialized context of `lg`, starting with <bos>) with `n` more
// padding fillers right after <bos>, where prefix padding puts its own, so that every later token,
// the target record and the query included, moves n positions on. The fillers come from a padding
// stream of the example's own, apart from the ones materialize() draws, so the shifted copies of
// one example share their first fillers (a shift by 4 adds two fillers to the shift by 2). Throws
// phasekv::Error on n < 0 or a context that does not start with <bos>.
std::vector<int32_t> shifted_context(const LogicalExample& lg, const std::vector<int32_t>& tokens,
                                     int n);

// Recent copy (lookup only): `ex` (materialized without its answer, so it ends at the target key)
// with the target record's `key value` inserted right before that final key: the record then
// sits in the last three tokens, inside any raw window of three tokens or more, laid out like a
// demonstration. The target query moves two positions on (query_pos); the records, the phase and
// the padding counts stay as materialized. Throws phasekv::Error for another task kind or a
// context that does not end at the target key.
TaskExample with_recent_copy(TaskExample ex);

}  // namespace phasekv
