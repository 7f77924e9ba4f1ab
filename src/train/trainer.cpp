#include "train/trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <thread>
#include <algorithm>
#include <sstream>

#include "kernels/compute_threads.h"
#include "model/model_dir.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "model/precision.h"
#include "train/batch.h"
#include "train/fused_adamw.h"
#include "train/text_corpus.h"
#include "train/trainable.h"
#include "util/cpu_info.h"
#include "util/duration.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/hash.h"

namespace phasekv {
namespace fs = std::filesystem;

namespace {

double lr_at(const TrainOptions& t, int step) {
  if (step < t.warmup) return t.lr * (step + 1) / t.warmup;
  double progress = t.steps > t.warmup ? double(step - t.warmup) / (t.steps - t.warmup) : 1.0;
  double cosine = 0.5 * (1.0 + std::cos(M_PI * std::min(progress, 1.0)));
  return t.lr * (t.min_lr_ratio + (1.0 - t.min_lr_ratio) * cosine);
}

std::vector<torch::Tensor> parameters_of(Trainable& model) {
  std::vector<torch::Tensor> out;
  for (auto& [name, p] : model.named_parameters()) out.push_back(p);
  return out;
}

std::unique_ptr<torch::optim::AdamW> make_optimizer(Trainable& model, const TrainOptions& t) {
  // Decay matrices only: norm scales, gate biases and sinks are not regularised towards 0.
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : parameters_of(model)) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto opts =
      torch::optim::AdamWOptions(t.lr).betas({t.beta1, t.beta2}).weight_decay(t.weight_decay);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(opts));
  auto nd = opts;
  nd.weight_decay(0.0);
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(nd));
  return std::make_unique<FusedAdamW>(groups, opts);
}

std::string rng_state(const std::mt19937_64& rng) {
  std::ostringstream ss;
  ss << rng;
  return ss.str();
}

// The checkpoint files that state.json vouches for: their size and FNV-1a 64 are written into it
// and checked on --resume, so a truncated or bit-flipped file is an error naming it instead of a
// PytorchStreamReader message or a run that silently diverges later (issue 20, item 9).
const char* const kCheckpointFiles[] = {"model.safetensors", "optimizer.pt"};

nlohmann::json file_checksum(const fs::path& path) {
  const std::string bytes = read_file(path.string());
  return {{"bytes", bytes.size()}, {"fnv1a64", fnv1a64_hex(bytes)}};
}

// Checkpoint = weights + optimiser state + data RNG + step, written into a fresh directory that
// replaces the previous one by rename, so a kill at any moment leaves one complete checkpoint.
void save_checkpoint(const std::string& out_dir, Trainable& model, torch::optim::AdamW& opt,
                     const std::mt19937_64& rng, int step,
                     const std::vector<double>& phase_weights) {
  const fs::path dir = fs::path(out_dir) / "checkpoint", tmp = fs::path(out_dir) / "checkpoint.tmp",
                 old = fs::path(out_dir) / "checkpoint.old";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  NamedTensors tensors;
  for (const auto& [name, p] : model.named_parameters()) tensors.emplace_back(name, p.detach());
  save_safetensors((tmp / "model.safetensors").string(), tensors);
  // Serialized in memory, then written like every other file: torch::save into a file it cannot
  // write (a full disk) throws from PyTorchStreamWriter's destructor, which aborts the process.
  std::ostringstream opt_bytes;
  torch::save(opt, opt_bytes);
  write_file_atomic((tmp / "optimizer.pt").string(), opt_bytes.str());
  nlohmann::json state = {{"step", step}, {"rng", rng_state(rng)}};
  // The curriculum's weights are data-order state like the RNG: a resume draws with them.
  if (!phase_weights.empty()) state["phase_weights"] = phase_weights;
  for (const char* f : kCheckpointFiles) state["checksums"][f] = file_checksum(tmp / f);
  write_file_atomic((tmp / "state.json").string(), state.dump());
  fs::remove_all(old);
  if (fs::exists(dir)) fs::rename(dir, old);
  fs::rename(tmp, dir);
  fs::remove_all(old);
}

// Checks the files against state.json's checksums. A checkpoint written before checksums existed
// has none: it still loads, with a warning.
void verify_checkpoint(const fs::path& dir, const nlohmann::json& state) {
  const std::string state_path = (dir / "state.json").string();
  if (!state.contains("checksums")) {
    std::cerr << "warning: " << state_path
              << " has no checksums (a checkpoint from an older phasekv): its files are loaded "
                 "unverified\n";
    return;
  }
  for (const char* f : kCheckpointFiles) {
    const fs::path path = dir / f;
    const nlohmann::json want = state["checksums"].value(f, nlohmann::json());
    if (!want.is_object() || !want.contains("bytes") || !want.contains("fnv1a64"))
      throw Error(state_path + ": checksums has no valid entry for " + f +
                  " (expected {\"bytes\": N, \"fnv1a64\": \"hex\"})");
    if (!fs::exists(path)) throw Error("--resume: " + path.string() + " is missing");
    const nlohmann::json got = file_checksum(path);
    if (got["bytes"] != want["bytes"])
      throw Error("--resume: " + path.string() + " has " + got["bytes"].dump() + " bytes but " +
                  state_path + " records " + want["bytes"].dump() +
                  " (truncated or replaced); restore it or train afresh with --force");
    if (got["fnv1a64"] != want["fnv1a64"])
      throw Error("--resume: " + path.string() + " does not match its checksum in " + state_path +
                  " (fnv1a64 " + got["fnv1a64"].get<std::string>() + ", recorded " +
                  want["fnv1a64"].get<std::string>() +
                  "): the file is corrupt; restore it or train afresh with --force");
  }
}

// state.json's step and data RNG; anything else is an error naming the file.
int read_checkpoint_state(const std::string& path, const nlohmann::json& state,
                          std::mt19937_64& rng) {
  if (!state.is_object() || !state.contains("step") || !state["step"].is_number_unsigned() ||
      !state.contains("rng") || !state["rng"].is_string())
    throw Error(path + ": not a checkpoint state (expected {\"step\": N >= 0, \"rng\": \"...\"})");
  std::istringstream ss(state["rng"].get<std::string>());
  ss >> rng;
  if (ss.fail()) throw Error(path + ": key 'rng' is not a saved random-generator state");
  return state["step"].get<int>();
}

int load_checkpoint(const std::string& out_dir, Trainable& model, torch::optim::AdamW& opt,
                    std::mt19937_64& rng, std::vector<double>& phase_weights) {
  fs::path dir = fs::path(out_dir) / "checkpoint";
  if (!fs::exists(dir / "state.json") &&
      fs::exists(fs::path(out_dir) / "checkpoint.old" / "state.json"))
    dir = fs::path(out_dir) / "checkpoint.old";  // killed between the two renames
  if (!fs::exists(dir / "state.json"))
    throw Error("--resume: no checkpoint in " + out_dir + " (expected " +
                (dir / "state.json").string() + ")");
  const std::string state_path = (dir / "state.json").string();
  const nlohmann::json state = read_json_file(state_path);
  std::mt19937_64 saved_rng;
  const int step = read_checkpoint_state(state_path, state, saved_rng);
  verify_checkpoint(dir, state);
  const std::string weights = (dir / "model.safetensors").string();
  auto file = load_safetensors(weights);
  {
    torch::NoGradGuard g;
    for (auto& [name, p] : model.named_parameters())
      p.copy_(take_tensor(file, weights, name, p.sizes()));
  }
  const std::string optimizer = (dir / "optimizer.pt").string();
  try {
    torch::load(opt, optimizer);
  } catch (const c10::Error& e) {
    // Reached by a checkpoint without checksums; libtorch's message names no file.
    throw Error("--resume: " + optimizer + " cannot be read as optimizer state (truncated or " +
                "corrupt?): " + e.what_without_backtrace());
  }
  rng = saved_rng;
  phase_weights.clear();
  if (state.contains("phase_weights")) {
    const auto& w = state["phase_weights"];
    if (!w.is_array()) throw Error(state_path + ": key 'phase_weights' is not an array of numbers");
    for (const auto& x : w) {
      if (!x.is_number()) throw Error(state_path + ": key 'phase_weights' holds a non-number");
      phase_weights.push_back(x.get<double>());
    }
  }
  return step;
}

// Drops log lines past the checkpoint, so a resumed run's log reads like an uninterrupted one.
void trim_log(const std::string& path, int step) {
  if (!fs::exists(path)) return;
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      if (nlohmann::json::parse(line).at("step").get<int>() <= step) kept += line + "\n";
    } catch (const std::exception&) {  // a line cut by the kill
    }
  }
  write_file_atomic(path, kept);
}

// What of a previous training lies in out_dir: a finished model or a checkpoint ("" = neither).
std::string previous_training(const std::string& out_dir) {
  const fs::path d(out_dir);
  if (fs::exists(d / "model.safetensors"))
    return "a finished model (" + (d / "model.safetensors").string() + ")";
  for (const char* c : {"checkpoint", "checkpoint.old"})
    if (fs::exists(d / c)) return "a checkpoint (" + (d / c).string() + ")";
  return "";
}

// A resumed run must continue the run that wrote the checkpoint: the config (as train.json
// recorded it) may differ in [train] steps only.
void check_resume_config(const TrainConfig& cfg, const std::string& out_dir) {
  const std::string path = out_dir + "/train.json";
  if (!fs::exists(path) && !fs::exists(fs::path(out_dir) / "checkpoint") &&
      !fs::exists(fs::path(out_dir) / "checkpoint.old"))
    return;  // no checkpoint either: loading it says so
  if (!fs::exists(path))
    throw Error("--resume: " + path + " is missing, so the checkpoint's config is unknown; " +
                "train afresh (--force) instead");
  nlohmann::json before;
  try {
    before = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw Error("--resume: " + path + " is not valid JSON (" + e.what() + ")");
  }
  if (!before.is_object()) throw Error("--resume: " + path + " is not a JSON object");
  before.erase("runtime");
  nlohmann::json now = cfg.source;
  for (auto* j : {&before, &now})
    if (j->contains("train") && (*j)["train"].is_object()) (*j)["train"].erase("steps");
  if (before == now) return;
  // Name the first differing key, as section.key.
  std::set<std::string> sections;
  for (auto* j : {&before, &now})
    for (auto it = j->begin(); it != j->end(); ++it) sections.insert(it.key());
  for (const auto& s : sections) {
    const nlohmann::json a = before.value(s, nlohmann::json()), b = now.value(s, nlohmann::json());
    if (a == b) continue;
    std::string key = s;
    if (a.is_object() && b.is_object()) {
      std::set<std::string> keys;
      for (const auto* j : {&a, &b})
        for (auto it = j->begin(); it != j->end(); ++it) keys.insert(it.key());
      for (const auto& k : keys)
        if (a.value(k, nlohmann::json()) != b.value(k, nlohmann::json())) {
          key = s + "." + k;
          throw Error("--resume: the config differs from the checkpoint's (" + path + ") in " +
                      key + ": was " + a.value(k, nlohmann::json()).dump() + ", now " +
                      b.value(k, nlohmann::json()).dump() +
                      " (only [train] steps may change on a resume)");
        }
    }
    throw Error("--resume: the config differs from the checkpoint's (" + path + ") in [" + key +
                "] (only [train] steps may change on a resume)");
  }
}

struct StepOutcome {
  double loss = 0, acc = 0;
};

// One optimiser step on one batch: forward (under `precision`), answer-only loss, backward,
// clipping, update. The training loop and the planner's timing (measure_step_cost) both run it.
StepOutcome optimizer_step(Trainable& model, torch::optim::Optimizer& opt,
                           const TrainingBatch& batch, Precision precision, double clip) {
  opt.zero_grad();
  torch::Tensor logits, loss;
  {
    PrecisionGuard guard(precision);
    // The loss always sees f32.
    logits = model.logits_at(batch.tokens, batch.row, batch.col).to(torch::kFloat32);
    loss = torch::nn::functional::cross_entropy(logits, batch.target);
  }
  // An indexer's own loss (model/indexer.h) reaches only the indexers, so the LM loss and the
  // reported figures are unchanged by it.
  const torch::Tensor aux = model.aux_loss();
  (aux.defined() ? loss + aux : loss).backward();
  if (clip > 0) torch::nn::utils::clip_grad_norm_(parameters_of(model), clip);
  opt.step();
  model.after_step();
  return {loss.item<double>(),
          (logits.argmax(-1) == batch.target).to(torch::kFloat64).mean().item<double>()};
}

// Where a run's batches and evaluations come from: the synthetic [task], or the token streams of a
// [corpus] (tokenized once per run: about a second for the bundled code corpus).
class TrainingData {
 public:
  explicit TrainingData(const TrainConfig& cfg) : cfg_(cfg) {
    if (!cfg.corpus) return;
    const auto tokenizer = load_tokenizer_if_present(cfg.corpus->tokenizer);
    if (!tokenizer) throw Error("[corpus] tokenizer: " + cfg.corpus->tokenizer + " has no tokenizer.json");
    streams_ = tokenize_corpus(cfg.corpus->manifest, *tokenizer);
    validation_ = consecutive_windows(streams_.held_out, int64_t{cfg.corpus->context_len} + 1,
                                      cfg.train.eval_examples);
    if (validation_.empty())
      throw Error(fmt::format("[corpus] {}: the held-out files hold {} tokens, fewer than one "
                              "validation window of context_len + 1 = {}",
                              cfg.corpus->manifest, streams_.held_out.size(),
                              cfg.corpus->context_len + 1));
    std::cerr << fmt::format(
        "corpus: {} training files ({} tokens), {} held-out files ({} tokens), {} validation "
        "windows of {} tokens\n",
        streams_.train_files, streams_.train.size(), streams_.held_out_files,
        streams_.held_out.size(), validation_.size(), cfg.corpus->context_len);
  }

  TrainingBatch batch(int step, std::mt19937_64& rng,
                      const std::vector<double>& phase_weights) const {
    const auto& t = cfg_.train;
    if (cfg_.corpus) return make_corpus_batch(streams_.train, rng, t.batch, cfg_.corpus->context_len);
    if (step < t.induction_steps) return make_induction_batch(cfg_.task, rng, t.batch, t.induction_len);
    return make_training_batch(cfg_.task, rng, t.batch, t.offset_randomization, t.repeat_fraction,
                               t.repeat_marker, phase_weights, t.in_sequence_padding);
  }

  EvalScore evaluate(Trainable& model, int n, uint64_t seed) const {
    if (cfg_.corpus) return evaluate_next_tokens(model, validation_);
    return evaluate_targets(model, cfg_.task, n, seed, std::max(cfg_.train.offset_randomization, 1));
  }

  int validation_windows() const { return static_cast<int>(validation_.size()); }

  // What a model directory needs beside its weights: the task's files, or the corpus's tokenizer.
  void save_beside_model(const std::string& out_dir) const {
    if (!cfg_.corpus) return save_task_files(out_dir, cfg_.task);
    for (const char* f : {"tokenizer.json", "tokenizer.model"}) {
      const fs::path from = fs::path(cfg_.corpus->tokenizer) / f;
      if (fs::exists(from)) write_file_atomic(out_dir + "/" + f, read_file(from.string()));
    }
  }

 private:
  const TrainConfig& cfg_;
  TokenStreams streams_;
  std::vector<std::vector<int32_t>> validation_;
};

}  // namespace

namespace {
// Everything a model directory or a training leaves in it.
constexpr const char* kModelDirFiles[] = {
    "checkpoint",    "checkpoint.old", "checkpoint.tmp", "model.safetensors", "config.json",
    "task.json",     "tokenizer.json", "tokenizer.model", "train.json",       "train_log.jsonl"};
}  // namespace

std::vector<std::string> model_files_in(const std::string& out_dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const char* f : kModelDirFiles)
    if (fs::exists(fs::path(out_dir) / f, ec)) found.emplace_back(f);
  return found;
}

bool clear_previous_training(const std::string& out_dir) {
  const fs::path d(out_dir);
  bool any = false;
  for (const char* f : kModelDirFiles) any = fs::remove_all(d / f) > 0 || any;
  return any;
}

void init_from_model_dir(Decoder& model, const std::string& dir) {
  trainable_decoder(model)->init_from(dir);
}

EvalScore evaluate_targets(Decoder& model, const TaskConfig& task, int n, uint64_t seed,
                           int modulus) {
  return evaluate_targets(*trainable_decoder(model), task, n, seed, modulus);
}

EvalScore evaluate_next_tokens(Decoder& model, const std::vector<std::vector<int32_t>>& windows) {
  return evaluate_next_tokens(*trainable_decoder(model), windows);
}

EvalScore evaluate_targets(Trainable& model, const TaskConfig& task, int n, uint64_t seed,
                           int modulus) {
  torch::NoGradGuard g;
  const int M = std::max(modulus, 1);
  int correct = 0;
  double loss_sum = 0.0;
  EvalScore score;
  score.phase_correct.assign(static_cast<size_t>(M), 0);
  score.phase_count.assign(static_cast<size_t>(M), 0);
  const int chunk = 128;
  for (int start = 0; start < n; start += chunk) {
    std::vector<TaskExample> exs;
    for (int i = start; i < std::min(n, start + chunk); ++i) {
      auto lg = make_logical_example(task, seed, static_cast<uint64_t>(i));
      exs.push_back(materialize(lg, M, i % M, PaddingMode::kPrefix, /*with_answer=*/false));
    }
    // Same modulus and context length: every sequence has the same length.
    const int64_t T = static_cast<int64_t>(exs[0].tokens.size());
    auto tokens = torch::empty({static_cast<int64_t>(exs.size()), T}, torch::kInt64);
    for (size_t b = 0; b < exs.size(); ++b)
      for (int64_t t = 0; t < T; ++t)
        tokens[static_cast<int64_t>(b)][t] = exs[b].tokens[static_cast<size_t>(t)];
    const int64_t B = tokens.size(0);
    const auto last = model.logits_at(tokens, torch::arange(B), torch::full({B}, T - 1, torch::kInt64));
    auto logp = torch::log_softmax(last.to(torch::kFloat64), -1);
    auto pred = logp.argmax(-1);
    for (size_t b = 0; b < exs.size(); ++b) {
      const int64_t answer = exs[b].target().answer;
      const bool right = pred[static_cast<int64_t>(b)].item<int64_t>() == answer;
      correct += right;
      score.phase_correct[static_cast<size_t>(exs[b].phase)] += right;
      ++score.phase_count[static_cast<size_t>(exs[b].phase)];
      loss_sum -= logp[static_cast<int64_t>(b)][answer].item<double>();
    }
  }
  score.acc = double(correct) / n;
  score.loss = loss_sum / n;
  return score;
}

EvalScore evaluate_next_tokens(Trainable& model,
                               const std::vector<std::vector<int32_t>>& windows) {
  torch::NoGradGuard g;
  if (windows.empty()) throw Error("evaluate_next_tokens: no window");
  const int64_t T = static_cast<int64_t>(windows[0].size()) - 1;
  double loss_sum = 0;
  int64_t correct = 0, count = 0;
  const size_t chunk = 16;  // 16 x T x vocab logits at a time
  for (size_t start = 0; start < windows.size(); start += chunk) {
    const size_t n = std::min(chunk, windows.size() - start);
    auto tokens = torch::empty({static_cast<int64_t>(n), T + 1}, torch::kInt64);
    auto acc = tokens.accessor<int64_t, 2>();
    for (size_t b = 0; b < n; ++b) {
      const auto& w = windows[start + b];
      if (static_cast<int64_t>(w.size()) != T + 1)
        throw Error("evaluate_next_tokens: windows of different lengths");
      for (int64_t t = 0; t <= T; ++t) acc[static_cast<int64_t>(b)][t] = w[static_cast<size_t>(t)];
    }
    const auto input = tokens.slice(1, 0, T), target = tokens.slice(1, 1, T + 1);
    const auto logp = torch::log_softmax(model.logits(input).to(torch::kFloat64), -1);
    loss_sum -= logp.gather(-1, target.unsqueeze(-1)).sum().item<double>();
    correct += (logp.argmax(-1) == target).sum().item<int64_t>();
    count += target.numel();
  }
  EvalScore score;
  score.loss = loss_sum / static_cast<double>(count);
  score.acc = static_cast<double>(correct) / static_cast<double>(count);
  return score;
}

std::vector<double> curriculum_weights(const EvalScore& e, double c) {
  const size_t M = e.phase_count.size();
  std::vector<double> err(M, 0.0), w(M, 1.0 / static_cast<double>(M));
  double total = 0;
  for (size_t r = 0; r < M; ++r) {
    if (e.phase_count[r] > 0) err[r] = 1.0 - double(e.phase_correct[r]) / e.phase_count[r];
    total += err[r];
  }
  if (total <= 0) return w;
  for (size_t r = 0; r < M; ++r) w[r] = (1 - c) / static_cast<double>(M) + c * err[r] / total;
  return w;
}

TrainResult train(const TrainConfig& cfg, const std::string& out_dir, bool resume, int stop_after) {
  const auto& t = cfg.train;
  if (resume) {
    check_resume_config(cfg, out_dir);
  } else if (const std::string prev = previous_training(out_dir); !prev.empty()) {
    throw Error(out_dir + " already holds " + prev +
                ": continue it with --resume, or pass --force to train afresh and replace it");
  }
  flush_denormals();
  kernels::set_compute_threads(
      t.threads > 0 ? t.threads : static_cast<int>(std::thread::hardware_concurrency()));
  const TrainingData data(cfg);
  fs::create_directories(out_dir);
  torch::manual_seed(t.seed);
  const std::unique_ptr<Trainable> trained = make_trainable(cfg);
  Trainable& model = *trained;
  // A resumed run takes its weights from its checkpoint instead.
  if (!t.init_from.empty() && !resume) model.init_from(t.init_from);
  model.set_training(true);
  auto opt = make_optimizer(model, t);
  std::mt19937_64 rng(t.seed * 0x9E3779B97F4A7C15ull + 1);
  const std::string log_path = out_dir + "/train_log.jsonl";
  int step = 0;
  std::vector<double> phase_weights;  // the curriculum's; empty = uniform phases
  if (resume) {
    step = load_checkpoint(out_dir, model, *opt, rng, phase_weights);
    trim_log(log_path, step);
    std::cerr << "resumed from step " << step << "\n";
  } else {
    write_file_atomic(log_path, "");
  }
  // Checked appends: a full disk stops the run naming the file (its checkpoint stays whole)
  // instead of training on with log lines silently missing.
  AppendFile log(log_path);
  // bf16 runs the forward and loss under CPU autocast (f32 master weights and optimiser state);
  // without native bf16 GEMMs it falls back to f32. train.json records what actually ran.
  const Precision precision =
      resolve_precision(t.precision == "bf16" ? Precision::kBf16 : Precision::kF32);
  auto provenance = cfg.source;
  // The CPU this (latest) training segment ran on: reports name it beside the run's figures.
  provenance["runtime"] = {{"precision", precision == Precision::kBf16 ? "bf16" : "f32"},
                           {"bf16_native", bf16_native()},
                           {"cpu", cpu_description()}};
  write_file_atomic(out_dir + "/train.json", provenance.dump(2) + "\n");
  if (t.precision != "f32")
    std::cerr << "precision: requested " << t.precision << ", running "
              << (precision == Precision::kBf16 ? "bf16" : "f32") << "\n";

  const uint64_t eval_seed = t.seed + 1000003;  // disjoint from the training stream
  TrainResult result;
  if (step >= t.steps) {  // a resume of a finished run: its last logged figures, not zeros
    std::istringstream lines(read_file(log_path));
    nlohmann::json last;
    for (std::string line; std::getline(lines, line);)
      if (!line.empty()) last = nlohmann::json::parse(line, nullptr, false);
    if (last.is_object()) {
      result.final_loss = last.value("loss", 0.0);
      result.eval_acc = last.value("eval_acc", 0.0);
      result.eval_loss = last.value("eval_loss", 0.0);
      result.tokens_per_s = last.value("tokens_per_s", 0.0);
    }
  }
  double loss_sum = 0, acc_sum = 0, tokens_done = 0;
  int window = 0;
  auto t_start = std::chrono::steady_clock::now(), t_window = t_start;
  for (; step < t.steps; ++step) {
    const TrainingBatch batch = data.batch(step, rng, phase_weights);
    for (auto& group : opt->param_groups())
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr_at(t, step));
    const StepOutcome out = optimizer_step(model, *opt, batch, precision, t.clip);
    if (!std::isfinite(out.loss))
      throw Error(fmt::format("training diverged at step {}: loss {}", step, out.loss));
    loss_sum += out.loss;
    acc_sum += out.acc;
    tokens_done += static_cast<double>(batch.tokens.numel());
    ++window;
    const int done = step + 1;
    const bool last = done == t.steps;
    if (done % t.log_every == 0 || last) {
      auto now = std::chrono::steady_clock::now();
      double secs = std::chrono::duration<double>(now - t_window).count();
      double tps = tokens_done / std::max(secs, 1e-9);
      double eta = (t.steps - done) * secs / window;
      nlohmann::json rec = {{"step", done},
                            {"loss", loss_sum / window},
                            {"train_acc", acc_sum / window},
                            {"lr", lr_at(t, step)},
                            {"tokens_per_s", tps}};
      std::string eval_str;
      if (done % t.eval_every == 0 || last) {
        model.set_training(false);
        const EvalScore e = data.evaluate(model, t.eval_examples, eval_seed);
        result.eval_acc = e.acc;
        result.eval_loss = e.loss;
        model.set_training(true);
        rec["eval_acc"] = result.eval_acc;
        rec["eval_loss"] = result.eval_loss;
        if (t.phase_curriculum > 0 && done >= t.induction_steps) {
          phase_weights = curriculum_weights(e, t.phase_curriculum);
          rec["phase_weights"] = phase_weights;
        }
        eval_str = fmt::format(" | eval acc {:.3f} loss {:.3f}", result.eval_acc, result.eval_loss);
      }
      log.append(rec.dump() + "\n");
      std::cerr << fmt::format(
          "step {:>6}/{}  loss {:.4f}  acc {:.3f}{}  |  {:.0f} tok/s  ETA {}\n", done, t.steps,
          loss_sum / window, acc_sum / window, eval_str, tps, format_duration(eta));
      result.final_loss = loss_sum / window;
      result.tokens_per_s = tps;
      loss_sum = acc_sum = tokens_done = 0;
      window = 0;
      t_window = std::chrono::steady_clock::now();
    }
    if (done % t.checkpoint_every == 0 || last) save_checkpoint(out_dir, model, *opt, rng, done, phase_weights);
    if (stop_after > 0 && done == stop_after) {
      result.steps_done = done;
      return result;
    }
  }
  result.steps_done = step;
  model.set_training(false);
  model.save(out_dir, {{"seed", std::to_string(t.seed)}});
  data.save_beside_model(out_dir);  // sweeps, serving and probes need the tokenizer (and task)
  return result;
}

StepCost measure_step_cost(const TrainConfig& cfg, int warmup, int reps) {
  if (warmup < 0 || reps < 1)
    throw Error(fmt::format("measure_step_cost: warmup {} and reps {} (allowed: >= 0, >= 1)",
                            warmup, reps));
  const auto& t = cfg.train;
  flush_denormals();
  kernels::set_compute_threads(
      t.threads > 0 ? t.threads : static_cast<int>(std::thread::hardware_concurrency()));
  const TrainingData data(cfg);
  const std::unique_ptr<Trainable> trained = make_trainable(cfg);
  Trainable& model = *trained;
  model.set_training(true);
  auto opt = make_optimizer(model, t);
  const Precision precision =
      resolve_precision(t.precision == "bf16" ? Precision::kBf16 : Precision::kF32);
  std::mt19937_64 rng(t.seed * 0x9E3779B97F4A7C15ull + 1);
  using clock = std::chrono::steady_clock;
  auto median_step = [&](bool induction) {
    std::vector<double> secs;
    for (int i = 0; i < warmup + reps; ++i) {
      // Batches are built inside the timed span, as in train(): their cost is part of a step.
      const auto t0 = clock::now();
      const TrainingBatch batch = data.batch(induction ? 0 : t.induction_steps, rng, {});
      optimizer_step(model, *opt, batch, precision, t.clip);
      if (i >= warmup) secs.push_back(std::chrono::duration<double>(clock::now() - t0).count());
    }
    std::sort(secs.begin(), secs.end());
    return secs[secs.size() / 2];
  };
  StepCost cost;
  if (t.induction_steps > 0) cost.induction_s = median_step(true);
  if (t.steps > t.induction_steps) cost.task_s = median_step(false);
  model.set_training(false);
  // A corpus run evaluates all its validation windows; a task run eval_examples prompts.
  const int n = cfg.corpus ? data.validation_windows() : std::max(8, t.eval_examples / 8);
  const auto t0 = clock::now();
  data.evaluate(model, n, t.seed + 1000003);
  cost.eval_example_s = std::chrono::duration<double>(clock::now() - t0).count() / n;
  return cost;
}

}  // namespace phasekv
