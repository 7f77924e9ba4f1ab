// Typed access to the fields of a request body, shared by every route's parser: each helper
// throws ApiError 400 naming the field and what is allowed, so every route reports a client's
// mistake the same way.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace phasekv::fields {

[[noreturn]] void bad(const std::string& param, const std::string& message);
// "an integer", "a string", ... for messages.
std::string type_name(const nlohmann::json& v);
// The field's value when present and not null (null means "not given", as OpenAI clients send).
const nlohmann::json* field(const nlohmann::json& body, const char* key);
bool get_bool(const nlohmann::json& body, const char* key, bool fallback);
int64_t get_int(const nlohmann::json& body, const char* key, int64_t fallback, int64_t lo,
                int64_t hi, const std::string& hint = "");
double get_number(const nlohmann::json& body, const char* key, double fallback, double lo,
                  double hi);

}  // namespace phasekv::fields
