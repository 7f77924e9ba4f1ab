#include "backend/http_json.h"

#include <limits>

#include "backend/http_dialect.h"

namespace phasekv::wire {

using json = nlohmann::json;

std::string excerpt(const json& j) {
  std::string s = j.dump();
  if (s.size() > 300) s = s.substr(0, 300) + "...";
  return s;
}

const json& at(const json& j, const char* key, const char* what) {
  if (!j.is_object() || !j.contains(key))
    throw ProtocolError(std::string(what) + ": response has no '" + key + "': " + excerpt(j));
  return j.at(key);
}

const json& index(const json& arr, size_t i, const char* what) {
  if (!arr.is_array() || arr.size() <= i)
    throw ProtocolError(std::string(what) + ": expected an array with more than " +
                        std::to_string(i) + " entries, got " + excerpt(arr));
  return arr[i];
}

double number(const json& j, const char* what) {
  if (!j.is_number()) throw ProtocolError(std::string(what) + " is not a number: " + excerpt(j));
  return j.get<double>();
}

int32_t token_id(const json& j, const char* what) {
  if (!j.is_number_integer())
    throw ProtocolError(std::string(what) + " is not a token id: " + excerpt(j));
  return j.get<int32_t>();
}

std::optional<int32_t> vllm_token_id(const std::string& s) {
  static const std::string prefix = "token_id:";
  if (s.rfind(prefix, 0) != 0 || s.size() == prefix.size()) return std::nullopt;
  int64_t v = 0;
  for (size_t i = prefix.size(); i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9' || v > std::numeric_limits<int32_t>::max() / 10)
      return std::nullopt;
    v = v * 10 + (s[i] - '0');
  }
  return static_cast<int32_t>(v);
}

int32_t vllm_id_or_throw(const std::string& s) {
  auto id = vllm_token_id(s);
  if (!id)
    throw ProtocolError("vllm: token '" + s +
                        "' is not of the form token_id:N (the server ignored "
                        "return_tokens_as_token_ids; vLLM >= 0.5.1 is needed)");
  return *id;
}

std::pair<int32_t, double> vllm_top1(const json& top) {
  if (!top.is_object() || top.empty())
    throw ProtocolError("vllm: top_logprobs at the target position is empty: " + excerpt(top));
  int32_t best = -1;
  double best_lp = -std::numeric_limits<double>::infinity();
  for (const auto& [key, value] : top.items()) {
    const int32_t id = vllm_id_or_throw(key);
    const double lp = number(value, "vllm: top_logprobs value");
    if (best < 0 || lp > best_lp || (lp == best_lp && id < best)) {
      best = id;
      best_lp = lp;
    }
  }
  return {best, best_lp};
}

void check_prompt_tokens(const json& response, size_t sent, const char* key, const char* what) {
  const json* usage = &response;
  if (response.contains("usage") && response["usage"].is_object())
    usage = &response["usage"];
  else if (response.contains("meta_info") && response["meta_info"].is_object())
    usage = &response["meta_info"];
  if (!usage->contains(key) || !(*usage)[key].is_number_integer()) return;
  const auto seen = (*usage)[key].get<int64_t>();
  if (seen != static_cast<int64_t>(sent))
    throw ProtocolError(std::string(what) + ": the server saw " + std::to_string(seen) +
                        " prompt tokens, " + std::to_string(sent) +
                        " were sent (it added or merged tokens, so every position would be "
                        "shifted)");
}

}  // namespace phasekv::wire
