#include "util/fs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "util/error.h"

namespace phasekv {

void write_file_atomic(const std::string& path, const std::string& content) {
  namespace fs = std::filesystem;
  fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  // pid + a process-wide counter: two threads writing the same path (the audit's request cache
  // stores one answer from several workers) must not share a temporary file, or one rename
  // finds it already moved.
  static std::atomic<unsigned long> counter{0};
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                    std::to_string(counter.fetch_add(1));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("cannot write " + tmp);
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw Error("write failed for " + tmp + " (disk full?)");
    }
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw Error("cannot rename " + tmp + " to " + path + ": " + ec.message());
  }
}

DirLock::DirLock(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string path = (std::filesystem::path(dir) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot open the lock file " + path);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd_);
    throw Error(dir + " is in use by another run (it holds " + path +
                "); wait for it to finish or give another --out");
  }
}

DirLock::~DirLock() { ::close(fd_); }  // closing releases the flock

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace phasekv

namespace phasekv {

nlohmann::json read_json_file(const std::string& path) {
  const std::string text = read_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // not only parse_error: 1e99999 is out_of_range
    throw Error(path + ": not valid JSON (" + e.what() + ")");
  }
}

}  // namespace phasekv
