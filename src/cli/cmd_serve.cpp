// `phasekv serve`: a model directory behind an OpenAI-compatible (vLLM-flavoured) HTTP API,
// for `phasekv audit` and other OpenAI clients. SIGINT/SIGTERM stop the listener and let
// in-flight requests finish.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <thread>

#include "backend/local_backend.h"
#include "cli/commands.h"
#include "model/model_dir.h"
#include "io/tokenizer.h"
#include "server/server.h"
#include "util/error.h"
#include "util/threads.h"

namespace phasekv::cli {
namespace {

struct ServeArgs {
  std::string model, host = "127.0.0.1", name;
  int port = 8000, threads = 32, torch_threads = 0, max_tokens_limit = 1024;
  size_t max_body_bytes = size_t{8} << 20;
  bool log_requests = false;
};

std::optional<TaskConfig> task_if_present(const std::string& dir) {
  if (!std::filesystem::exists(std::filesystem::path(dir) / "task.json")) return std::nullopt;
  return load_task_config(dir);
}

// SIGINT/SIGTERM may land on any thread (OpenBLAS starts its pool before main, so masks set
// here cannot cover every thread). The handler only writes the signal number to a pipe, which is
// async-signal-safe; a watcher thread reads it and calls stop(), which is not.
int g_signal_pipe[2] = {-1, -1};

void on_stop_signal(int sig) {
  const char c = static_cast<char>(sig);
  [[maybe_unused]] const ssize_t n = write(g_signal_pipe[1], &c, 1);
}

void install_stop_handlers() {
  if (pipe(g_signal_pipe) != 0) throw Error("serve: cannot create the signal pipe");
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

void run_serve(const ServeArgs& a) {
  if (a.port < 0 || a.port > 65535)
    throw Error("--port is " + std::to_string(a.port) + " (allowed: 0..65535, 0 = any free port)");
  set_threads(a.torch_threads);
  LocalBackend backend = LocalBackend::from_dir(a.model, a.torch_threads);
  ServerOptions o;
  o.host = a.host;
  o.port = a.port;
  o.threads = a.threads;
  o.max_tokens_limit = a.max_tokens_limit;
  o.max_body_bytes = a.max_body_bytes;
  o.served_name = a.name;
  if (a.log_requests) o.log = &std::cerr;
  CompletionServer server(backend, load_tokenizer_if_present(a.model), task_if_present(a.model), o);
  const int port = server.bind();
  install_stop_handlers();
  std::thread watcher([&] {
    char c = 0;
    if (read(g_signal_pipe[0], &c, 1) != 1 || c == 0) return;  // 0: serve() ended by itself
    std::cerr << "phasekv serve: " << (c == SIGINT ? "SIGINT" : "SIGTERM")
              << ": stopping, finishing in-flight requests\n";
    server.stop();
  });
  std::cerr << fmt::format(
      "phasekv serve: model '{}' on http://{}:{} (max_context {}, {} HTTP threads); "
      "SIGINT/SIGTERM stop it\n",
      server.served_name(), a.host, port, backend.max_context(), a.threads);
  server.serve();
  const char zero = 0;
  [[maybe_unused]] const ssize_t n = write(g_signal_pipe[1], &zero, 1);
  watcher.join();
  std::cerr << "phasekv serve: stopped\n";
}

}  // namespace

void register_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "serve", "serve a model over an OpenAI-compatible HTTP API (vLLM shapes) for `audit`");
  auto a = std::make_shared<ServeArgs>();
  cmd->add_option("--model", a->model, "model directory (config.json, weights, tokenizer.json)")
      ->required();
  cmd->add_option("--host", a->host, "address to listen on");
  cmd->add_option("--port", a->port, "port");
  cmd->add_option("--threads", a->threads,
                  "HTTP worker threads, at least the number of concurrent connections")
      ->check(CLI::Range(1, kMaxHttpThreads));
  cmd->add_option("--torch-threads", a->torch_threads, "libtorch threads (0 = all cores)")
      ->check(compute_threads());
  cmd->add_option("--max-tokens-limit", a->max_tokens_limit,
                  "largest max_tokens a request may ask for");
  cmd->add_option("--max-body-bytes", a->max_body_bytes,
                  "largest request body; larger ones get 413")
      ->check(non_negative());
  cmd->add_option("--name", a->name, "served model name ('': <dir name>@<config hash>)");
  cmd->add_flag("--log-requests", a->log_requests, "one line per request on stderr");
  cmd->callback([a] { run_serve(*a); });
}

}  // namespace phasekv::cli
