// Training configuration, read from TOML: [model] (a JSON config file or inline keys; a config
// with Hugging Face's DeepseekV4ForCausalLM keys trains a DeepSeek-V4 model), [task]
// (a TaskConfig) and [train] (optimiser, schedule, run length). Strict: unknown keys are errors.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "config/model_config.h"
#include "task/tasks.h"
#include "v4/config.h"

namespace phasekv {

struct TrainOptions {
  int steps = 1000;
  int batch = 64;
  double lr = 3e-3;
  double min_lr_ratio = 0.1;  // cosine decays to lr * min_lr_ratio
  int warmup = 100;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.95;
  double clip = 1.0;  // global gradient-norm clipping; 0 = off
  uint64_t seed = 0;
  int threads = 0;  // 0 = all cores
  // Random prefix padding in [0, M) during training, so data does not always land on the same
  // phases (the study's recommended mitigation); 0 = off.
  int offset_randomization = 0;
  // The lookup task's share of training examples laid out with in-sequence padding (fillers
  // between the records), the rest with prefix padding (task/lookup.h); 0.5 by default, the
  // evaluation's two paddings half and half. A training-time mitigation to compare (issue 19):
  // 0 trains on prefix padding only, 1 on in-sequence padding only. Other tasks: 0.5 only.
  double in_sequence_padding = kDefaultInSequenceShare;
  std::string precision = "f32";  // f32 | bf16 (bf16 matmuls, f32 master weights)
  // A model directory whose weights start the run instead of a fresh init (fine-tuning, e.g. with
  // offset_randomization, or a second curriculum stage). Its config must equal [model]. A path
  // relative to the TOML file; stored resolved. "" = fresh init.
  std::string init_from;
  // Share of each batch given to repeated random sequences (dense induction targets, see
  // train/repeat_task.h) instead of task examples; 0 = task only, 1 = a pure warm-up stage.
  double repeat_fraction = 0.0;
  // Whether a repeat is announced by <q> (`<bos> s1..sn <q> s1..sn`) or not (`<bos> s1..sn s1..sn`);
  // see train/repeat_task.h for why the lookup task needs unmarked repeats.
  bool repeat_marker = true;
  // An induction warm-up: the first induction_steps steps train on unmarked repeats only, rows of
  // 6 to induction_len tokens (train/repeat_task.h), before the task (and repeat_fraction) takes
  // over; the learning-rate schedule runs over all steps. Why: a 2-layer d 64 model trained on the
  // lookup task (or on long repeats) from the start sat on a plateau for thousands of steps; after
  // a few hundred steps of short repeats it retrieved within 500 (docs/FINDINGS.md). 0 = off.
  int induction_steps = 0;
  int induction_len = 32;
  // A phase curriculum (issue 19): after every evaluation, a share phase_curriculum of the task
  // examples' phases is drawn in proportion to each phase's error in that evaluation, the rest
  // uniformly: weight(r) = (1 - c)/M + c * err(r) / sum(err), M = offset_randomization (uniform
  // when every phase is right). The evaluation scores eval_examples at phases i mod M, so each
  // phase's error is measured on about eval_examples / M examples. 0 = off (uniform phases).
  double phase_curriculum = 0.0;
  int log_every = 50;
  int eval_every = 500;
  int eval_examples = 256;
  int checkpoint_every = 500;
};

// [corpus]: next-token training on every token of a text corpus (train/text_corpus.h), the code
// models of docs/PROBE.md, instead of a synthetic [task]. Training windows are drawn from the
// manifest's training files, validation windows (eval_examples of them) from its held-out files.
struct CorpusConfig {
  std::string manifest;   // a corpus manifest (data/corpus/*.json), relative to the TOML file
  std::string tokenizer;  // a directory from `phasekv tokenizer train`, relative to the TOML file
  int context_len = 256;  // tokens per window: every one is a prediction
};

constexpr int kMaxTrainBatch = 4096;  // sequences per step (the study trained with 128)

struct TrainConfig {
  ModelConfig model;  // unused when v4 is set
  // [model] config = "file.json" naming DeepseekV4ForCausalLM: a DeepSeek-V4 model (src/v4) is
  // trained instead of phasekv's own (train/trainable.h).
  std::optional<v4::V4Config> v4;
  TaskConfig task;                    // unused when corpus is set
  std::optional<CorpusConfig> corpus;  // [corpus] instead of [task]
  TrainOptions train;
  nlohmann::json source;  // the whole config as JSON, stored beside the model for provenance
};

// A TOML file, or JSON when the path ends in ".json" (e.g. a run's resolved config written by
// `phasekv repro`).
TrainConfig train_config_from_file(const std::string& path);
TrainConfig train_config_from_json(const nlohmann::json& j, const std::string& where,
                                   const std::string& base_dir);
nlohmann::json train_options_to_json(const TrainOptions& t);
nlohmann::json corpus_config_to_json(const CorpusConfig& c);

}  // namespace phasekv
