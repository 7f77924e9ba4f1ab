// `phasekv serve`: one phasekv model behind the vLLM flavour of the OpenAI API, so the audit
// client (HttpBackend, dialect vllm) and other OpenAI clients can use it.
//
//   GET  /health          200, empty body (as vLLM)
//   GET  /v1/models       one model card; owned_by "phasekv" and a "phasekv" object with
//                         config_hash, vocab_size, tokenizer and the training task (no stride:
//                         an audit has to find it)
//   GET  /version
//   POST /v1/completions  prompt as text or token ids (or a list of either), max_tokens (0 only
//                         with echo), temperature 0 = greedy, else sampling with top_p/top_k and
//                         seed, logprobs N (top N per position), echo (prompt logprobs),
//                         return_tokens_as_token_ids, return_token_ids; cache_salt accepted
//   POST /v1/chat/completions  messages rendered by the chat template (chat_template.h), the
//                         same sampling; logprobs true + top_logprobs N in OpenAI's chat shape
//   Both generation routes stream server-sent events with stream: true (server_stream.cpp);
//   the streamed text, concatenated, is the whole answer's (response_shapes.h TextDeltas).
//   POST /tokenize        {prompt, add_special_tokens} or {messages} -> {tokens, count,
//                         max_model_len}
//   POST /detokenize      {tokens} -> {prompt}
//
// Every failure is JSON {"error": {"message", "type", "code", "param"}} with a 4xx status for
// the client's mistakes (wrong types, ids outside the vocabulary, prompts over the context
// size or empty, max_tokens over the limit, more log-probability entries than
// --max-logprob-entries, bytes that are not UTF-8 in a string or key (named), bodies over the
// size limit, chunked or not: 413) and 500 for the server's. A known path with
// another method is 405 with Allow. Unknown body fields are ignored and named (a `warnings`
// list and an X-Phasekv-Warning header); `stop` and `stop_token_ids` are refused unless empty.
// Connections are held by server/http_front.h (slow clients: 408 after --read-timeout; a full
// queue or connection table: 503 with Retry-After; /health on its own threads); requests run
// on a pool of `threads`; the model runs one request at a time (a mutex), which keeps the
// numerics identical to a single in-process call.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>

#include "backend/local_backend.h"
#include "io/tokenizer.h"
#include "server/server_requests.h"
#include "task/tasks.h"

namespace httplib {
class ContentReader;
class DataSink;
struct Request;
struct Response;
}  // namespace httplib

namespace phasekv {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see bind())
  // Threads that run requests. Idle keep-alive connections and requests still arriving are
  // held by one poller thread (server/http_front.h), not by these.
  int threads = 32;
  int max_tokens_limit = 1024;              // largest max_tokens accepted
  size_t max_body_bytes = size_t{8} << 20;  // larger bodies get 413, chunked ones included
  int max_logprobs = 20;                    // largest logprobs accepted (vLLM's default)
  int max_prompts = 64;                     // prompts in one request
  // Log-probability entries one request may ask for: over its prompts, (prompt tokens with
  // echo + max_tokens) x (logprobs + 1). Bounds the memory of one answer.
  int64_t max_logprob_entries = int64_t{1} << 20;
  double read_timeout_s = 10;  // a request's head and body must arrive within this (408)
  int max_queue = 64;          // requests waiting for a thread; more get 503 + Retry-After
  int max_connections = 512;   // open connections; more get 503 + Retry-After
  std::string served_name;     // "" = the backend's model_id()
  // One line per request, those refused before a handler ran (503, 408, 413, a malformed head)
  // included; nullptr: silent.
  std::ostream* log = nullptr;
};

class ModelEngine;
class ListenServer;

class CompletionServer {
 public:
  // `backend` must outlive the server. `tokenizer`: the model's tokenizer.json (text prompts,
  // /tokenize); `task`: its training task (task.json), published in /v1/models so an audit can
  // build the same examples. Either may be absent.
  CompletionServer(LocalBackend& backend, std::optional<Tokenizer> tokenizer,
                   std::optional<TaskConfig> task, ServerOptions options);
  ~CompletionServer();
  CompletionServer(const CompletionServer&) = delete;
  CompletionServer& operator=(const CompletionServer&) = delete;

  // Binds the listening socket; returns the port (the chosen one when options.port is 0).
  // Throws phasekv::Error naming host and port when binding fails.
  int bind();
  // Serves until stop(); returns after in-flight requests have finished. Returns at once when
  // stop() came first.
  void serve();
  // Stops accepting connections; safe from any thread (not from a signal handler).
  void stop();
  // True once serve() accepts connections (tests wait for it before connecting).
  bool running() const;
  const std::string& served_name() const { return name_; }
  // Requests waiting for a thread (at most max_queue; tests wait for a full queue).
  int waiting_requests() const;
  // Tokens the model has generated since start (a stream whose client left stops early).
  int64_t tokens_generated() const;

 private:
  void routes();
  void handle_models(httplib::Response& res) const;
  // The POST routes read their body through read_body (cut at max_body_bytes).
  std::optional<std::string> read_body(const httplib::ContentReader& reader,
                                       httplib::Response& res) const;
  void handle_completions(const nlohmann::json& body, httplib::Response& res);
  void handle_chat(const nlohmann::json& body, httplib::Response& res);
  // server_stream.cpp: the body as server-sent events written by `produce` (false: the client
  // went away or the stream was cut).
  void stream(httplib::Response& res, std::function<bool(httplib::DataSink&)> produce);
  void stream_completions(std::shared_ptr<const CompletionRequest> r, httplib::Response& res);
  void stream_chat(std::shared_ptr<const ChatRequest> r, httplib::Response& res);
  void handle_tokenize(const nlohmann::json& body, httplib::Response& res) const;
  void handle_detokenize(const nlohmann::json& body, httplib::Response& res) const;
  // One line on options_.log, whole (the poller and the request threads all log).
  void log_line(const std::string& line) const;

  LocalBackend& backend_;
  std::optional<Tokenizer> tokenizer_;
  std::optional<TaskConfig> task_;
  ServerOptions options_;
  std::string name_;
  ModelLimits limits_;
  std::unique_ptr<ModelEngine> engine_;
  std::unique_ptr<ListenServer> http_;
  std::atomic<bool> stop_requested_{false};
  mutable std::mutex log_mutex_;
};

}  // namespace phasekv
