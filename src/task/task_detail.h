// Helpers shared by the task generators of src/task (tasks.cpp, lookup.cpp); not part of the task
// API, so nothing outside src/task includes this.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "task/tasks.h"
#include "util/rng.h"

namespace phasekv::task_detail {

// Training examples draw their logical examples under this seed, apart from evaluation seeds.
inline constexpr uint64_t kTrainingSeed = 0x747261696e696e67ULL;  // "training"
// Padding-filler streams of an example's padding_seed (seed_for(padding_seed, stream)).
inline constexpr uint64_t kPadBeforeStream = 1, kPadAfterStream = 2;
// The extra fillers of phase ensembling's shifted copies (task/prompt_edits.h); lookup.cpp uses
// streams 3 and 4 for its gap draws.
inline constexpr uint64_t kPadShiftStream = 5;

// n distinct draws from [0, range), in draw order (n <= range).
std::vector<int> draw_distinct(Rng& rng, int n, int range);
// `count` filler tokens, each uniform over the vocabulary's fillers.
std::vector<int32_t> draw_fillers(const TaskVocab& v, Rng& rng, int count);
// The padding seed of the example whose generator was seeded with `example_base`.
uint64_t padding_seed(uint64_t example_base);
// The first `count` tokens of one padding stream of `lg`: a phase needing fewer tokens takes a
// prefix of what another phase takes.
std::vector<int32_t> padding_fillers(const LogicalExample& lg, uint64_t stream, int count);

// Throws phasekv::Error "task layout check failed (seed, example, M, r, padding): what".
[[noreturn]] void layout_error(const TaskExample& ex, const std::string& what);

}  // namespace phasekv::task_detail
