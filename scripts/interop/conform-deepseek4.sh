#!/usr/bin/env bash
# Engine conformance of llama.cpp's deepseek4 (issue 41, docs/CONFORM.md): a phasekv DeepSeek-V4
# model directory is converted to GGUF (deepseek4_to_gguf.py, f32), served by llama-server under
# every condition below, and held against the same model in process with `phasekv conform`:
#   ub{1,5,512}-fa-{off,on}   the server restarted with that micro-batch (-ub) and flash attention
#   np4-c4                    4 slots, 4 requests in flight (continuous batching), -ub 512, fa off
#   pieces3                   each prompt sent in 3 pieces through the slot's prompt cache
# Everything lands in OUT (OUT/conform.json, OUT/conform.csv: one row per condition and phase).
# Reruns resume: finished conditions are rescored from their results.jsonl at no cost.
#
# Usage: bash scripts/interop/conform-deepseek4.sh MODEL_DIR OUT
#   SERVER=PATH   llama-server (default ~/.cache/phasekv/llamacpp/src/build/bin/llama-server,
#                 which scripts/interop-llamacpp.sh builds)
#   PHASEKV=BIN   the phasekv binary (default build/phasekv)
#   EXAMPLES=N    logical examples (default 10), MODULUS=M (default 24), PADDING (prefix)
#   THREADS=N     llama-server's threads (default 1)
#   TOP_N=N       probabilities per answer (default 1000: the whole vocabulary of a small model)
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:?usage: conform-deepseek4.sh MODEL_DIR OUT}
OUT=${2:?usage: conform-deepseek4.sh MODEL_DIR OUT}
WORK=${WORK:-$HOME/.cache/phasekv/llamacpp}
SERVER=${SERVER:-$WORK/src/build/bin/llama-server}
PHASEKV=${PHASEKV:-build/phasekv}
EXAMPLES=${EXAMPLES:-10}
MODULUS=${MODULUS:-24}
PADDING=${PADDING:-prefix}
THREADS=${THREADS:-1}
PORT=${PORT:-8479}
TOP_N=${TOP_N:-1000} # every token of a small vocabulary: no censored target
PY=/usr/bin/python3 # Debian's, with python3-numpy
[ -x "$SERVER" ] || { echo "no llama-server at $SERVER (bash scripts/interop-llamacpp.sh builds it)" >&2; exit 2; }
mkdir -p "$OUT"
GGUF=$OUT/model.gguf
if [ ! -f "$GGUF" ] || [ "$MODEL/model.safetensors" -nt "$GGUF" ]; then
  PYTHONPATH=$WORK/src/gguf-py $PY scripts/interop/deepseek4_to_gguf.py "$MODEL" "$GGUF"
fi
echo "== llama-server: $("$SERVER" --version 2>&1 | grep -m1 version || true)"

PID=
trap '[ -z "$PID" ] || kill "$PID" 2>/dev/null || true' EXIT
serve() { # LABEL [llama-server flags...]
  local label=$1
  shift
  "$SERVER" -m "$GGUF" --alias v4 --port "$PORT" -c 2048 -t "$THREADS" --no-webui \
    --cache-type-k f32 --cache-type-v f32 "$@" >"$OUT/llama-server-$label.log" 2>&1 &
  PID=$!
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "llama-server ($label) did not come up; its log: $OUT/llama-server-$label.log" >&2
  tail -n 20 "$OUT/llama-server-$label.log" >&2
  exit 1
}
stop() { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; PID=; }
conform() { # LABEL [conform flags...]
  local label=$1
  shift
  echo "== conform $label"
  "$PHASEKV" conform --model "$MODEL" --endpoint "http://127.0.0.1:$PORT" --served-model v4 \
    --condition "$label" --out "$OUT" --modulus "$MODULUS" --examples "$EXAMPLES" \
    --padding "$PADDING" --threads 1 --top-n "$TOP_N" "$@" | tail -n 1
}

for fa in off on; do
  for ub in 1 5 512; do
    serve "ub$ub-fa-$fa" -np 1 -b 512 -ub "$ub" --flash-attn "$fa"
    conform "ub$ub-fa-$fa"
    stop
  done
done
serve np4-c4 -np 4 -b 512 -ub 512 --flash-attn off
conform np4-c4 --concurrency 4
stop
serve pieces3 -np 1 -b 512 -ub 512 --flash-attn off
conform pieces3 --prefill-pieces 3
stop
echo "== every condition"
"$PY" - "$OUT/conform.json" <<'EOF'
import json, sys
for c in json.load(open(sys.argv[1]))["conditions"]:
    s = c["conform"]
    cached = c["engine"].get("usage", {}).get("cached_prompt_tokens", 0)
    print(f'{s["condition"]:<14} max |dlogp| {s["max_dlogprob"]:.2e}  greedy flips {s["greedy_flips"]:>3}'
          f'  verdict flips {s["verdict_flips"]:>3}  cached prompt tokens {cached:>6}  {s["verdict"]}')
EOF
