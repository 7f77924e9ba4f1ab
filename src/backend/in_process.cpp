#include "backend/in_process.h"

#include <filesystem>

#include "backend/local_backend.h"
#include "backend/v4_backend.h"
#include "util/error.h"
#include "v4/model_dir.h"

namespace phasekv {

std::unique_ptr<Backend> open_model_dir(const std::string& dir, int threads, int batch) {
  if (v4::is_v4_model_dir(dir))
    return std::make_unique<V4Backend>(V4Backend::from_dir(dir, threads));
  return std::make_unique<LocalBackend>(LocalBackend::from_dir(dir, threads, batch));
}

std::string model_name_of_dir(const std::string& dir) {
  std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  std::string name = p.filename().string();
  if (name.empty() || name == ".")
    name = std::filesystem::absolute(p).lexically_normal().filename().string();
  return name.empty() ? "model" : name;
}

std::string score_request_error(const ScoreRequest& r, int64_t vocab, int64_t max_context) {
  if (r.context.empty()) return "empty context (the model needs at least one token)";
  if (static_cast<int64_t>(r.context.size()) > max_context)
    return "context of " + std::to_string(r.context.size()) +
           " tokens exceeds the model's max_context " + std::to_string(max_context);
  for (int32_t id : r.context)
    if (id < 0 || id >= vocab)
      return "context token id " + std::to_string(id) + " outside the vocabulary [0, " +
             std::to_string(vocab) + ")";
  if (r.target < 0 || r.target >= vocab)
    return "target token id " + std::to_string(r.target) + " outside the vocabulary [0, " +
           std::to_string(vocab) + ")";
  return "";
}

std::vector<int32_t> encode_with(const std::optional<Tokenizer>& tokenizer,
                                 const std::string& model, const std::string& text) {
  if (!tokenizer)
    throw Error("model " + model +
                " has no tokenizer.json, so it cannot tokenize text; give token ids instead");
  return tokenizer->encode(text);
}

std::string decode_with(const std::optional<Tokenizer>& tokenizer, const std::string& model,
                        const std::vector<int32_t>& ids) {
  if (!tokenizer)
    throw Error("model " + model + " has no tokenizer.json, so it cannot detokenize ids");
  return tokenizer->decode(ids);
}

}  // namespace phasekv
