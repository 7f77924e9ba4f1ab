#!/usr/bin/env bash
# ctest OpenAIClient (label openai): the official OpenAI client for Node (npm `openai`, v4,
# pinned by package-lock.json into the git-ignored node_modules) against `phasekv serve`, twice:
# the word-level models/kv-chunked and the sentencepiece models/code-chunked.
# scripts/install-deps.sh installs Node, npm and the package; this installs the package too when
# it is missing (a checkout that ran install-deps before this test existed).
# Usage: run.sh PHASEKV_BINARY
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
command -v node >/dev/null || { echo "node is not installed (bash scripts/install-deps.sh)"; exit 1; }
if [ ! -f "$here/node_modules/openai/package.json" ]; then
  (cd "$here" && npm ci --no-audit --no-fund)
fi

log=$(mktemp)
sp_log=$(mktemp)
"$bin" serve --model "$root/models/kv-chunked" --port 0 --torch-threads 1 --log-requests \
  2>"$log" &
pid=$!
"$bin" serve --model "$root/models/code-chunked" --port 0 --torch-threads 1 --log-requests \
  2>"$sp_log" &
sp_pid=$!
trap 'kill "$pid" "$sp_pid" 2>/dev/null; wait "$pid" "$sp_pid" 2>/dev/null; rm -f "$log" "$sp_log"' EXIT
# The URL a server printed to its log $1 once it listens.
url_of() {
  local url=""
  for _ in $(seq 200); do
    url=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$1" | head -1 || true)
    [ -n "$url" ] && break
    sleep 0.05
  done
  [ -n "$url" ] || { echo "phasekv serve did not start:" >&2; cat "$1" >&2; return 1; }
  echo "$url"
}
url=$(url_of "$log")
sp_url=$(url_of "$sp_log")

node "$here/client.test.mjs" "$url/v1" "$sp_url/v1"
# The aborted 400-token stream must have stopped the generation, not run to the end.
sleep 0.5
grep -q "stream: the client went away; generation stopped" "$log" || {
  echo "FAIL: the aborted stream was not stopped; server log:"
  cat "$log"
  exit 1
}
echo "the aborted stream stopped the generation"
