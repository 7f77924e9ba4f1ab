// File helpers. Every result file is written to a temporary name in the same directory and renamed
// when complete, so a reader never sees a half-written file and an interrupted run loses nothing.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace phasekv {

void write_file_atomic(const std::string& path, const std::string& content);
// std::filesystem::create_directories, but a path through an existing file throws phasekv::Error
// naming that file ("runs/x is a file, not a directory") instead of a raw filesystem_error.
void ensure_directory(const std::string& dir);
// "" when `dir` can be an output directory (it, or its nearest existing ancestor, is a
// directory), else why not: "runs is a file, not a directory", naming the file in the way.
std::string output_dir_problem(const std::string& dir);
// A file written by appending whole pieces (the records of results.jsonl): append() writes all
// of `text`, or, when the write fails (disk full, a file size limit), cuts the file back to where
// it stood before and throws phasekv::Error naming the file and the reason, so what is on disk
// stays whole pieces.
class AppendFile {
 public:
  explicit AppendFile(const std::string& path);
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  void append(const std::string& text);

 private:
  std::string path_;
  int fd_ = -1;
};

std::string read_file(const std::string& path);
// read_file + JSON parse; a syntax error throws phasekv::Error naming the file.
nlohmann::json read_json_file(const std::string& path);

// An exclusive flock on DIR/.lock (DIR is created), held while the object lives: two runs writing
// into one directory would interleave their records. The kernel drops it when the process dies, so
// a killed run leaves no stale lock. Throws phasekv::Error naming DIR when another process holds it.
// With wait, blocks until the other holder releases it instead (a short shared critical section,
// such as the GEMM choice cache's read-measure-write).
class DirLock {
 public:
  explicit DirLock(const std::string& dir, bool wait = false);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace phasekv
