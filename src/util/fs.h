// File helpers. Every result file is written to a temporary name in the same directory and renamed
// when complete, so a reader never sees a half-written file and an interrupted run loses nothing.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace phasekv {

void write_file_atomic(const std::string& path, const std::string& content);
std::string read_file(const std::string& path);
// read_file + JSON parse; a syntax error throws phasekv::Error naming the file.
nlohmann::json read_json_file(const std::string& path);

}  // namespace phasekv
