// Strict reading of JSON objects (model configs, [train] sections, task files, result records):
// a key that is not allowed, a missing required key, or a value of the wrong type throws
// phasekv::Error naming `where`, the key and what is allowed. Header-only and torch-free; the one
// JSON reader of the project.
#pragma once
#include <nlohmann/json.hpp>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "util/error.h"

namespace phasekv::json_read {

// "a, b, c": the allowed keys or names in an error message.
template <typename Container>
std::string join(const Container& items, const std::string& sep = ", ") {
  std::string out;
  for (const auto& k : items) out += (out.empty() ? "" : sep) + std::string(k);
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

// What a JSON value must be to become a T, for error messages.
template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, bool>)
    return "true or false";
  else if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>)
    return "a non-negative integer";
  else if constexpr (std::is_integral_v<T>)
    return "an integer";
  else if constexpr (std::is_floating_point_v<T>)
    return "a number";
  else
    return "a string";
}

// Whether `v` has exactly T's JSON type (an integer is a valid number, 1.0 is not a valid integer,
// -1 is not a valid unsigned integer).
template <typename T>
bool has_type(const nlohmann::json& v) {
  if constexpr (std::is_same_v<T, bool>)
    return v.is_boolean();
  else if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>)
    // TOML integers arrive as signed JSON integers: a non-negative one is a valid unsigned.
    return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
  else if constexpr (std::is_integral_v<T>)
    return v.is_number_integer();
  else if constexpr (std::is_floating_point_v<T>)
    return v.is_number();
  else
    return v.is_string();
}

// Sets `out` from obj[key] when the key is present.
template <typename T>
void read(const nlohmann::json& obj, const char* key, T& out, const std::string& where) {
  if (!obj.contains(key)) return;
  const nlohmann::json& v = obj.at(key);
  bool ok = has_type<T>(v);
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && sizeof(T) < 8) {
    // A value that does not fit would wrap silently in get<T>().
    if (ok && v.is_number_unsigned())
      ok = v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
    else if (ok)
      ok = v.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
           v.get<int64_t>() <= static_cast<int64_t>(std::numeric_limits<T>::max());
  }
  if (!ok)
    throw Error(where + ": key '" + key + "' has the wrong type (got " + v.dump() + ", expected " +
                type_name<T>() +
                (std::is_integral_v<T> && !std::is_same_v<T, bool> && sizeof(T) < 8
                     ? " that fits in " + std::to_string(8 * sizeof(T)) + " bits"
                     : std::string()) +
                ")");
  out = v.get<T>();
}

// The names of an enum's values, as config files and outputs spell them.
template <typename E>
using Choices = std::vector<std::pair<std::string, E>>;

// Sets `out` from the string obj[key] when the key is present; any other value throws naming
// the allowed names.
template <typename E>
void read_choice(const nlohmann::json& obj, const char* key, E& out, const Choices<E>& table,
                 const std::string& where) {
  if (!obj.contains(key)) return;
  const nlohmann::json& v = obj.at(key);
  std::string allowed;
  for (const auto& [name, value] : table) {
    if (v.is_string() && v.get<std::string>() == name) {
      out = value;
      return;
    }
    allowed += (allowed.empty() ? "" : "|") + name;
  }
  throw Error(where + ": key '" + key + "' has value " + v.dump() + " (allowed: " + allowed + ")");
}

template <typename E>
std::string choice_name(E e, const Choices<E>& table) {
  for (const auto& [name, value] : table)
    if (value == e) return name;
  return "?";
}

// obj[key], which must be present and of T's type.
template <typename T>
T require(const nlohmann::json& obj, const char* key, const std::string& where) {
  if (!obj.is_object()) throw Error(where + ": expected a JSON object");
  if (!obj.contains(key)) throw Error(where + ": missing key '" + std::string(key) + "'");
  T out{};
  read(obj, key, out, where);
  return out;
}

// obj[key] when present and not null; nullopt otherwise.
template <typename T>
std::optional<T> optional(const nlohmann::json& obj, const char* key, const std::string& where) {
  if (!obj.contains(key) || obj.at(key).is_null()) return std::nullopt;
  T out{};
  read(obj, key, out, where);
  return out;
}

}  // namespace phasekv::json_read
