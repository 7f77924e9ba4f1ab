// File helpers. Every result file is written to a temporary name in the same directory and renamed
// when complete, so a reader never sees a half-written file and an interrupted run loses nothing.
#pragma once
#include <string>

namespace phasekv {

void write_file_atomic(const std::string& path, const std::string& content);
std::string read_file(const std::string& path);

}  // namespace phasekv
