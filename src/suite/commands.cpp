#include "suite/commands.h"

#include <fmt/format.h>

namespace phasekv {

std::vector<std::string> sweep_argv(const SweepCommand& c) {
  std::vector<std::string> argv = {c.binary,     "sweep",
                                   "--model",    c.model,
                                   "--task",     c.task,
                                   "--examples", std::to_string(c.examples),
                                   "--modulus",  std::to_string(c.modulus),
                                   "--padding",  c.padding,
                                   "--seed",     std::to_string(c.seed),
                                   "--threads",  std::to_string(c.threads)};
  argv.insert(argv.end(), c.flags.begin(), c.flags.end());
  argv.push_back("--out");
  argv.push_back(c.out);
  if (c.target_depth) {
    argv.push_back("--target-depth");
    argv.push_back(fmt::format("{:g}", *c.target_depth));
  }
  return argv;
}

std::vector<std::string> train_argv(const TrainCommand& c) {
  std::vector<std::string> argv = {c.binary, "train", "--config", c.config, "--out", c.out};
  if (c.resume) argv.push_back("--resume");
  return argv;
}

std::string shell_quote(const std::string& s) {
  if (s.find_first_not_of(
          "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-/=,:+") ==
      std::string::npos)
    return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string shell_command(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) out += (out.empty() ? "" : " ") + shell_quote(a);
  return out;
}

}  // namespace phasekv
