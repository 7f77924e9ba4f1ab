#include "cli/http_options.h"

namespace phasekv::cli {

void add_http_backend_options(CLI::App* cmd, HttpBackendOptions& o) {
  cmd->add_option("--dialect", o.dialect, "auto|vllm|sglang|llamacpp");
  cmd->add_option("--concurrency", o.concurrency, "requests in flight");
  cmd->add_option("--timeout-s", o.timeout_s, "per-request timeout in seconds");
  cmd->add_option("--retries", o.retries, "retries per request");
  cmd->add_option("--retry-base-s", o.retry_base_delay_s,
                  "backoff base: retry k waits up to base * 2^k seconds, jittered");
  cmd->add_option("--give-up-after-s", o.give_up_after_s,
                  "stop (resumable) when the server answered nothing for this long while every "
                  "attempt failed; 0 = never");
  cmd->add_option("--api-key-env", o.api_key_env,
                  "environment variable holding the API key (the key is never logged)");
  cmd->add_option("--top-n", o.top_n, "logprobs / n_probs per position");
  cmd->add_option("--max-context", o.max_context,
                  "the server's context size in tokens, instead of what it reports");
  cmd->add_flag_callback(
      "--keep-prefix-cache", [&o] { o.defeat_prefix_cache = false; },
      "do not salt/disable the server's prefix cache (prompts then share cached prefixes)");
}

}  // namespace phasekv::cli
