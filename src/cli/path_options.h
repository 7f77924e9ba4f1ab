// Checks and transforms of path options, shared by every command: an input that may be bundled
// with an installed phasekv (util/bundled.h), and outputs checked before anything runs, so that
// `--out` naming a file is one sentence naming the flag and the path, not a filesystem_error after
// minutes of work.
#pragma once
#include <CLI/CLI.hpp>

namespace phasekv::cli {

// A model directory or config file: a relative path missing from the working directory is
// looked up among the installed binary's bundled models/, configs/ and data/.
CLI::Validator bundled_path();
// An output directory: it, or its nearest existing parent, must be a directory.
CLI::Validator output_dir();
// An output file: not an existing directory, and its nearest existing parent a directory.
CLI::Validator output_file();

}  // namespace phasekv::cli
