// Strict reading of JSON config objects (model configs, [train] sections): a key that is not
// allowed, or a value of the wrong type, throws phasekv::Error naming `where`, the key and what is
// allowed. Header-only and torch-free.
#pragma once
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <type_traits>

#include "util/error.h"

namespace phasekv::json_read {

inline std::string join(const std::set<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : ", ") + k;
  return out;
}

// Throws on a non-object or on a key outside `allowed`.
inline void check_keys(const nlohmann::json& obj, const std::set<std::string>& allowed,
                       const std::string& where) {
  if (!obj.is_object()) throw Error(where + ": expected a JSON object");
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (!allowed.count(it.key()))
      throw Error(where + ": unknown key '" + it.key() + "' (allowed: " + join(allowed) + ")");
}

// Sets `out` from obj[key] when the key is present; bools, integers, numbers and strings must
// have exactly that JSON type (an integer is a valid number, 1.0 is not a valid integer).
template <typename T>
void read(const nlohmann::json& obj, const char* key, T& out, const std::string& where) {
  if (!obj.contains(key)) return;
  const nlohmann::json& v = obj.at(key);
  bool ok = false;
  if constexpr (std::is_same_v<T, bool>)
    ok = v.is_boolean();
  else if constexpr (std::is_integral_v<T>)
    ok = v.is_number_integer();
  else if constexpr (std::is_floating_point_v<T>)
    ok = v.is_number();
  else
    ok = v.is_string();
  if (!ok) throw Error(where + ": key '" + key + "' has the wrong type (got " + v.dump() + ")");
  out = v.get<T>();
}

}  // namespace phasekv::json_read
