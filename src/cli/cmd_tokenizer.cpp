// `phasekv tokenizer ARGS`: runs phasekv-tokenizer ARGS, the program next to this one (see
// src/tools/tokenizer_main.cpp for why the sentencepiece tokenizer lives in its own process).
#include <unistd.h>

#include <filesystem>

#include "cli/commands.h"
#include "util/error.h"

namespace phasekv::cli {

void register_tokenizer(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "tokenizer", "sentencepiece tokenizer: train --manifest M --out DIR | encode | decode");
  cmd->prefix_command();  // every argument after `tokenizer` goes to phasekv-tokenizer
  cmd->set_help_flag();   // so does --help
  cmd->callback([cmd] {
    const auto self = std::filesystem::read_symlink("/proc/self/exe");
    const std::string tool = (self.parent_path() / "phasekv-tokenizer").string();
    if (!std::filesystem::exists(tool))
      throw Error(tool + " is missing (it is built with phasekv: cmake --build build)");
    std::vector<std::string> args = {tool};
    for (const auto& a : cmd->remaining()) args.push_back(a);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(tool.c_str(), argv.data());
    throw Error("cannot run " + tool);
  });
}

}  // namespace phasekv::cli
