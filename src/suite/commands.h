// The `phasekv train` and `phasekv sweep` command lines of the suite: the one place in suite/
// that knows the CLI's flag names. The runner (suite/runner.h) executes them as argv vectors,
// `phasekv mitigations commands` (suite/mitigations.h) prints them for a shell. The words and
// their order stay as they are: a resumed suite and earlier printed commands must see the same
// command lines.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace phasekv {

// `BINARY sweep --model MODEL --task TASK --examples N --modulus M --padding P --seed S
// --threads T FLAGS... --out OUT [--target-depth D]`.
struct SweepCommand {
  std::string binary, model, task;
  int examples = 0, modulus = 0;
  std::string padding;
  uint64_t seed = 0;
  int threads = 1;
  // Flags after --threads, in order: e.g. {"--recent-copy"}, {"--ensemble", "4"},
  // {"--bootstrap-reps", "0", "--permutations", "0"}. (The {} initializers let a designated
  // initializer leave these out without -Wmissing-field-initializers.)
  std::vector<std::string> flags{};
  std::string out;
  std::optional<double> target_depth{};  // a depth-grid sweep's target depth, written as {:g}
};
std::vector<std::string> sweep_argv(const SweepCommand& c);

// `BINARY train --config CONFIG --out OUT [--resume]`.
struct TrainCommand {
  std::string binary, config, out;
  bool resume = false;
};
std::vector<std::string> train_argv(const TrainCommand& c);

// `s` as one shell word: unchanged when it holds only letters, digits and ._-/=,:+, else in
// single quotes.
std::string shell_quote(const std::string& s);
// argv as one shell command line: each word shell_quote()d, joined by single spaces.
std::string shell_command(const std::vector<std::string>& argv);

}  // namespace phasekv
