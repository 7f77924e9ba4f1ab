// What the whole command line does the same way for every command: `--version`, errors of the
// command line itself (an unknown command, a missing or invalid option) as one
// "phasekv: error: ..." line with a usage exit status (100 and up, README), and --help showing
// no default beside a REQUIRED option.
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>

namespace phasekv::cli {

// `git describe --always --dirty` of the checkout at configure time, or the project version
// outside a git checkout (defined in the build's generated version.cpp, CMakeLists.txt).
const char* version();

// Call once every command is registered: --version, the error format, the help's defaults.
void finish_app(CLI::App& app);

// The exit status of an unknown command or of none (after printing the error and the commands),
// or nullopt when the command line names a known one: CLI11 alone said "A subcommand is
// required" for `phasekv swep`.
std::optional<int> reject_unknown_command(const CLI::App& app, int argc, const char* const* argv);

}  // namespace phasekv::cli
