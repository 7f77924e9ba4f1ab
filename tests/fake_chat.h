// A chat server look-alike with a real-looking chat template, for the chat audit tests
// (test_chat_templates.cpp). Its JSON follows the servers' documentation:
//   vLLM (docs: serve/tokenize protocol, OpenAI chat completions, reasoning outputs)
//     GET  /v1/models  {"object":"list","data":[{"id","object":"model","owned_by":"vllm",
//                      "max_model_len"}]}
//     POST /tokenize   {model, prompt, add_special_tokens} or {model, messages,
//                      add_generation_prompt, add_special_tokens, chat_template_kwargs} ->
//                      {"count","max_model_len","tokens","token_strs":null}
//     POST /detokenize {model, tokens} -> {"prompt"}
//   llama.cpp (tools/server/README.md): owned_by "llamacpp", GET /props
//     {"default_generation_settings":{"n_ctx"}}, POST /apply-template {messages} -> {"prompt"}
//     (the BOS left out: its chat route tokenizes with special tokens), POST /tokenize {content,
//     add_special, parse_special} -> {"tokens"}, POST /detokenize {tokens} -> {"content"};
//     chat logprobs entries carry "id" besides "token"
//   both: POST /v1/chat/completions {messages, max_tokens, logprobs, top_logprobs,
//     chat_template_kwargs, ...} -> {"id","object":"chat.completion","created","model",
//     "choices":[{"index":0,"message":{"role":"assistant","content", reasoning},
//     "logprobs":{"content":[{"token","logprob","bytes","top_logprobs":[...]}]} or null,
//     "finish_reason":"stop"|"length"}],"usage":{"prompt_tokens","completion_tokens",
//     "total_tokens"}}
// The template is ChatML with a system prompt, like Qwen3's:
//   <|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{content}
//   <|im_end|>\n<|im_start|>assistant\n   (+ "<think>\n\n</think>\n\n" with thinking off)
// where the markers are one token each. Thinking is on unless chat_template_kwargs says
// enable_thinking false; the model then writes <think>...</think> before its answer, inline in
// the content, or in the message's reasoning field (a server launched with a reasoning parser).
// Its model reads the audit's chat prompts: the question names a key, the answer is the value
// of that key's record; a planted weak spot: when the record's key sits at a TEMPLATED position
// p with p mod 4 == 3 (system prompt and markers counted), it answers 0000 instead.
#pragma once
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "toy_tokenizer.h"

namespace phasekv::test {

class FakeChatServer {
 public:
  enum class Flavor { kVllm, kLlamacpp };
  enum class ReasoningOutput { kInline, kField };
  struct Options {
    Flavor flavor = Flavor::kVllm;
    ReasoningOutput reasoning = ReasoningOutput::kInline;
    std::string reasoning_key = "reasoning_content";  // vLLM >= 0.11: "reasoning"
    bool renders_messages = true;  // false: /tokenize {messages} is a 400 (no chat rendering)
    int context = 8192;
  };

  explicit FakeChatServer(Options o) : o_(std::move(o)), toy_(false) {
    for (const char* s : kSpecials) toy_.id(s);
    server_.new_task_queue = [] { return new httplib::ThreadPool(16); };
    server_.set_keep_alive_timeout(1);
    server_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      nlohmann::json card = {{"id", "chat-model"},
                             {"object", "model"},
                             {"created", 1735142223},
                             {"owned_by", llama() ? "llamacpp" : "vllm"}};
      if (!llama()) card["max_model_len"] = o_.context;
      res.set_content(nlohmann::json({{"object", "list"}, {"data", {card}}}).dump(),
                      "application/json");
    });
    server_.Get("/props", [this](const httplib::Request&, httplib::Response& res) {
      if (!llama()) return fail(res, 404, "Not Found");
      res.set_content(nlohmann::json({{"default_generation_settings", {{"n_ctx", o_.context}}},
                                      {"total_slots", 1}})
                          .dump(),
                      "application/json");
    });
    server_.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
      const auto j = nlohmann::json::parse(req.body);
      std::vector<int32_t> ids;
      if (llama()) {
        ids = encode(j.at("content"), j.value("add_special", false));
      } else if (j.contains("messages")) {
        if (!o_.renders_messages)
          return fail(res, 400, "this server does not render chat messages on /tokenize");
        ++renders;
        ids = encode(render(j), false);
      } else {
        ids = encode(j.at("prompt"), j.value("add_special_tokens", true));
      }
      nlohmann::json out = {{"tokens", ids}};
      if (!llama()) {
        out["count"] = ids.size();
        out["max_model_len"] = o_.context;
        out["token_strs"] = nullptr;
      }
      res.set_content(out.dump(), "application/json");
    });
    server_.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
      const auto j = nlohmann::json::parse(req.body);
      const std::string text = toy_.decode(j.at("tokens"));
      res.set_content(nlohmann::json({{llama() ? "content" : "prompt", text}}).dump(),
                      "application/json");
    });
    server_.Post("/apply-template", [this](const httplib::Request& req, httplib::Response& res) {
      if (!llama()) return fail(res, 404, "Not Found");
      ++renders;
      res.set_content(nlohmann::json({{"prompt", render(nlohmann::json::parse(req.body))}}).dump(),
                      "application/json");
    });
    server_.Post("/v1/chat/completions",
                 [this](const httplib::Request& req, httplib::Response& res) { chat(req, res); });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ~FakeChatServer() {
    server_.stop();
    thread_.join();
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  ToyTokenizer& toy() { return toy_; }

  // The template's text around one user message, as a --chat-template file would hold it
  // (thinking off, BOS-free like the server's own rendering).
  static std::string template_file_text() {
    return std::string(kSystem) + "{{content}}" + kAssistant + kNoThinking;
  }
  // Tokens of the template before the content (the llama.cpp flavor's BOS included).
  int prefix_tokens() { return static_cast<int>(encode(kSystem, llama()).size()); }

  std::atomic<int> chats{0}, renders{0};
  std::atomic<int> last_max_tokens{0};
  nlohmann::json last_chat_body;  // read after the audit finished only
  std::mutex mutex_;

 private:
  static constexpr const char* kSpecials[] = {"<|im_start|>", "<|im_end|>", "<think>", "</think>"};
  static constexpr const char* kSystem =
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n";
  static constexpr const char* kAssistant = "<|im_end|>\n<|im_start|>assistant\n";
  static constexpr const char* kNoThinking = "<think>\n\n</think>\n\n";

  bool llama() const { return o_.flavor == Flavor::kLlamacpp; }

  static void fail(httplib::Response& res, int status, const std::string& message) {
    res.status = status;
    res.set_content(nlohmann::json({{"error", {{"message", message}, {"code", status}}}}).dump(),
                    "application/json");
  }

  // Text to ids: the markers are one token each (a tokenizer's special tokens), the rest toy
  // words; llama.cpp's add_special puts the BOS first.
  std::vector<int32_t> encode(const std::string& text, bool bos) {
    std::vector<int32_t> out;
    if (bos) out.push_back(0);
    size_t i = 0;
    while (i < text.size()) {
      size_t next = std::string::npos;
      const char* which = nullptr;
      for (const char* s : kSpecials) {
        const size_t at = text.find(s, i);
        if (at < next) next = at, which = s;
      }
      const auto words = toy_.encode(text.substr(i, next - i), false);
      out.insert(out.end(), words.begin(), words.end());
      if (which == nullptr) break;
      out.push_back(toy_.id(which));
      i = next + std::string(which).size();
    }
    return out;
  }

  static bool thinking(const nlohmann::json& body) {
    if (body.contains("chat_template_kwargs") && body["chat_template_kwargs"].is_object())
      return body["chat_template_kwargs"].value("enable_thinking", true);
    return true;
  }

  // The template: one user message, generation prompt on.
  static std::string render(const nlohmann::json& body) {
    const auto& m = body.at("messages");
    std::string content = m.at(0).at("content");
    return std::string(kSystem) + content + kAssistant + (thinking(body) ? "" : kNoThinking);
  }

  // The record the question asks about: its value and the templated position of its key.
  struct Record {
    std::string value;
    size_t key_token = 0;
  };
  std::optional<Record> asked(const std::vector<int32_t>& prompt) {
    std::string text;
    std::vector<size_t> token_of;  // character -> token index
    for (size_t t = 0; t < prompt.size(); ++t) {
      const std::string piece = toy_.decode({prompt[t]});
      text += piece;
      token_of.insert(token_of.end(), piece.size(), t);
    }
    std::string key;
    const std::regex question("value of key (\\d+)\\?");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), question);
         it != std::sregex_iterator(); ++it)
      key = (*it)[1];
    std::smatch rec;
    if (key.empty() ||
        !std::regex_search(text, rec, std::regex("key (" + key + ") -> value (\\d+)\\.")))
      return std::nullopt;
    return Record{rec[2].str(), token_of[static_cast<size_t>(rec.position(1))]};
  }
  // The model: the value, or 0000 when the key sits at a templated position p, p mod 4 == 3.
  std::string answer(const std::vector<int32_t>& prompt) {
    const auto r = asked(prompt);
    if (!r) return "I do not know.";
    return r->key_token % 4 == 3 ? "0000" : r->value;
  }

  nlohmann::json logprob_entry(int32_t id, double lp, bool ids) {
    const std::string piece = toy_.decode({id});
    nlohmann::json bytes = nlohmann::json::array();
    for (unsigned char c : piece) bytes.push_back(c);
    nlohmann::json e = {{"token", ids ? "token_id:" + std::to_string(id) : piece},
                        {"logprob", lp},
                        {"bytes", bytes}};
    if (llama()) e["id"] = id;
    return e;
  }

  void chat(const httplib::Request& req, httplib::Response& res) {
    ++chats;
    const auto j = nlohmann::json::parse(req.body);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      last_chat_body = j;
    }
    const std::vector<int32_t> prompt = encode(render(j), llama());
    if (static_cast<int>(prompt.size()) >= o_.context) return fail(res, 400, "context length");
    const int max_tokens = j.value("max_tokens", 16);
    last_max_tokens = max_tokens;
    const bool think = thinking(j);
    const std::string said = answer(prompt);
    const std::string full =
        (think ? "<think>\nThe question names a key; its record is in the document.\n</think>\n\n"
               : "") +
        said;
    std::vector<int32_t> out = encode(full, false);
    const bool cut = static_cast<int>(out.size()) > max_tokens;
    if (cut) out.resize(static_cast<size_t>(max_tokens));
    const std::string text = toy_.decode(out);
    nlohmann::json message = {{"role", "assistant"}, {"tool_calls", nlohmann::json::array()}};
    if (o_.reasoning == ReasoningOutput::kField && think) {
      const size_t close = text.find("</think>");
      const size_t open = std::string("<think>").size();
      message[o_.reasoning_key] =
          text.substr(open, close == std::string::npos ? std::string::npos : close - open);
      message["content"] = close == std::string::npos ? nlohmann::json(nullptr)
                                                      : nlohmann::json(text.substr(close + 8));
    } else {
      message["content"] = text;
      message[o_.reasoning_key] = nullptr;
    }
    nlohmann::json choice = {{"index", 0},
                             {"message", message},
                             {"logprobs", nullptr},
                             {"finish_reason", cut ? "length" : "stop"},
                             {"stop_reason", nullptr}};
    if (j.value("logprobs", false)) {
      const bool ids = j.value("return_tokens_as_token_ids", false);
      const int top_n = j.value("top_logprobs", 0);
      // The true value's first token, for the alternatives of the first position.
      const auto truth = asked(prompt);
      const int32_t right = toy_.encode(truth ? truth->value : "0", false).front();
      nlohmann::json content = nlohmann::json::array();
      for (size_t t = 0; t < out.size(); ++t) {
        nlohmann::json e = logprob_entry(out[t], -0.1, ids);
        nlohmann::json top = nlohmann::json::array({logprob_entry(out[t], -0.1, ids)});
        if (t == 0 && right != out[t]) top.push_back(logprob_entry(right, -2.5, ids));
        while (static_cast<int>(top.size()) < top_n)
          top.push_back(
              logprob_entry(toy_.id(" the"), -6.0 - static_cast<double>(top.size()), ids));
        while (static_cast<int>(top.size()) > top_n) top.erase(top.size() - 1);
        e["top_logprobs"] = top;
        content.push_back(e);
      }
      choice["logprobs"] = {{"content", content}};
    }
    const nlohmann::json body = {{"id", "chatcmpl-fake"},
                                 {"object", "chat.completion"},
                                 {"created", 1735142223},
                                 {"model", "chat-model"},
                                 {"choices", {choice}},
                                 {"usage",
                                  {{"prompt_tokens", prompt.size()},
                                   {"completion_tokens", out.size()},
                                   {"total_tokens", prompt.size() + out.size()}}},
                                 {"prompt_logprobs", nullptr}};
    res.set_content(body.dump(), "application/json");
  }

  Options o_;
  ToyTokenizer toy_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace phasekv::test
