// Reading servers' JSON answers strictly, shared by the completions dialects (http_dialect.cpp)
// and the chat scoring (http_chat.cpp): a missing key or a wrong type throws ProtocolError
// naming what was expected, with an excerpt of the response.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

namespace phasekv::wire {

// A short excerpt of a response for error messages (servers can answer with whole HTML pages).
std::string excerpt(const nlohmann::json& j);
const nlohmann::json& at(const nlohmann::json& j, const char* key, const char* what);
const nlohmann::json& index(const nlohmann::json& arr, size_t i, const char* what);
double number(const nlohmann::json& j, const char* what);
int32_t token_id(const nlohmann::json& j, const char* what);
// vLLM renders tokens as "token_id:123" with return_tokens_as_token_ids.
std::optional<int32_t> vllm_token_id(const std::string& s);
int32_t vllm_id_or_throw(const std::string& s);
// The highest entry of a {token: logprob} map; ties go to the lowest id, like torch's argmax.
std::pair<int32_t, double> vllm_top1(const nlohmann::json& top);
// Throws when usage[key] (or meta_info[key]) says the server saw another number of prompt
// tokens than `sent`: every position, and so every phase, would be shifted.
void check_prompt_tokens(const nlohmann::json& response, size_t sent, const char* key,
                         const char* what);

}  // namespace phasekv::wire
