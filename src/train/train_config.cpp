#include "train/train_config.h"

#include <cmath>
#include <filesystem>
#include <set>

#include "io/tokenizer.h"
#include "train/repeat_task.h"
#include "util/config_file.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/json_read.h"
#include "util/threads.h"

namespace phasekv {
namespace {

using nlohmann::json;

using json_read::read;

// A [train] number must be finite and in its range. Written as one check because NaN fails every
// comparison: `lr <= 0` let `lr = nan` through to the optimizer, which ended the run with
// "internal tensor error" (issue 20, item 9). The message shows the value as TOML writes it.
void check_number(double v, bool in_range, const std::string& where, const char* key,
                  const char* allowed) {
  if (std::isfinite(v) && in_range) return;
  const std::string shown = std::isnan(v) ? "nan" : std::isinf(v) ? (v > 0 ? "inf" : "-inf")
                                                                   : json(v).dump();
  throw Error(where + ": key '" + key + "' is " + shown + " (allowed: " + allowed + ")");
}

TrainOptions options_from_json(const json& j, const std::string& where) {
  // clang-format off
  static const std::set<std::string> keys = {
      "steps", "batch", "lr", "min_lr_ratio", "warmup", "weight_decay", "beta1", "beta2", "clip",
      "seed", "threads", "offset_randomization", "precision", "log_every", "eval_every",
      "init_from", "eval_examples", "checkpoint_every", "repeat_fraction", "repeat_marker",
      "induction_steps", "induction_len", "phase_curriculum", "in_sequence_padding"};
  // clang-format on
  json_read::check_keys(j, keys, where);
  TrainOptions t;
  read(j, "steps", t.steps, where);
  read(j, "batch", t.batch, where);
  read(j, "lr", t.lr, where);
  read(j, "min_lr_ratio", t.min_lr_ratio, where);
  read(j, "warmup", t.warmup, where);
  read(j, "weight_decay", t.weight_decay, where);
  read(j, "beta1", t.beta1, where);
  read(j, "beta2", t.beta2, where);
  read(j, "clip", t.clip, where);
  read(j, "seed", t.seed, where);
  read(j, "threads", t.threads, where);
  read(j, "offset_randomization", t.offset_randomization, where);
  read(j, "precision", t.precision, where);
  read(j, "init_from", t.init_from, where);
  read(j, "repeat_fraction", t.repeat_fraction, where);
  read(j, "repeat_marker", t.repeat_marker, where);
  read(j, "induction_steps", t.induction_steps, where);
  read(j, "induction_len", t.induction_len, where);
  read(j, "phase_curriculum", t.phase_curriculum, where);
  read(j, "in_sequence_padding", t.in_sequence_padding, where);
  read(j, "log_every", t.log_every, where);
  read(j, "eval_every", t.eval_every, where);
  read(j, "eval_examples", t.eval_examples, where);
  read(j, "checkpoint_every", t.checkpoint_every, where);
  auto positive = [&](int v, const char* k) {
    if (v < 1) throw Error(where + ": key '" + std::string(k) + "' must be >= 1");
  };
  positive(t.steps, "steps");
  positive(t.batch, "batch");
  // Sequences are materialised per batch: batch = 1e9 grew memory at 100 MB/s with no error.
  if (t.batch > kMaxTrainBatch)
    throw Error(where + ": key 'batch' is " + std::to_string(t.batch) + " (allowed: 1.." +
                std::to_string(kMaxTrainBatch) + ")");
  positive(t.log_every, "log_every");
  positive(t.eval_every, "eval_every");
  positive(t.eval_examples, "eval_examples");
  positive(t.checkpoint_every, "checkpoint_every");
  check_compute_threads(t.threads, where + ": key 'threads'");
  check_number(t.lr, t.lr > 0, where, "lr", "a finite number > 0");
  check_number(t.min_lr_ratio, t.min_lr_ratio >= 0 && t.min_lr_ratio <= 1, where, "min_lr_ratio",
               "a number in [0, 1]");
  check_number(t.weight_decay, t.weight_decay >= 0, where, "weight_decay", "a finite number >= 0");
  check_number(t.beta1, t.beta1 >= 0 && t.beta1 < 1, where, "beta1", "a number in [0, 1)");
  check_number(t.beta2, t.beta2 >= 0 && t.beta2 < 1, where, "beta2", "a number in [0, 1)");
  check_number(t.clip, t.clip >= 0, where, "clip", "a finite number >= 0, 0 = no clipping");
  check_number(t.repeat_fraction, t.repeat_fraction >= 0 && t.repeat_fraction <= 1, where,
               "repeat_fraction", "a number in [0, 1]");
  check_number(t.phase_curriculum, t.phase_curriculum >= 0 && t.phase_curriculum <= 1, where,
               "phase_curriculum", "a number in [0, 1], 0 = off");
  check_number(t.in_sequence_padding, t.in_sequence_padding >= 0 && t.in_sequence_padding <= 1,
               where, "in_sequence_padding", "a number in [0, 1]");
  if (t.phase_curriculum > 0 && t.offset_randomization < 2)
    throw Error(where + ": key 'phase_curriculum' needs phases to weigh: offset_randomization is " +
                std::to_string(t.offset_randomization) + " (allowed with a curriculum: >= 2)");
  if (t.warmup < 0) throw Error(where + ": key 'warmup' must be >= 0");
  if (t.offset_randomization < 0) throw Error(where + ": key 'offset_randomization' must be >= 0");
  if (t.induction_steps < 0 || t.induction_steps > t.steps)
    throw Error(where + ": key 'induction_steps' is " + std::to_string(t.induction_steps) +
                " (allowed: 0 to steps = " + std::to_string(t.steps) + ")");
  if (t.precision != "f32" && t.precision != "bf16")
    throw Error(where + ": key 'precision' has value '" + t.precision + "' (allowed: f32|bf16)");
  return t;
}

std::string resolve_path(const std::string& path, const std::string& base_dir) {
  std::filesystem::path p(path);
  if (p.is_relative()) p = std::filesystem::path(base_dir) / p;
  return p.lexically_normal().string();
}

// [corpus]: the files and the tokenizer are checked here, so that a wrong path or a tokenizer of
// another size stops the run before any step.
CorpusConfig corpus_from_json(const json& j, const std::string& where, const std::string& base_dir,
                              const ModelConfig& model) {
  json_read::check_keys(j, {"manifest", "tokenizer", "context_len"}, where);
  CorpusConfig c;
  for (const char* k : {"manifest", "tokenizer"})
    if (!j.contains(k)) throw Error(where + ": missing key '" + std::string(k) + "'");
  read(j, "manifest", c.manifest, where);
  read(j, "tokenizer", c.tokenizer, where);
  read(j, "context_len", c.context_len, where);
  c.manifest = resolve_path(c.manifest, base_dir);
  c.tokenizer = resolve_path(c.tokenizer, base_dir);
  if (!std::filesystem::exists(c.manifest))
    throw Error(where + ": key 'manifest': " + c.manifest + " does not exist");
  if (c.context_len < 2 || c.context_len > model.max_context)
    throw Error(where + ": key 'context_len' is " + std::to_string(c.context_len) +
                " (allowed: 2 to the model's max_context = " + std::to_string(model.max_context) +
                ")");
  const auto tok = load_tokenizer_if_present(c.tokenizer);
  if (!tok)
    throw Error(where + ": key 'tokenizer': " + c.tokenizer +
                " has no tokenizer.json (make one with `phasekv tokenizer train`)");
  if (tok->size() != model.vocab_size)
    throw Error(where + ": the tokenizer in " + c.tokenizer + " has " +
                std::to_string(tok->size()) + " tokens but [model] vocab_size is " +
                std::to_string(model.vocab_size) + " (they must be equal)");
  return c;
}

// What [train] keys mean for synthetic tasks only; a corpus run refuses them rather than
// silently ignoring them (its windows start anywhere, so phases are random already).
void check_corpus_options(const TrainOptions& t, const std::string& where) {
  auto refuse = [&](bool set, const char* key) {
    if (set)
      throw Error(where + ": key '" + std::string(key) +
                  "' applies to [task] training only (allowed with [corpus]: 0 or absent)");
  };
  refuse(t.offset_randomization != 0, "offset_randomization");
  refuse(t.repeat_fraction != 0, "repeat_fraction");
  refuse(t.induction_steps != 0, "induction_steps");
  refuse(t.phase_curriculum != 0, "phase_curriculum");
  if (t.in_sequence_padding != kDefaultInSequenceShare)
    throw Error(where + ": key 'in_sequence_padding' applies to [task] training only (allowed " +
                "with [corpus]: absent)");
}

}  // namespace

nlohmann::json corpus_config_to_json(const CorpusConfig& c) {
  return {{"manifest", c.manifest}, {"tokenizer", c.tokenizer}, {"context_len", c.context_len}};
}

nlohmann::json train_options_to_json(const TrainOptions& t) {
  nlohmann::json j = {{"steps", t.steps},
          {"batch", t.batch},
          {"lr", t.lr},
          {"min_lr_ratio", t.min_lr_ratio},
          {"warmup", t.warmup},
          {"weight_decay", t.weight_decay},
          {"beta1", t.beta1},
          {"beta2", t.beta2},
          {"clip", t.clip},
          {"seed", t.seed},
          {"threads", t.threads},
          {"offset_randomization", t.offset_randomization},
          {"precision", t.precision},
          {"init_from", t.init_from},
          {"repeat_fraction", t.repeat_fraction},
          {"log_every", t.log_every},
          {"eval_every", t.eval_every},
          {"eval_examples", t.eval_examples},
          {"checkpoint_every", t.checkpoint_every}};
  // Written only when not the default, so configs and checkpoints of runs from before these keys
  // stay unchanged.
  if (!t.repeat_marker) j["repeat_marker"] = false;
  if (t.phase_curriculum > 0) j["phase_curriculum"] = t.phase_curriculum;
  if (t.in_sequence_padding != kDefaultInSequenceShare)
    j["in_sequence_padding"] = t.in_sequence_padding;
  if (t.induction_steps > 0) {
    j["induction_steps"] = t.induction_steps;
    j["induction_len"] = t.induction_len;
  }
  return j;
}

TrainConfig train_config_from_json(const json& j, const std::string& where,
                                   const std::string& base_dir) {
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "model" && it.key() != "task" && it.key() != "corpus" && it.key() != "train")
      throw Error(where + ": unknown section [" + it.key() +
                  "] (allowed: model, task or corpus, train)");
  const bool corpus = j.contains("corpus");
  if (corpus && j.contains("task"))
    throw Error(where + ": [task] and [corpus] are both given (allowed: one of them: a synthetic "
                        "task, or next-token training on a text corpus)");
  for (const char* s : {"model", corpus ? "corpus" : "task", "train"})
    if (!j.contains(s))
      throw Error(where + ": missing section [" + std::string(s) + "]" +
                  (std::string(s) == "task" ? " (or [corpus])" : ""));
  TrainConfig c;
  const json& m = j.at("model");
  // [model] either points at a model config JSON (config = "path", relative to the TOML file)
  // or holds the model keys inline.
  if (m.contains("config")) {
    if (m.size() != 1 || !m.at("config").is_string())
      throw Error(where +
                  ": [model] takes either config = \"file.json\" or inline model keys, not both");
    const std::string path = resolve_path(m.at("config").get<std::string>(), base_dir);
    if (v4::is_v4_config_file(path))
      c.v4 = v4::read_config(path);
    else
      c.model = model_config_from_file(path);
  } else {
    c.model = model_config_from_json(m, where + ": [model]");
  }
  c.train = options_from_json(j.at("train"), where + ": [train]");
  if (!c.train.init_from.empty()) c.train.init_from = resolve_path(c.train.init_from, base_dir);
  if (c.v4 && corpus)
    throw Error(where + ": [corpus] with a DeepSeek-V4 [model] is not supported (allowed: a "
                        "synthetic [task])");
  if (c.v4 && c.train.precision != "f32")
    throw Error(where + ": [train] precision '" + c.train.precision +
                "' with a DeepSeek-V4 [model] (allowed: f32)");
  if (corpus) {
    c.corpus = corpus_from_json(j.at("corpus"), where + ": [corpus]", base_dir, c.model);
    check_corpus_options(c.train, where + ": [train]");
    c.source = {{"model", model_config_to_json(c.model)},
                {"corpus", corpus_config_to_json(*c.corpus)},
                {"train", train_options_to_json(c.train)}};
    return c;
  }
  c.task = task_config_from_json(j.at("task"), where + ": [task]");
  const int vocab = task_vocab(c.task).vocab_size();
  const int64_t model_vocab = c.v4 ? c.v4->vocab_size : c.model.vocab_size;
  if (model_vocab != vocab)
    throw Error(where + ": [model] vocab_size is " + std::to_string(model_vocab) +
                " but the task's vocabulary has " + std::to_string(vocab) +
                " tokens (5 specials + n_keys + n_values + n_filler)");
  if (c.train.repeat_fraction > 0)
    check_repeat_lengths(c.task, c.train.offset_randomization, where + ": [train]");
  if (c.train.induction_steps > 0) check_induction_len(c.task, c.train.induction_len, where);
  if (c.task.kind != TaskKind::kLookup && c.train.in_sequence_padding != kDefaultInSequenceShare)
    throw Error(where +
                ": [train] key 'in_sequence_padding' applies to the lookup task only (task '" +
                to_string(c.task.kind) + "' trains on prefix padding; allowed: absent)");
  c.source = {{"model", c.v4 ? v4::config_to_json(*c.v4) : model_config_to_json(c.model)},
              {"task", task_config_to_json(c.task)},
              {"train", train_options_to_json(c.train)}};
  return c;
}

TrainConfig train_config_from_file(const std::string& path) {
  auto dir = std::filesystem::path(path).parent_path().string();
  return train_config_from_json(read_config_file(path), path, dir.empty() ? "." : dir);
}

}  // namespace phasekv
