// phasekv train: train a model from a TOML config into a model directory.
#include <iostream>

#include "cli/commands.h"
#include "cli/path_options.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv::cli {

void register_train(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "train a model on a synthetic retrieval task or a text corpus");
  auto config = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto resume = std::make_shared<bool>(false);
  auto force = std::make_shared<bool>(false);
  auto steps = std::make_shared<int>(0);
  cmd->add_option("--config", *config, "training config (TOML)")
      ->required()
      ->transform(bundled_path());
  cmd->add_option("--out", *out, "output directory (model + checkpoints + log)")
      ->required()
      ->check(output_dir());
  cmd->add_flag("--resume", *resume, "continue from OUT/checkpoint");
  cmd->add_flag("--force", *force,
                "train afresh into an OUT that holds a finished model or a checkpoint, replacing "
                "them (without it, such an OUT is refused)");
  auto* steps_opt = cmd->add_option("--steps", *steps, "override [train] steps (>= 1)");
  auto seed = std::make_shared<uint64_t>(0);
  auto* seed_opt = cmd->add_option(
      "--seed", *seed, "override [train] seed (init and data order): replicate a config's run");
  cmd->callback([=] {
    if (steps_opt->count() > 0 && *steps < 1)
      throw Error("--steps is " + std::to_string(*steps) + " (allowed: >= 1)");
    if (*force && *resume) throw Error("--force and --resume exclude each other");
    auto cfg = train_config_from_file(*config);
    if (steps_opt->count() > 0) cfg.train.steps = *steps;
    if (seed_opt->count() > 0) {
      // The provenance (train.json, and a resume's comparison) must carry the seed that runs.
      cfg.train.seed = *seed;
      cfg.source["train"]["seed"] = *seed;
    }
    // Held from before --force clears anything until the model is written: a second `train`
    // into the same OUT (a resume started twice, a suite and a hand-run) would interleave its
    // checkpoints and log with the first's, and --force would delete a running training's files.
    const DirLock lock(*out);
    if (*force && clear_previous_training(*out))
      std::cerr << "--force: removed the previous training in " << *out << "\n";
    auto r = train(cfg, *out, *resume);
    std::cout << "trained " << r.steps_done << " steps: loss " << r.final_loss << ", eval "
              << (cfg.corpus ? "next-token acc " : "acc ") << r.eval_acc << " loss "
              << r.eval_loss << ", " << static_cast<int64_t>(r.tokens_per_s) << " tokens/s -> "
              << *out << "\n";
  });
}

}  // namespace phasekv::cli
