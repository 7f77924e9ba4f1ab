// What the in-process backends (LocalBackend for phasekv's own models, V4Backend for DeepSeek-V4
// checkpoints) share: the model's name from its directory, the check of a scoring request, and
// the choice between them for a model directory.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/tokenizer.h"

namespace phasekv {

// The in-process backend of a model directory: V4Backend for a DeepSeek-V4 checkpoint
// (config.json naming DeepseekV4ForCausalLM), LocalBackend for one of phasekv's own models.
// `batch` sequences per forward (LocalBackend only).
std::unique_ptr<Backend> open_model_dir(const std::string& dir, int threads, int batch);

// "models/tiny/" and "models/tiny" both name the model "tiny".
std::string model_name_of_dir(const std::string& dir);

// Why a request cannot be scored by a model of `vocab` tokens and `max_context` positions ("" when
// it can): checked before any forward so one bad request fails alone instead of its batch.
std::string score_request_error(const ScoreRequest& r, int64_t vocab, int64_t max_context);

// The model's tokenizer.json at work, or an Error naming `model`, which has none.
std::vector<int32_t> encode_with(const std::optional<Tokenizer>& tokenizer,
                                 const std::string& model, const std::string& text);
std::string decode_with(const std::optional<Tokenizer>& tokenizer, const std::string& model,
                        const std::vector<int32_t>& ids);

}  // namespace phasekv
