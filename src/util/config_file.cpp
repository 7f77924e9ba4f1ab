#include "util/config_file.h"

#include <toml++/toml.h>

#include <cstdint>
#include <filesystem>

#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

using nlohmann::json;

json toml_to_json(const toml::node& n) {
  if (auto* t = n.as_table()) {
    json j = json::object();
    for (auto&& [k, v] : *t) j[std::string(k.str())] = toml_to_json(v);
    return j;
  }
  if (auto* a = n.as_array()) {
    json j = json::array();
    for (auto&& v : *a) j.push_back(toml_to_json(v));
    return j;
  }
  if (auto v = n.value_exact<int64_t>()) return *v;
  if (auto v = n.value_exact<double>()) return *v;
  if (auto v = n.value_exact<bool>()) return *v;
  if (auto v = n.value_exact<std::string>()) return *v;
  throw Error("unsupported TOML value type (dates are not used by phasekv)");
}

}  // namespace

json read_config_file(const std::string& path) {
  if (std::filesystem::path(path).extension() == ".json") return read_json_file(path);
  // The error_code form: a name the filesystem refuses (a component over 255 bytes) is an error
  // of this file, where the throwing form raised filesystem_error (found by fuzz_suite).
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw Error(path + ": " + (ec ? ec.message() : std::string("no such file")));
  toml::table tbl;
  try {
    tbl = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    throw Error(path + ":" + std::to_string(src.begin.line) + ":" +
                std::to_string(src.begin.column) + ": " + std::string(e.description()));
  }
  return toml_to_json(tbl);
}

}  // namespace phasekv
