#include "util/fs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "util/error.h"

namespace phasekv {

namespace {

// Writes all of [data, data + n) to fd; false with errno set when a write fails (a short write
// is retried, so a full disk or a file size limit ends as ENOSPC or EFBIG).
bool write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

std::string output_dir_problem(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // The nearest existing one of dir, its parent, ... must be a directory.
  for (fs::path p = fs::path(dir).lexically_normal(); !p.empty(); p = p.parent_path()) {
    const fs::file_status st = fs::status(p, ec);
    if (fs::exists(st))
      return fs::is_directory(st) ? "" : p.string() + " is a file, not a directory";
    if (p == p.parent_path()) break;
  }
  return "";
}

void ensure_directory(const std::string& dir) {
  if (const std::string problem = output_dir_problem(dir); !problem.empty())
    throw Error("cannot create the directory " + dir + ": " + problem);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("cannot create the directory " + dir + ": " + ec.message());
}

void write_file_atomic(const std::string& path, const std::string& content) {
  namespace fs = std::filesystem;
  fs::path target(path);
  if (target.has_parent_path()) ensure_directory(target.parent_path().string());
  // pid + a process-wide counter: two threads writing the same path (the audit's request cache
  // stores one answer from several workers) must not share a temporary file, or one rename
  // finds it already moved.
  static std::atomic<unsigned long> counter{0};
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                    std::to_string(counter.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot write " + path + ": " + std::strerror(errno));
  const bool written = write_all(fd, content.data(), content.size());
  const int write_errno = errno;
  if (::close(fd) != 0 || !written) {
    const int err = written ? errno : write_errno;
    std::remove(tmp.c_str());
    throw Error("cannot write " + path + ": " + std::strerror(err) + " (writing " +
                std::to_string(content.size()) + " bytes; " +
                (fs::exists(target) ? "the previous file is unchanged)" : "no file was left)"));
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw Error("cannot rename " + tmp + " to " + path + ": " + ec.message());
  }
}

AppendFile::AppendFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot open " + path + " for appending: " + std::strerror(errno));
}

AppendFile::~AppendFile() { ::close(fd_); }

void AppendFile::append(const std::string& text) {
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  if (write_all(fd_, text.data(), text.size())) return;
  const int err = errno;
  // Cutting back needs no space, so it works on a full disk too.
  const bool cut = before >= 0 && ::ftruncate(fd_, before) == 0;
  throw Error("cannot append to " + path_ + ": " + std::strerror(err) + " (" +
              std::to_string(text.size()) + " bytes; " +
              (cut ? "the file is cut back to its " + std::to_string(before) +
                         " bytes before them"
                   : std::string("the file may end in a partial line")) +
              ")");
}

DirLock::DirLock(const std::string& dir, bool wait) {
  ensure_directory(dir);
  const std::string path = (std::filesystem::path(dir) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot open the lock file " + path);
  if (::flock(fd_, wait ? LOCK_EX : LOCK_EX | LOCK_NB) != 0) {
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
