// Model commands: init (seeded random model directory), info (architecture and cache bytes),
// logits (full forward or streaming, as JSON, for cross-implementation checks).
#include <fmt/format.h>

#include <iostream>
#include <map>
#include <sstream>

#include "cli/commands.h"
#include "cli/path_options.h"
#include "kernels/compute_threads.h"
#include "model/model_dir.h"
#include "model/precision.h"
#include "runtime/session.h"
#include "train/trainer.h"
#include "util/cpu_info.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/threads.h"
#include "v4/model_dir.h"

namespace phasekv::cli {

void set_threads(int n) {
  flush_denormals();  // model/precision.h
  // All cores means those of the CPU affinity: `taskset -c 1` gets 1 thread, not one per core.
  if (n <= 0) n = usable_cores();
  kernels::set_compute_threads(n);
}

CLI::Validator compute_threads() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        int64_t n = 0;
        try {
          size_t used = 0;
          n = std::stoll(s, &used);
          if (used != s.size()) return "'" + s + "' is not an integer";
        } catch (const std::exception&) {
          return "'" + s + "' is not an integer that fits in 64 bits";
        }
        return compute_threads_problem(n);
      },
      "0.." + std::to_string(max_compute_threads()));
}

CLI::Validator non_negative() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s.find('-') != std::string::npos)
          return "'" + s + "' is negative (allowed: a non-negative integer)";
        return "";
      },
      "NONNEGATIVE");
}

// An integer >= 1. CLI::PositiveNumber said "Value 0 not in range 0.000000 to 1.79e308" for 0.
CLI::Validator at_least_one() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        long long v = 0;
        size_t used = 0;
        try {
          v = std::stoll(s, &used);
        } catch (const std::exception&) {
        }
        if (used != s.size() || used == 0 || v < 1)
          return "'" + s + "' is not allowed (allowed: an integer >= 1)";
        return "";
      },
      "INT>=1");
}

namespace {
// `init` with a DeepSeek-V4 config.json (HF keys): a seeded random V4 checkpoint directory.
void init_v4(const std::string& config, const std::string& out, uint64_t seed,
             const std::string& dtype, bool force) {
  const v4::V4Config cfg = v4::read_config(config);
  if (v4::is_v4_model_dir(out) && !force)
    throw Error("--out " + out + " already holds a DeepSeek-V4 model: pass --force to replace it");
  v4::V4Model model(cfg);
  model.init_random(seed);
  v4::save_v4_dir(out, model, dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32);
  std::cout << "wrote " << out << " (DeepSeek-V4, " << cfg.num_hidden_layers << " layers)\n";
}
}  // namespace

void register_init(CLI::App& app) {
  auto* cmd = app.add_subcommand("init", "write a seeded, randomly initialised model directory");
  auto config = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto seed = std::make_shared<uint64_t>(0);
  auto dtype = std::make_shared<std::string>("f32");
  cmd->add_option("--config", *config, "model config JSON")->required()->transform(bundled_path());
  cmd->add_option("--out", *out, "output model directory")->required()->check(output_dir());
  cmd->add_option("--seed", *seed, "initialisation seed")->check(non_negative());
  cmd->add_option("--dtype", *dtype, "weights dtype: f32|bf16")
      ->check(CLI::IsMember({"f32", "bf16"}));
  auto force = std::make_shared<bool>(false);
  cmd->add_flag("--force", *force,
                "replace a model already in --out (its weights, config, task, tokenizer, "
                "training files and checkpoints)");
  cmd->callback([=] {
    if (v4::is_v4_config_file(*config)) {
      init_v4(*config, *out, *seed, *dtype, *force);
      return;
    }
    auto cfg = model_config_from_file(*config);
    // A new config and weights beside an old task.json and tokenizer.json would make a model
    // that sweeps at 0.000 without a word: refuse, as `train` does, or clear it all.
    const std::vector<std::string> previous = model_files_in(*out);
    if (!previous.empty() && !*force)
      throw Error(fmt::format(
          "--out {} already holds a model ({}): pass --force to replace all of it, or choose "
          "another directory",
          *out, fmt::join(previous, ", ")));
    if (*force && clear_previous_training(*out))
      std::cerr << "--force: removed the previous model in " << *out << "\n";
    Decoder model(cfg);
    model->init_weights(*seed);
    save_model_dir(*out, model, *dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32,
                   {{"seed", std::to_string(*seed)}});
    std::cout << "wrote " << *out << " (" << cfg.n_layers << " layers, config " << config_hash(cfg)
              << ")\n";
  });
}

void register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "print the architecture per layer and KV-cache bytes");
  auto dir = std::make_shared<std::string>();
  auto context = std::make_shared<int64_t>(4096);
  // One model, given either way: two options, so that --help lists neither as REQUIRED.
  auto* positional = cmd->add_option("model_dir", *dir, "model directory (or --model DIR)")
                         ->transform(bundled_path());
  auto* flag = cmd->add_option("--model", *dir, "model directory (or as the argument)")
                   ->transform(bundled_path())
                   ->excludes(positional);
  cmd->add_option("--context", *context, "context length T for the cache size")
      ->check(CLI::PositiveNumber);
  cmd->callback([=] {
    if (positional->count() + flag->count() == 0)
      throw CLI::RequiredError("the model directory (phasekv info DIR, or --model DIR)");
    auto model = load_model_dir(*dir);
    const auto& c = model->cfg;
    int64_t params = 0;
    for (const auto& p : model->parameters()) params += p.numel();
    std::cout << fmt::format(
        "model {}  config {}\n  vocab {}  d_model {}  layers {}  heads {} (kv {})  head_dim {}  "
        "d_ff {}\n  rope theta {} dims {}  qk_norm {}  tied embeddings {}  max_context {}\n  "
        "parameters {}\n",
        *dir, config_hash(c), c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads,
        c.head_dim, c.d_ff, c.rope_theta, c.rotary_dims(), c.qk_norm, c.tie_embeddings,
        c.max_context, params);
    std::cout << fmt::format(
        "KV cache at T = {} (f32):\n  {:>5}  {:<60} {:>12} {:>12} {:>10} {:>12}\n", *context,
        "layer", "attention", "raw", "entries", "partial", "total");
    int64_t total = 0, full_total = 0;
    AttentionConfig full;
    // Per layer kind (a hybrid stack such as DeepSeek-V4's mixes them): layers and bytes.
    std::map<std::string, std::pair<int, int64_t>> kinds;
    for (int i = 0; i < c.n_layers; ++i) {
      const auto& a = c.layers[static_cast<size_t>(i)];
      auto b = cache_bytes_theory(c, a, *context, 4);
      total += b.total();
      full_total += cache_bytes_theory(c, full, *context, 4).total();
      std::cout << fmt::format("  {:>5}  {:<60} {:>12} {:>12} {:>10} {:>12}\n", i, describe(a),
                               b.raw, b.entries, b.pending, b.total());
      const std::string kind = a.kind != AttentionKind::kChunked ? to_string(a.kind)
                               : a.indexed() ? fmt::format("chunked S={} top-k", a.stride)
                                             : fmt::format("chunked S={}", a.stride);
      ++kinds[kind].first;
      kinds[kind].second += b.total();
    }
    for (const auto& [kind, n] : kinds)
      std::cout << fmt::format("  {:<24} {:>2} layers {:>14} bytes ({:.4f} of total)\n", kind,
                               n.first, n.second,
                               total ? static_cast<double>(n.second) / total : 0.0);
    std::cout << fmt::format("  total {} bytes ({:.4f} of full attention's {} bytes)\n", total,
                             full_total ? static_cast<double>(total) / full_total : 0.0,
                             full_total);
  });
}

namespace {
std::vector<int64_t> parse_tokens(const std::string& s, int64_t vocab) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      int64_t v = std::stoll(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      throw Error("--tokens: '" + item + "' is not an integer token id");
    }
    if (out.back() < 0 || out.back() >= vocab)
      throw Error("--tokens: token id " + item + " out of range [0, " + std::to_string(vocab) +
                  ")");
  }
  if (out.empty()) throw Error("--tokens: give at least one token id, e.g. --tokens 1,2,3");
  return out;
}
}  // namespace

namespace {
void print_logits(torch::Tensor logits, const std::vector<int64_t>& ids, bool stream,
                  const std::string& out) {
  logits = logits.contiguous().to(torch::kFloat64);
  nlohmann::json j;
  j["tokens"] = ids;
  j["mode"] = stream ? "stream" : "full";
  j["logits"] = nlohmann::json::array();
  for (int64_t t = 0; t < logits.size(0); ++t) {
    auto row = logits[t];
    j["logits"].push_back(
        std::vector<double>(row.data_ptr<double>(), row.data_ptr<double>() + row.numel()));
  }
  if (out.empty())
    std::cout << j.dump() << "\n";
  else
    write_file_atomic(out, j.dump() + "\n");
}

// `logits` on a DeepSeek-V4 checkpoint directory: the full forward, or with `stream` calls of
// `chunk` tokens on one cache.
torch::Tensor v4_logits(const std::string& dir, const std::string& tokens, bool stream,
                        int64_t chunk, std::vector<int64_t>& ids) {
  const v4::V4Model model = v4::load_v4_dir(dir);
  ids = parse_tokens(tokens, model.cfg.vocab_size);
  torch::NoGradGuard no_grad;
  auto all = torch::tensor(ids, torch::kInt64);
  if (!stream) return model.forward(all);
  v4::V4Cache cache;
  std::vector<torch::Tensor> parts;
  for (int64_t at = 0; at < all.size(0); at += chunk)
    parts.push_back(model.forward(all.narrow(0, at, std::min(chunk, all.size(0) - at)), cache));
  return torch::cat(parts);
}
}  // namespace

void register_logits(CLI::App& app) {
  auto* cmd = app.add_subcommand("logits", "print the logits of a token sequence as JSON");
  auto dir = std::make_shared<std::string>();
  auto tokens = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto stream = std::make_shared<bool>(false);
  auto chunk = std::make_shared<int64_t>(1);
  cmd->add_option("--model", *dir, "model directory")->required()->transform(bundled_path());
  cmd->add_option("--tokens", *tokens, "comma-separated token ids")->required();
  auto* stream_flag = cmd->add_flag(
      "--stream", *stream,
      "use the streaming session: prefill in chunks of --chunk tokens (default 1: one token at a "
      "time, i.e. pure decode)");
  // Without --stream the whole sequence is one forward: a --chunk there used to be ignored.
  cmd->add_option("--chunk", *chunk, "with --stream: tokens per prefill call (>= 1)")
      ->check(at_least_one())
      ->needs(stream_flag);
  cmd->add_option("--out", *out, "write JSON here instead of stdout")->check(output_file());
  cmd->callback([=] {
    set_threads(0);
    std::vector<int64_t> ids;
    if (v4::is_v4_model_dir(*dir)) {
      print_logits(v4_logits(*dir, *tokens, *stream, *chunk, ids), ids, *stream, *out);
      return;
    }
    auto model = load_model_dir(*dir);
    ids = parse_tokens(*tokens, model->cfg.vocab_size);
    if (static_cast<int64_t>(ids.size()) > model->cfg.max_context)
      throw Error("--tokens: " + std::to_string(ids.size()) + " tokens exceed max_context " +
                  std::to_string(model->cfg.max_context));
    torch::Tensor logits;
    if (*stream) {
      Session session(model);
      std::vector<torch::Tensor> parts;
      for (size_t i = 0; i < ids.size(); i += static_cast<size_t>(*chunk)) {
        size_t end = std::min(ids.size(), i + static_cast<size_t>(*chunk));
        parts.push_back(session.feed(
            {ids.begin() + static_cast<long>(i), ids.begin() + static_cast<long>(end)}));
      }
      logits = torch::cat(parts, 0);
    } else {
      torch::NoGradGuard g;
      logits = model->forward(torch::tensor(ids, torch::kInt64).unsqueeze(0)).squeeze(0);
    }
    print_logits(logits, ids, *stream, *out);
  });
}

}  // namespace phasekv::cli
