// The token streams of a text corpus for next-token language-model training (issue 17's code
// models): every file of a corpus manifest (util/manifest.h: paths, sizes and SHA-256 checked,
// each file's "held_out" flag), encoded with the model's tokenizer and joined in manifest order,
// each file preceded by the tokenizer's start id (when it has one). Training windows come from
// the training files' stream only and validation windows from the held-out files' stream only,
// so a validation loss never reads a file seen in training.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace phasekv {

struct TokenStreams {
  std::vector<int32_t> train, held_out;
  int train_files = 0, held_out_files = 0;
};

// Throws phasekv::Error naming the manifest on a missing or changed file, or when either split
// has no file.
TokenStreams tokenize_corpus(const std::string& manifest_path, const Tokenizer& tokenizer);

// n consecutive tokens of `stream` from a uniform random start (the stream's whole range is
// reachable). Throws phasekv::Error when the stream is shorter than n.
std::vector<int32_t> random_window(const std::vector<int32_t>& stream, int64_t n,
                                   std::mt19937_64& rng);

// The first `max_windows` non-overlapping windows of n tokens from the stream's start (fewer when
// the stream ends first): the same validation windows on every run.
std::vector<std::vector<int32_t>> consecutive_windows(const std::vector<int32_t>& stream,
                                                      int64_t n, int64_t max_windows);

}  // namespace phasekv
