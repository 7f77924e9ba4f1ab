#include <fmt/format.h>

#include <filesystem>

#include "model/model_dir.h"
#include "model/decoder.h"
#include "perf/bench_suite.h"
#include "perf/flops.h"
#include "perf/timing.h"
#include "perf/train_step.h"
#include "train/batch.h"
#include "train/train_config.h"
#include "util/error.h"

namespace phasekv {
namespace {

TrainStepSpec small_spec(const BenchOptions& o) {
  auto cfg = train_config_from_file(o.small_config);
  return {"small", cfg.model, cfg.train.batch, o.small_seq};
}

// d_model / 64 query heads over 2 KV heads of 64, chunked S=4, W=8, n_win=128 in every layer.
TrainStepSpec large_spec(const BenchOptions& o) {
  ModelConfig m;
  m.vocab_size = 256;
  m.d_model = o.large_d_model;
  m.n_layers = o.large_layers;
  m.head_dim = 64;
  m.n_heads = std::max(2, o.large_d_model / 64);
  m.n_kv_heads = 2;
  m.d_ff = 3 * o.large_d_model;
  m.max_context = static_cast<int>(std::max<int64_t>(4096, o.large_seq));
  AttentionConfig a;
  a.kind = AttentionKind::kChunked;
  a.stride = 4;
  a.width = 8;
  a.n_win = 128;
  m.layers.assign(static_cast<size_t>(m.n_layers), a);
  validate(m, "bench large model");
  return {"large", m, o.large_batch, o.large_seq};
}

// The reproduction suite's reference run (configs/repro/study-base.toml: W8/S8 per-slot payloads,
// n_win 16, d 64, 2 layers) at its real batch and the width of its real batches: the longest row
// of one batch of its task with its offset randomisation (the step then trains on random tokens
// of that width with a loss at every position, as the other rows do).
TrainStepSpec study_spec(const BenchOptions& o) {
  auto cfg = train_config_from_file(o.study_config);
  std::mt19937_64 rng(o.seed);
  const auto batch = make_training_batch(
      cfg.task, rng, cfg.train.batch, cfg.train.offset_randomization, cfg.train.repeat_fraction,
      cfg.train.repeat_marker, {}, cfg.train.in_sequence_padding);
  return {"study", cfg.model, cfg.train.batch, batch.tokens.size(1) - 1};
}

std::string precision_name(Precision p) {
  return p == Precision::kBf16 ? "bf16" : "f32";
}

TrainStepSpec bench_spec(const BenchOptions& o, const std::string& size) {
  if (size == "small") return small_spec(o);
  if (size == "large") return large_spec(o);
  if (size == "study") return study_spec(o);
  throw Error("bench: unknown size '" + size + "' (allowed: small, large, study)");
}

nlohmann::json components_json(const ComponentProfile& p) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& c : p.rows)
    rows.push_back({{"component", c.name}, {"forward_s", c.forward_s}, {"backward_s", c.backward_s}});
  return {{"step_s", p.step_s}, {"rows", rows}};
}

void print_components(const ComponentProfile& p) {
  if (p.rows.empty()) return;
  fmt::print("== study f32 step by component (one step under the profiler: {:.1f} ms)\n",
             p.step_s * 1e3);
  fmt::print("{:<11} {:>10} {:>11} {:>9} {:>6}\n", "component", "forward ms", "backward ms",
             "total ms", "share");
  for (const auto& c : p.rows) {
    const double total = c.forward_s + c.backward_s;
    const bool other = c.name == "other";
    fmt::print("{:<11} {:>10} {:>11} {:>9.1f} {:>5.1f}%\n", c.name,
               other ? "-" : fmt::format("{:.1f}", c.forward_s * 1e3),
               other ? "-" : fmt::format("{:.1f}", c.backward_s * 1e3), total * 1e3,
               100 * total / p.step_s);
  }
  fmt::print(
      "attention: projections, rotary, banded window and entry attention (compressor excluded); "
      "optimizer: clip + AdamW; other: embedding, head, loss, autograd engine\n\n");
}

// DeepSeek-V4 (src/v4) at the study row's batch and width, f32, against the dense study row's
// f32 tokens/s measured just before in this run.
nlohmann::json v4_row(const BenchOptions& o, const nlohmann::json& rows) {
  const auto cfg = train_config_from_file(o.v4_config);
  const TrainStepSpec study = study_spec(o);
  const std::string trace =
      o.profile_dir.empty()
          ? ""
          : (std::filesystem::path(o.profile_dir) / "v4-f32.trace.json").string();
  const auto r = time_v4_train_step(cfg, study.batch, study.seq, o.train_warmup, o.train_reps,
                                    o.seed, trace);
  double dense = 0;
  for (const auto& row : rows)
    if (row.at("size") == "study" && row.at("precision") == "f32")
      dense = row.at("tokens_per_s").get<double>();
  fmt::print("{:<6} {:<5} {:>9} {:>9.1f} {:>9.0f}   (DeepSeek-V4, {}: {:.2f}x the dense study "
             "row's f32 tokens/s)\n",
             "v4", "f32", fmt::format("{}x{}", study.batch, study.seq), r.step_s * 1e3,
             r.tokens_per_s, o.v4_config, dense > 0 ? r.tokens_per_s / dense : 0.0);
  return {{"size", "v4-study"},
          {"precision", "f32"},
          {"config", o.v4_config},
          {"batch", study.batch},
          {"seq", study.seq},
          {"step_s", r.step_s},
          {"median_step_s", r.median_step_s},
          {"tokens_per_s", r.tokens_per_s},
          {"ratio_vs_dense_study_f32", dense > 0 ? nlohmann::json(r.tokens_per_s / dense)
                                                 : nlohmann::json(nullptr)},
          {"loss", r.loss}};
}

}  // namespace

nlohmann::json bench_train(const BenchOptions& o, const GemmPeak& peak) {
  namespace fs = std::filesystem;
  nlohmann::json rows = nlohmann::json::array();
  ComponentProfile study_components;
  fmt::print("== Training step (forward + backward + clip + AdamW), {} threads, load {:.1f}\n",
             o.threads, load_average());
  fmt::print("{:<6} {:<5} {:>9} {:>9} {:>9} {:>8} {:>7} {:>8} {:>9} {:>8}\n", "size", "prec",
             "B x T", "step ms", "tok/s", "GFLOP/s", "MFU", "MFU/bf16", "torch t/s", "x torch");
  for (const auto* size : {"small", "large", "study"}) {
    auto spec = bench_spec(o, size);
    const fs::path dir = fs::temp_directory_path() / fmt::format("phasekv-bench-{}", size);
    if (o.torch) {
      Decoder m(spec.model);
      m->init_weights(o.seed);
      save_model_dir(dir.string(), m);
    }
    for (auto requested : {Precision::kF32, Precision::kBf16}) {
      const std::string trace =
          o.profile_dir.empty() ? ""
                                : (fs::path(o.profile_dir) /
                                   fmt::format("{}-{}.trace.json", size, precision_name(requested)))
                                      .string();
      if (!trace.empty()) fs::create_directories(o.profile_dir);
      // The study row's f32 step is also profiled by component (the compressor, band,
      // MLP, optimizer split), printed after the table.
      const bool by_component = spec.name == "study" && requested == Precision::kF32;
      auto r = time_train_step(spec, requested, o.train_warmup, o.train_reps, o.seed, trace,
                               by_component);
      if (by_component) study_components = r.components;
      const double own_peak = r.precision == Precision::kBf16 ? peak.bf16_flops : peak.f32_flops;
      nlohmann::json row = {{"size", size},
                            {"precision", precision_name(r.precision)},
                            {"requested", precision_name(requested)},
                            {"batch", spec.batch},
                            {"seq", spec.seq},
                            {"d_model", spec.model.d_model},
                            {"n_layers", spec.model.n_layers},
                            {"step_s", r.step_s},
                            {"median_step_s", r.median_step_s},
                            {"tokens_per_s", r.tokens_per_s},
                            {"gflop_per_step", r.flops_per_step / 1e9},
                            {"gflops", r.flops_per_s / 1e9},
                            {"mfu", r.flops_per_s / own_peak},
                            {"mfu_vs_bf16_peak", r.flops_per_s / peak.bf16_flops},
                            {"loss", r.loss}};
      std::string torch_tps = "-", ratio = "-";
      if (o.torch) {
        auto t = run_torch_reference(
            o.reference,
            fmt::format("time --model '{}' --batch {} --seq {} --threads {} "
                        "--precision {} --warmup {} --reps {} --seed {}",
                        dir.string(), spec.batch, spec.seq, o.threads, precision_name(r.precision),
                        o.train_warmup, o.train_reps, o.seed));
        row["torch"] = t;
        const double tt = t.at("tokens_per_s").get<double>();
        row["ratio_vs_torch"] = r.tokens_per_s / tt;
        torch_tps = fmt::format("{:.0f}", tt);
        ratio = fmt::format("{:.2f}", r.tokens_per_s / tt);
      }
      fmt::print("{:<6} {:<5} {:>9} {:>9.1f} {:>9.0f} {:>8.1f} {:>6.1f}% {:>7.1f}% {:>9} {:>8}\n",
                 size, precision_name(r.precision), fmt::format("{}x{}", spec.batch, spec.seq),
                 r.step_s * 1e3, r.tokens_per_s, r.flops_per_s / 1e9,
                 100 * r.flops_per_s / own_peak, 100 * r.flops_per_s / peak.bf16_flops, torch_tps,
                 ratio);
      rows.push_back(row);
    }
  }
  if (!o.v4_config.empty()) rows.push_back(v4_row(o, rows));
  fmt::print(
      "step = fastest of {} timed steps on both sides; MFU = model FLOPs (perf/flops.h) per "
      "second / measured GEMM peak of the precision that ran; MFU/bf16 against the bf16 peak\n\n",
      o.train_reps);
  print_components(study_components);
  return {{"rows", rows}, {"study_components", components_json(study_components)}};
}

nlohmann::json bench_dump(const BenchOptions& o, const std::string& size, const std::string& dir) {
  auto spec = bench_spec(o, size);
  const double loss = dump_train_step(spec, dir, o.seed);
  fmt::print("wrote {} (size {}, B {}, T {}): f32 loss {:.6f}\n", dir, size, spec.batch, spec.seq,
             loss);
  return {{"dir", dir}, {"size", size}, {"loss", loss}};
}

}  // namespace phasekv
