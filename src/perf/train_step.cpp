#include "perf/train_step.h"

#include <torch/csrc/autograd/profiler_legacy.h>

#include <filesystem>

#include "model/model_dir.h"
#include "io/safetensors.h"
#include "model/component_scope.h"
#include "model/decoder.h"
#include "perf/flops.h"
#include "perf/op_profile.h"
#include "perf/timing.h"
#include "train/fused_adamw.h"
#include "train/trainable.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

torch::Tensor step_loss(Decoder& model, const torch::Tensor& tokens, Precision precision) {
  const int64_t T = tokens.size(1) - 1;
  auto input = tokens.narrow(1, 0, T), target = tokens.narrow(1, 1, T).reshape({-1});
  PrecisionGuard guard(precision);
  auto logits = model->forward(input).to(torch::kFloat32);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target);
}

Decoder seeded_model(const TrainStepSpec& spec, uint64_t seed) {
  Decoder model(spec.model);
  model->init_weights(seed);
  model->train();
  return model;
}

// One step under libtorch's profiler (the chrome trace at `path`), then one under the op
// profiler (path + ".ops.tsv").
void write_profile(const std::function<void()>& step, const std::string& path) {
  warm_up_op_profiler(step);  // else the first row's trace and table are inflated
  {
    torch::autograd::profiler::RecordProfile trace(path);
    step();
  }
  write_op_profile(step, path + ".ops.tsv");
}

}  // namespace

torch::Tensor train_step_tokens(const TrainStepSpec& spec, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 17);
  return at::randint(spec.model.vocab_size, {spec.batch, spec.seq + 1}, gen, torch::kInt64);
}

TrainStepResult time_train_step(const TrainStepSpec& spec, Precision precision, int warmup,
                                int reps, uint64_t seed, const std::string& profile,
                                bool components) {
  auto model = seeded_model(spec, seed);
  auto tokens = train_step_tokens(spec, seed);
  FusedAdamW opt(model->parameters(),
                 torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1));
  TrainStepResult r;
  r.precision = resolve_precision(precision);
  auto step = [&] {
    opt.zero_grad();
    auto loss = step_loss(model, tokens, r.precision);
    loss.backward();
    {
      ComponentScope scope(Component::kOptimizer);
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();
    }
    r.loss = loss.item<double>();
  };
  auto t = time_runs(step, warmup, reps);
  r.step_s = t.min_s;
  r.median_step_s = t.median_s;
  r.tokens_per_s = double(spec.batch * spec.seq) / t.min_s;
  r.flops_per_step = train_step_flops(spec.model, spec.batch, spec.seq);
  r.flops_per_s = r.flops_per_step / t.min_s;
  if (!profile.empty()) write_profile(step, profile);
  if (components) {
    warm_up_op_profiler(step);
    r.components = profile_components(step);
  }
  return r;
}

TrainStepResult time_v4_train_step(const TrainConfig& cfg, int64_t batch, int64_t seq, int warmup,
                                   int reps, uint64_t seed, const std::string& profile) {
  if (!cfg.v4) throw Error("bench: the V4 row's training config has no DeepSeek-V4 [model]");
  auto model = make_v4_trainable(cfg);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 17);
  auto tokens = at::randint(cfg.v4->vocab_size, {batch, seq + 1}, gen, torch::kInt64);
  std::vector<torch::Tensor> params;
  for (auto& [name, t] : model->named_parameters()) params.push_back(t);
  FusedAdamW opt(params, torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1));
  TrainStepResult r;
  auto step = [&] {
    opt.zero_grad();
    auto logits = model->logits(tokens.narrow(1, 0, seq));
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                                     tokens.narrow(1, 1, seq).reshape({-1}));
    loss.backward();
    torch::nn::utils::clip_grad_norm_(params, 1.0);
    opt.step();
    model->after_step();
    r.loss = loss.item<double>();
  };
  auto t = time_runs(step, warmup, reps);
  r.step_s = t.min_s;
  r.median_step_s = t.median_s;
  r.tokens_per_s = double(batch * seq) / t.min_s;
  if (!profile.empty()) write_profile(step, profile);
  return r;
}

double dump_train_step(const TrainStepSpec& spec, const std::string& dir, uint64_t seed) {
  namespace fs = std::filesystem;
  auto model = seeded_model(spec, seed);
  auto tokens = train_step_tokens(spec, seed);
  auto loss = step_loss(model, tokens, Precision::kF32);
  loss.backward();
  fs::create_directories(dir);
  model->eval();
  save_model_dir(dir, model, torch::kFloat32, {{"seed", std::to_string(seed)}});
  save_safetensors((fs::path(dir) / "batch.safetensors").string(), {{"tokens", tokens}});
  NamedTensors grads;
  nlohmann::json norms = nlohmann::json::object();
  for (const auto& p : model->named_parameters()) {
    grads.emplace_back(p.key(), p.value().grad().detach().clone());
    norms[p.key()] = p.value().grad().norm().item<double>();
  }
  save_safetensors((fs::path(dir) / "grads.safetensors").string(), grads);
  nlohmann::json step = {{"loss", loss.item<double>()},
                         {"batch", spec.batch},
                         {"seq", spec.seq},
                         {"grad_norms", norms}};
  write_file_atomic((fs::path(dir) / "step.json").string(), step.dump(2) + "\n");
  return loss.item<double>();
}

}  // namespace phasekv
