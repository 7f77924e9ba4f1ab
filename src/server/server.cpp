#include "server/server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <ctime>
#include <map>
#include <thread>

#include "model/model_dir.h"
#include "server/chat_template.h"
#include "server/http_front.h"
#include "server/response_shapes.h"
#include "server/server_engine.h"
#include "server/server_requests.h"
#include "util/error.h"
#include "util/threads.h"

namespace phasekv {
namespace {

using json = nlohmann::json;

// Bytes that are not UTF-8 (a message quoting a client's bytes) become U+FFFD instead of a
// type_error that would turn a client's mistake into a 500.
std::string dump(const json& body) {
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.status, error_body(e.status, e.type, e.what(), e.param));
}

// Runs a handler, turning its failures into JSON errors: ApiError keeps its status, anything
// else is the server's fault (500).
template <typename F>
void guarded(httplib::Response& res, F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    send_error(res, e);
  } catch (const std::exception& e) {
    send_json(res, 500, error_body(500, "internal_server_error", e.what()));
  }
}

}  // namespace

// httplib's listen backlog is 5, compiled into Debian's libcpp-httplib: 16 clients connecting at
// once overflow it and wait a second for the SYN retransmit. Linux applies a second listen() on
// a listening socket as a new backlog, so the socket is re-listened with a larger one.
class ListenServer : public FrontServer {
 public:
  using FrontServer::FrontServer;
  void raise_backlog(int backlog) {
    const socket_t sock = svr_sock_;
    if (sock != INVALID_SOCKET) ::listen(sock, backlog);
  }
};

namespace {

// The connection layer's limits from the server's options (validated by the constructor).
ConnectionOptions connection_options(const ServerOptions& o) {
  ConnectionOptions c;
  c.workers = o.threads;
  c.max_queue = o.max_queue;
  c.max_connections = o.max_connections;
  c.read_timeout_s = o.read_timeout_s;
  c.max_body_bytes = o.max_body_bytes;
  c.light_paths = {"/health", "/version", "/v1/models"};
  c.error_json = [](int status, const std::string& message) {
    return dump(error_body(status, status == 503 ? "service_unavailable" : "invalid_request_error",
                           message));
  };
  return c;
}

std::string body_limit_message(size_t max_body_bytes) {
  return "the request body exceeds the server's limit of " + std::to_string(max_body_bytes) +
         " bytes (--max-body-bytes)";
}

// The methods each route answers (a known path with another method gets 405 and Allow).
const std::map<std::string, std::string>& route_methods() {
  static const std::map<std::string, std::string> m = {
      {"/health", "GET, HEAD"},    {"/version", "GET, HEAD"},        {"/v1/models", "GET, HEAD"},
      {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}, {"/tokenize", "POST"},
      {"/detokenize", "POST"}};
  return m;
}

// Why binding host:port failed. httplib reports only false (a host that does not resolve
// leaves errno at 0), so the address is resolved and bound again here to get the reason.
std::string bind_failure_reason(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
    return "--host '" + host + "' is not an address or a host name this machine can resolve (" +
           ::gai_strerror(rc) + ")";
  int err = 0;
  for (addrinfo* a = found; a && err == 0; a = a->ai_next) {
    const int sock = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (sock < 0) {
      err = errno;
      break;
    }
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(sock, a->ai_addr, a->ai_addrlen) != 0) err = errno;
    ::close(sock);
  }
  ::freeaddrinfo(found);
  switch (err) {
    case EADDRINUSE:
      return "address in use (another server listens on this port; --port 0 picks a free one)";
    case EADDRNOTAVAIL:
      return "--host '" + host + "' is not an address of this machine (" + std::strerror(err) + ")";
    case EACCES:
      return "permission denied (ports below 1024 need privileges; choose another --port)";
    case 0:
      return "the address was free when checked again; another process may have taken it";
    default:
      return std::strerror(err);
  }
}

}  // namespace

CompletionServer::CompletionServer(LocalBackend& backend, std::optional<Tokenizer> tokenizer,
                                   std::optional<TaskConfig> task, ServerOptions options)
    : backend_(backend),
      tokenizer_(std::move(tokenizer)),
      task_(std::move(task)),
      options_(std::move(options)),
      name_(options_.served_name.empty() ? backend.model_id() : options_.served_name),
      engine_(std::make_unique<ModelEngine>(backend)) {
  // Each worker is a thread: 100000 of them brought a 2-core machine to a load of 228.
  if (options_.threads < 1 || options_.threads > kMaxHttpThreads)
    throw Error("--threads is " + std::to_string(options_.threads) + " (allowed: 1.." +
                std::to_string(kMaxHttpThreads) + " HTTP worker threads)");
  if (!(options_.read_timeout_s >= 0.01 && options_.read_timeout_s <= 3600))
    throw Error("--read-timeout is " + std::to_string(options_.read_timeout_s) +
                " (allowed: 0.01..3600 seconds)");
  if (options_.max_queue < 1 || options_.max_queue > 100000)
    throw Error("--max-queue is " + std::to_string(options_.max_queue) + " (allowed: 1..100000)");
  if (options_.max_connections < 1 || options_.max_connections > 100000)
    throw Error("--max-connections is " + std::to_string(options_.max_connections) +
                " (allowed: 1..100000)");
  if (options_.max_logprob_entries < 1)
    throw Error("--max-logprob-entries is " + std::to_string(options_.max_logprob_entries) +
                " (allowed: >= 1)");
  if (options_.max_tokens_limit < 1)
    throw Error("--max-tokens-limit is " + std::to_string(options_.max_tokens_limit) +
                " (allowed: >= 1)");
  if (options_.max_body_bytes < 1024)
    throw Error("--max-body-bytes is " + std::to_string(options_.max_body_bytes) +
                " (allowed: >= 1024)");
  limits_.name = name_;
  limits_.vocab_size = backend_.model()->cfg.vocab_size;
  limits_.max_context = backend_.max_context();
  limits_.max_tokens = options_.max_tokens_limit;
  limits_.max_logprobs = options_.max_logprobs;
  limits_.max_prompts = options_.max_prompts;
  limits_.max_logprob_entries = options_.max_logprob_entries;
  limits_.tokenizer = tokenizer_ ? &*tokenizer_ : nullptr;
  ConnectionOptions connections = connection_options(options_);
  if (options_.log)
    connections.on_reject = [this](const std::string& request, int status,
                                   const std::string& message) {
      log_line(request + " " + std::to_string(status) + " rejected: " + message);
    };
  http_ = std::make_unique<ListenServer>(std::move(connections));
  http_->set_tcp_nodelay(true);  // small JSON answers must not wait for the client's delayed ACK
  // A client that disconnects mid-stream must not kill the server: httplib writes without
  // MSG_NOSIGNAL, so the write would raise SIGPIPE; ignored, it fails with EPIPE instead.
  std::signal(SIGPIPE, SIG_IGN);
  routes();
}

CompletionServer::~CompletionServer() = default;

void CompletionServer::routes() {
  http_->Get("/health", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
  http_->Get("/version", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"version", "phasekv"}});
  });
  http_->Get("/v1/models",
             [this](const httplib::Request&, httplib::Response& res) { handle_models(res); });
  // The POST routes read their own body, so that a chunked one is cut at the size limit.
  // Unknown fields are ignored and named: an X-Phasekv-Warning header on every answer (streams
  // included), a `warnings` list in a JSON answer, a log line.
  auto post = [this](const char* path, auto handle) {
    http_->Post(path, [this, path, handle](const httplib::Request&, httplib::Response& res,
                                           const httplib::ContentReader& reader) {
      const auto text = read_body(reader, res);
      if (!text) return;
      guarded(res, [&] {
        const json body = parse_body(*text);
        const std::vector<std::string> unknown = unknown_fields(body, path);
        std::string warning;
        if (!unknown.empty()) {
          warning = "ignored unknown field" + std::string(unknown.size() > 1 ? "s" : "") + " " +
                    json(unknown).dump() + " (" + path + " does not use them)";
          res.set_header("X-Phasekv-Warning", warning);
          log_line(path + std::string(": ") + warning);
        }
        (this->*handle)(body, res);
        if (!warning.empty() && res.status == 200 &&
            res.get_header_value("Content-Type") == "application/json") {
          json answer = json::parse(res.body);
          answer["warnings"] = json::array({warning});
          res.set_content(answer.dump(), "application/json");
        }
      });
    });
  };
  post("/v1/completions", &CompletionServer::handle_completions);
  post("/v1/chat/completions", &CompletionServer::handle_chat);
  post("/tokenize", &CompletionServer::handle_tokenize);
  post("/detokenize", &CompletionServer::handle_detokenize);
  // httplib answers unknown routes, unreadable and oversize bodies with an empty body; give them
  // the JSON error every client of this API expects.
  http_->set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const RequestState* state = current_request();
    if (state && state->timed_out) res.status = 408;
    if (state && state->over_budget) res.status = 413;
    const auto route = route_methods().find(req.path);
    if (res.status == 404 && route != route_methods().end()) {
      res.set_header("Allow", route->second);
      send_json(res, 405,
                error_body(405, "invalid_request_error",
                           req.method + " is not allowed on " + req.path +
                               " (allowed: " + route->second + ")"));
    } else if (res.status == 408) {
      send_json(res, 408,
                error_body(408, "invalid_request_error",
                           "the request body did not arrive within the server's --read-timeout"));
    } else if (res.status == 413) {
      send_json(
          res, 413,
          error_body(413, "invalid_request_error", body_limit_message(options_.max_body_bytes)));
    } else if (res.status == 404) {
      send_json(res, 404,
                error_body(404, "not_found_error",
                           "no route " + req.method + " " + req.path +
                               " (routes: GET /health, /v1/models, /version; POST "
                               "/v1/completions, /v1/chat/completions, /tokenize, /detokenize)"));
    } else {
      send_json(
          res, res.status,
          error_body(res.status, "invalid_request_error", "HTTP " + std::to_string(res.status)));
    }
  });
  http_->set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_json(res, 500, error_body(500, "internal_server_error", what));
      });
  if (options_.log)
    http_->set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      log_line(req.method + " " + req.path + " " + std::to_string(res.status));
    });
}

void CompletionServer::log_line(const std::string& line) const {
  if (!options_.log) return;
  std::lock_guard<std::mutex> lock(log_mutex_);
  *options_.log << line << "\n" << std::flush;
}

void CompletionServer::handle_models(httplib::Response& res) const {
  const ModelConfig& cfg = backend_.model()->cfg;
  json phasekv = {{"config_hash", config_hash(cfg)},
                  {"vocab_size", cfg.vocab_size},
                  {"tokenizer", tokenizer_ ? tokenizer_->kind() : "none"},
                  {"chat_template", tokenizer_ ? json(kChatTemplate) : json(nullptr)},
                  {"task", task_ ? task_config_to_json(*task_) : json(nullptr)}};
  json card = {{"id", name_},
               {"object", "model"},
               {"created", static_cast<int64_t>(std::time(nullptr))},
               {"owned_by", "phasekv"},
               {"root", name_},
               {"parent", nullptr},
               {"max_model_len", backend_.max_context()},
               {"permission", json::array()},
               {"phasekv", phasekv}};
  send_json(res, 200, {{"object", "list"}, {"data", json::array({card})}});
}

std::optional<std::string> CompletionServer::read_body(const httplib::ContentReader& reader,
                                                       httplib::Response& res) const {
  std::string body;
  bool over = false;
  const bool complete = reader([&](const char* data, size_t n) {
    if (body.size() + n > options_.max_body_bytes) {
      over = true;  // stop reading: the rest of a chunked body is never read
      return false;
    }
    body.append(data, n);
    return true;
  });
  if (complete) return body;
  RequestState* state = current_request();
  if (state) state->close = true;  // the body was not read to its end
  res.set_header("Connection", "close");
  if (over || (state && state->over_budget))
    send_json(
        res, 413,
        error_body(413, "invalid_request_error", body_limit_message(options_.max_body_bytes)));
  else if (state && state->timed_out)
    send_json(res, 408,
              error_body(408, "invalid_request_error",
                         "the request body did not arrive within the server's --read-timeout"));
  else
    send_json(res, 400,
              error_body(400, "invalid_request_error",
                         "the request body could not be read (malformed chunked encoding, or the "
                         "client closed the connection)"));
  return std::nullopt;
}

void CompletionServer::handle_completions(const json& body, httplib::Response& res) {
  guarded(res, [&] {
    auto r = std::make_shared<const CompletionRequest>(parse_completion(body, limits_));
    if (r->stream) return stream_completions(r, res);
    const int top_n = r->logprobs ? *r->logprobs : -1;
    json choices = json::array();
    int64_t prompt_tokens = 0, completion_tokens = 0;
    for (size_t i = 0; i < r->prompts.size(); ++i) {
      const auto& prompt = r->prompts[i];
      const EngineResult out =
          engine_->run(prompt, engine_params(*r, top_n, r->echo && r->logprobs.has_value(), i));
      choices.push_back(completion_choice(i, prompt, out, *r, limits_));
      prompt_tokens += static_cast<int64_t>(prompt.size());
      completion_tokens += static_cast<int64_t>(out.generated.size());
    }
    send_json(res, 200,
              {{"id", response_id("cmpl")},
               {"object", "text_completion"},
               {"created", static_cast<int64_t>(std::time(nullptr))},
               {"model", name_},
               {"choices", choices},
               {"usage", usage_json(prompt_tokens, completion_tokens)}});
  });
}

void CompletionServer::handle_chat(const json& body, httplib::Response& res) {
  guarded(res, [&] {
    auto r = std::make_shared<const ChatRequest>(parse_chat(body, limits_));
    if (r->stream) return stream_chat(r, res);
    const EngineResult out =
        engine_->run(r->prompt, engine_params(*r, r->logprobs ? r->top_logprobs : -1, false, 0));
    send_json(res, 200,
              {{"id", response_id("chatcmpl")},
               {"object", "chat.completion"},
               {"created", static_cast<int64_t>(std::time(nullptr))},
               {"model", name_},
               {"choices", json::array({chat_choice(out, *r, limits_)})},
               {"usage", usage_json(static_cast<int64_t>(r->prompt.size()),
                                    static_cast<int64_t>(out.generated.size()))}});
  });
}

void CompletionServer::handle_tokenize(const json& body, httplib::Response& res) const {
  guarded(res, [&] {
    const TokenizeRequest r = parse_tokenize(body, limits_);
    json strs = nullptr;
    if (r.return_token_strs) {
      strs = json::array();
      for (int32_t id : r.ids) strs.push_back(token_text(id, false, limits_));
    }
    send_json(res, 200,
              {{"count", r.ids.size()},
               {"max_model_len", backend_.max_context()},
               {"tokens", r.ids},
               {"token_strs", strs}});
  });
}

void CompletionServer::handle_detokenize(const json& body, httplib::Response& res) const {
  guarded(res, [&] {
    const auto ids = parse_detokenize(body, limits_);
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] >= tokenizer_->size())
        throw ApiError(400, "invalid_request_error", "tokens",
                       "tokens[" + std::to_string(i) + "]: id " + std::to_string(ids[i]) +
                           " is outside tokenizer.json's vocabulary (" +
                           std::to_string(tokenizer_->size()) + " tokens)");
    send_json(res, 200, {{"prompt", tokenizer_->decode(ids)}});
  });
}

int CompletionServer::bind() {
  // httplib's default socket options set SO_REUSEPORT, with which a second server binds the same
  // port and the kernel splits connections between the two models. SO_REUSEADDR alone (a restart
  // while old connections sit in TIME_WAIT) still lets bind() fail on a port that is listening.
  http_->set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  const int port = options_.port == 0
                       ? http_->bind_to_any_port(options_.host)
                       : (http_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port < 0)
    throw Error("cannot listen on " + options_.host + ":" + std::to_string(options_.port) + ": " +
                bind_failure_reason(options_.host, options_.port));
  static_cast<ListenServer&>(*http_).raise_backlog(1024);
  return port;
}

void CompletionServer::serve() {
  if (!stop_requested_) http_->listen_after_bind();
}

void CompletionServer::stop() {
  stop_requested_ = true;
  // httplib's stop() only acts on a running listener; wait briefly for one that is starting.
  for (int i = 0; i < 100 && !http_->is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  http_->stop();
}

int CompletionServer::waiting_requests() const {
  return http_->waiting();
}

int64_t CompletionServer::tokens_generated() const {
  return engine_->tokens_generated();
}

bool CompletionServer::running() const {
  return http_->is_running();
}

}  // namespace phasekv
