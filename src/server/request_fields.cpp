#include "server/request_fields.h"

#include <cmath>

#include "server/server_requests.h"

namespace phasekv::fields {

using json = nlohmann::json;

void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, "invalid_request_error", param, message);
}

std::string type_name(const json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  const std::string t = v.type_name();
  return (t == "array" || t == "object" ? "an " : "a ") + t;
}

const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

bool get_bool(const json& body, const char* key, bool fallback) {
  const json* v = field(body, key);
  if (!v) return fallback;
  if (!v->is_boolean())
    bad(key, std::string("'") + key + "' must be true or false, not " + type_name(*v));
  return v->get<bool>();
}

int64_t get_int(const json& body, const char* key, int64_t fallback, int64_t lo, int64_t hi,
                const std::string& hint) {
  const json* v = field(body, key);
  if (!v) return fallback;
  if (!v->is_number_integer())
    bad(key, std::string("'") + key + "' must be an integer, not " + type_name(*v));
  const auto x = v->get<int64_t>();
  if (x < lo || x > hi)
    bad(key, std::string("'") + key + "' is " + std::to_string(x) +
                 " (allowed: " + std::to_string(lo) + ".." + std::to_string(hi) + hint + ")");
  return x;
}

double get_number(const json& body, const char* key, double fallback, double lo, double hi) {
  const json* v = field(body, key);
  if (!v) return fallback;
  if (!v->is_number())
    bad(key, std::string("'") + key + "' must be a number, not " + type_name(*v));
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    bad(key, std::string("'") + key + "' is " + v->dump() + " (allowed: " + json(lo).dump() + ".." +
                 json(hi).dump() + ")");
  return x;
}

}  // namespace phasekv::fields
