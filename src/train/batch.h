// One training batch: task examples and, if asked, repeated random sequences (repeat_task.h).
#pragma once
#include <torch/torch.h>

#include <random>

#include "task/tasks.h"

namespace phasekv {

// Sequences right-padded with <pad> (harmless for a causal model: padding only follows the tokens
// it could affect), and the positions the loss is taken at.
struct TrainingBatch {
  torch::Tensor tokens;            // [B, T] int64
  torch::Tensor row, col, target;  // [N] int64: hidden[row, col] predicts target
};

// The first round(repeat_fraction * B) rows are repeated random sequences of the task's lengths,
// (marked with <q> unless repeat_marker is false), with a target at every predictable repeated
// token; the rest are task examples (random prefix padding in
// [0, M) when M > 1) with targets at their answers; with phase_weights (M of them, a phase
// curriculum) the task examples' phases are drawn by weight instead of uniformly; a lookup
// example gets in-sequence padding with probability in_sequence_share. Consumes `rng` in row
// order.
TrainingBatch make_training_batch(const TaskConfig& task, std::mt19937_64& rng, int B, int M,
                                  double repeat_fraction, bool repeat_marker = true,
                                  const std::vector<double>& phase_weights = {},
                                  double in_sequence_share = kDefaultInSequenceShare);

// The induction warm-up's batch ([train] induction_steps): B unmarked repeats, each row of an even
// length uniform in [6, max_len] (repeat_task.h). Consumes `rng` in row order.
TrainingBatch make_induction_batch(const TaskConfig& task, std::mt19937_64& rng, int B,
                                   int max_len);

// Next-token training on a token stream ([corpus]): B windows of T + 1 consecutive tokens from
// uniform random starts (train/text_corpus.h's random_window); the [B, T] inputs predict the
// next token at every position. Consumes `rng` in row order.
TrainingBatch make_corpus_batch(const std::vector<int32_t>& stream, std::mt19937_64& rng, int B,
                                int T);

}  // namespace phasekv
