#include "cli/path_options.h"

#include <filesystem>

#include "util/bundled.h"
#include "util/fs.h"

namespace phasekv::cli {

CLI::Validator bundled_path() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        s = resolve_bundled(s);
        return "";
      },
      "");
}

CLI::Validator output_dir() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const std::string problem = output_dir_problem(s);
        return problem.empty() ? "" : problem + " (give a directory to write into)";
      },
      "DIR");
}

CLI::Validator output_file() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        std::error_code ec;
        if (std::filesystem::is_directory(s, ec))
          return s + " is a directory (give the file to write)";
        const std::filesystem::path parent = std::filesystem::path(s).parent_path();
        const std::string problem = parent.empty() ? "" : output_dir_problem(parent.string());
        return problem.empty() ? "" : problem + " (give a file in a directory)";
      },
      "FILE");
}

}  // namespace phasekv::cli
