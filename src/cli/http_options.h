// The flags of an HTTP backend (backend/http_client.h) that every command talking to a server
// shares, defined once: the dialect, concurrency, timeouts and retries, the API key variable, the
// logprobs width, the context size and the prefix-cache policy. The endpoint and the served
// model's name are the command's own (their meaning differs: audit's --model is the served name,
// conform's is the model directory).
#pragma once
#include <CLI/CLI.hpp>

#include "backend/http_client.h"

namespace phasekv::cli {

// Adds the flags to `cmd`, each writing into `o` (which must outlive the command).
void add_http_backend_options(CLI::App* cmd, HttpBackendOptions& o);

}  // namespace phasekv::cli
