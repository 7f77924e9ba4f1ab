// Reading a config file of any kind (training configs, suites, probe and flip-search specs): a
// TOML file, or JSON when the path ends in ".json", as one JSON value that the file's own strict
// parser then reads. The one reader of config files, below every config it reads.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace phasekv {

// The file as JSON (TOML tables become objects); a syntax error throws naming path:line:column.
nlohmann::json read_config_file(const std::string& path);

}  // namespace phasekv
