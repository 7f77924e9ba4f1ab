// `phasekv serve`: a model directory behind an OpenAI-compatible (vLLM-flavoured) HTTP API,
// for `phasekv audit` and other OpenAI clients. SIGINT/SIGTERM stop the listener and let
// in-flight requests finish.
#include <fmt/format.h>
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <thread>

#include "backend/local_backend.h"
#include "cli/commands.h"
#include "cli/path_options.h"
#include "io/tokenizer.h"
#include "model/model_dir.h"
#include "server/server.h"
#include "util/error.h"
#include "util/threads.h"

namespace phasekv::cli {
namespace {

// The flags set the server's options directly (their defaults are ServerOptions').
struct ServeArgs {
  std::string model;
  int torch_threads = 0;
  bool log_requests = false;
  ServerOptions o;
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
  if (a.o.port < 0 || a.o.port > 65535)
    throw Error("--port is " + std::to_string(a.o.port) +
                " (allowed: 0..65535, 0 = any free port)");
  // Every thread that allocates may get its own malloc arena, and freed arena memory mostly stays
  // with the process: repeated large requests grew the server from 1.6 to 3.5 GB. Two arenas
  // keep it bounded (docs/RELIABILITY.md has the drill); MALLOC_ARENA_MAX, when set, wins.
  if (!std::getenv("MALLOC_ARENA_MAX")) mallopt(M_ARENA_MAX, 2);
  set_threads(a.torch_threads);
  LocalBackend backend = LocalBackend::from_dir(a.model, a.torch_threads);
  ServerOptions o = a.o;
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
      server.served_name(), o.host, port, backend.max_context(), o.threads);
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
      ->required()
      ->transform(bundled_path());
  cmd->add_option("--host", a->o.host, "address to listen on");
  cmd->add_option("--port", a->o.port, "port");
  // --threads means libtorch threads in every command (README glossary); the HTTP workers have
  // their own flag. --torch-threads, serve's name for it before, stays an alias.
  cmd->add_option("--http-threads", a->o.threads,
                  "HTTP worker threads that run requests (idle or slow connections do not hold "
                  "one)")
      ->check(CLI::Range(1, kMaxHttpThreads));
  cmd->add_option("--threads,--torch-threads", a->torch_threads, "libtorch threads (0 = all cores)")
      ->check(compute_threads());
  cmd->add_option("--max-tokens-limit", a->o.max_tokens_limit,
                  "largest max_tokens a request may ask for");
  cmd->add_option("--max-body-bytes", a->o.max_body_bytes,
                  "largest request body; larger ones get 413")
      ->check(non_negative());
  cmd->add_option("--max-logprob-entries", a->o.max_logprob_entries,
                  "largest (prompt tokens with echo + max_tokens) x (logprobs + 1) of one request")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--read-timeout", a->o.read_timeout_s,
                  "seconds a request's head and body may take to arrive (then 408)")
      ->check(CLI::Range(0.01, 3600.0));
  cmd->add_option("--max-queue", a->o.max_queue,
                  "requests waiting for a thread; more are answered 503 with Retry-After")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--max-connections", a->o.max_connections,
                  "open connections; more are answered 503 with Retry-After")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--name", a->o.served_name, "served model name ('': <dir name>@<config hash>)");
  cmd->add_flag("--log-requests", a->log_requests,
                "one line per request on stderr, those refused (503, 413, malformed) included");
  cmd->callback([a] { run_serve(*a); });
}

}  // namespace phasekv::cli
