#include "util/bundled.h"

#include <filesystem>
#include <system_error>

namespace phasekv {

namespace fs = std::filesystem;

std::string resolve_bundled(const std::string& path, const std::string& share_dir) {
  std::error_code ec;
  if (path.empty() || share_dir.empty() || fs::path(path).is_absolute() || fs::exists(path, ec))
    return path;
  const fs::path candidate = (fs::path(share_dir) / path).lexically_normal();
  return fs::exists(candidate, ec) ? candidate.string() : path;
}

std::string resolve_bundled(const std::string& path) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return path;
  return resolve_bundled(path, (self.parent_path() / kBundledDirFromBinary).string());
}

}  // namespace phasekv
