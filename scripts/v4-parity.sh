#!/usr/bin/env bash
# DeepSeek-V4 parity: the same HF-layout checkpoint through llama.cpp and through phasekv, logit
# for logit at every position of a prompt long enough for every phase of both compressors
# (ratio 4 and ratio 128), issue 40 section 3.
#
#   1. HF_DIR -> OUT/model.gguf (scripts/interop/deepseek4_to_gguf.py: f32, the test vocabulary)
#   2. TOKENS seeded uniform token ids -> OUT/tokens.txt (the one prompt both engines read)
#   3. llama.cpp: build/phasekv-llama-logits (prebuilt libllama; flash attention off, f32 KV
#      cache, -ub 512, one call) -> OUT/llama.npy
#   4. phasekv: build/phasekv logits --model HF_DIR (the full forward) -> OUT/phasekv.json;
#      STREAM_CHUNK=K adds the streaming session in chunks of K -> OUT/phasekv-stream.json
#   5. scripts/interop/deepseek4_compare.py: max |dlogit| per position and per phase r = position
#      mod S for each compress ratio S, the top-1 flips -> OUT/compare*.json; exit 1 over TOL
#
# Usage: bash scripts/v4-parity.sh HF_DIR [OUT]        (default OUT: runs/v4-parity)
#   TOKENS=N        prompt length (default 640: five ratio-128 blocks, 160 ratio-4 blocks)
#   SEED=S          seed of the prompt (default 1)
#   TOL=T           fail above this max |dlogit| (default 1e-3)
#   THREADS=T       threads of both engines (default 1)
#   STREAM_CHUNK=K  also compare phasekv's streaming session in chunks of K tokens
#   SELF=1          llama.cpp against itself (-ub 7, split at 1,2,130,517) instead of phasekv:
#                   exercises the harness where phasekv cannot load the checkpoint yet
#   PHASEKV=BIN     (default build/phasekv)   DRIVER=BIN (default build/phasekv-llama-logits)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,25p' "$0"; exit 2; }
HF=$1
OUT=${2:-runs/v4-parity}
TOKENS=${TOKENS:-640}
SEED=${SEED:-1}
TOL=${TOL:-1e-3}
THREADS=${THREADS:-1}
PHASEKV=${PHASEKV:-build/phasekv}
DRIVER=${DRIVER:-build/phasekv-llama-logits}
PY=/usr/bin/python3 # Debian's, with python3-numpy (scripts/install-deps.sh)
[ -f "$HF/config.json" ] || { echo "v4-parity: $HF/config.json not found (an HF-layout DeepSeek-V4 dir)" >&2; exit 2; }
[ -x "$DRIVER" ] || { echo "v4-parity: $DRIVER missing (cmake --build build --target phasekv-llama-logits; needs bash scripts/install-deps.sh)" >&2; exit 2; }
mkdir -p "$OUT"

$PY scripts/interop/deepseek4_to_gguf.py "$HF" "$OUT/model.gguf"
# The prompt, and the compress ratios whose phases to report, from the checkpoint's config.
read -r VOCAB RATIOS < <($PY -c '
import json, sys
c = json.load(open(sys.argv[1]))
print(c["vocab_size"], ",".join(str(r) for r in sorted({r for r in c["compress_ratios"] if r})))' \
  "$HF/config.json")
$PY -c '
import sys, numpy as np
n, vocab, seed = map(int, sys.argv[1:4])
ids = np.random.default_rng(seed).integers(0, vocab, n)
print(",".join(str(i) for i in ids))' "$TOKENS" "$VOCAB" "$SEED" >"$OUT/tokens.txt"
echo "== prompt: $TOKENS tokens (seed $SEED) of a $VOCAB-token vocabulary; compress ratios $RATIOS"

echo "== llama.cpp"
"$DRIVER" -m "$OUT/model.gguf" --tokens-file "$OUT/tokens.txt" -t "$THREADS" --ub 512 \
  --flash-attn off -o "$OUT/llama.npy" | tee "$OUT/llama-timing.json"

compare() { # OTHER NAME
  $PY scripts/interop/deepseek4_compare.py "$OUT/llama.npy" "$1" --ratios "$RATIOS" --tol "$TOL" \
    --label-a llama.cpp --label-b "$2" --json "$OUT/compare-$2.json"
}

if [ "${SELF:-0}" = 1 ]; then
  echo "== llama.cpp again (-ub 7, calls split at 1,2,130,517)"
  "$DRIVER" -m "$OUT/model.gguf" --tokens-file "$OUT/tokens.txt" -t "$THREADS" --ub 7 \
    --split 1,2,130,517 --flash-attn off -o "$OUT/llama-split.npy" >/dev/null
  compare "$OUT/llama-split.npy" llama.cpp-split
  exit 0
fi

echo "== phasekv (full forward)"
if ! PHASEKV_THREADS=$THREADS "$PHASEKV" logits --model "$HF" --tokens "$(cat "$OUT/tokens.txt")" \
  --out "$OUT/phasekv.json" 2>"$OUT/phasekv.err"; then
  echo "v4-parity: $PHASEKV logits --model $HF failed:" >&2
  cat "$OUT/phasekv.err" >&2
  exit 3
fi
status=0
compare "$OUT/phasekv.json" phasekv || status=1
if [ -n "${STREAM_CHUNK:-}" ]; then
  echo "== phasekv (streaming session, chunks of $STREAM_CHUNK)"
  "$PHASEKV" logits --model "$HF" --tokens "$(cat "$OUT/tokens.txt")" --stream \
    --chunk "$STREAM_CHUNK" --out "$OUT/phasekv-stream.json"
  compare "$OUT/phasekv-stream.json" phasekv-stream || status=1
fi
exit $status
