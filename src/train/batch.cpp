#include "train/batch.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "train/repeat_task.h"
#include "train/text_corpus.h"

namespace phasekv {

namespace {

// Right-pads the rows with <pad> into one [B, T] tensor and lists their loss positions.
TrainingBatch assemble(const std::vector<std::vector<int32_t>>& seqs,
                       const std::vector<std::vector<int>>& loss_at) {
  size_t T = 0;
  for (const auto& seq : seqs) T = std::max(T, seq.size());
  const auto B = static_cast<int64_t>(seqs.size());
  auto tokens = torch::full({B, static_cast<int64_t>(T)}, TaskVocab::kPad, torch::kInt64);
  auto acc = tokens.accessor<int64_t, 2>();
  std::vector<int64_t> row, col, target;
  for (int64_t b = 0; b < B; ++b) {
    const auto& seq = seqs[static_cast<size_t>(b)];
    for (size_t t = 0; t < seq.size(); ++t) acc[b][static_cast<int64_t>(t)] = seq[t];
    for (int p : loss_at[static_cast<size_t>(b)]) {
      row.push_back(b);
      col.push_back(p);
      target.push_back(seq[static_cast<size_t>(p) + 1]);
    }
  }
  return {tokens, torch::tensor(row), torch::tensor(col), torch::tensor(target)};
}

}  // namespace

TrainingBatch make_training_batch(const TaskConfig& task, std::mt19937_64& rng, int B, int M,
                                  double repeat_fraction, bool repeat_marker,
                                  const std::vector<double>& phase_weights,
                                  double in_sequence_share) {
  const int n_repeat = static_cast<int>(std::lround(repeat_fraction * B));
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<int>> loss_at;
  for (int b = 0; b < B; ++b) {
    if (b < n_repeat) {
      RepeatSequence r =
          sample_repeat_sequence(task, rng, draw_repeat_length(task, rng, M), repeat_marker);
      seqs.push_back(std::move(r.tokens));
      loss_at.push_back(std::move(r.positions));
    } else {
      TaskExample ex = sample_training_example(task, rng, M, phase_weights, in_sequence_share);
      loss_at.push_back(answer_positions(ex));
      seqs.push_back(std::move(ex.tokens));
    }
  }
  return assemble(seqs, loss_at);
}

TrainingBatch make_induction_batch(const TaskConfig& task, std::mt19937_64& rng, int B,
                                   int max_len) {
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<int>> loss_at;
  for (int b = 0; b < B; ++b) {
    RepeatSequence r = sample_repeat_sequence(task, rng, max_len & ~1, false);
    seqs.push_back(std::move(r.tokens));
    loss_at.push_back(std::move(r.positions));
  }
  return assemble(seqs, loss_at);
}

TrainingBatch make_corpus_batch(const std::vector<int32_t>& stream, std::mt19937_64& rng, int B,
                                int T) {
  auto tokens = torch::empty({B, T}, torch::kInt64), target = torch::empty({B * T}, torch::kInt64);
  auto in = tokens.accessor<int64_t, 2>();
  auto out = target.accessor<int64_t, 1>();
  for (int b = 0; b < B; ++b) {
    const std::vector<int32_t> w = random_window(stream, int64_t{T} + 1, rng);
    for (int t = 0; t < T; ++t) {
      in[b][t] = w[static_cast<size_t>(t)];
      out[int64_t{b} * T + t] = w[static_cast<size_t>(t) + 1];
    }
  }
  const auto row = torch::arange(int64_t{B}, torch::kInt64).repeat_interleave(int64_t{T});
  const auto col = torch::arange(int64_t{T}, torch::kInt64).repeat(int64_t{B});
  return {tokens, row, col, target};
}

}  // namespace phasekv
