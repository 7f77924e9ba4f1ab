#!/usr/bin/env bash
# Audits a real llama.cpp server (llama-server, built from source) with phasekv, in every mode, and
# checks its answers against phasekv's own: issue 21's "a real peer, not only fakes".
#
# Where llama.cpp comes from: the npm package node-llama-cpp ships llama.cpp's source as a git
# bundle (llama/gitRelease.bundle). It is installed with npm (--ignore-scripts: nothing is
# downloaded from elsewhere), cloned from the bundle and llama-server is built for the CPU
# (about 20 minutes on 2 cores). Nothing of llama.cpp is committed; it all lives under $WORK.
#
# What is served (scripts/interop/phasekv_to_gguf.py, with llama.cpp's own gguf-py and Debian's
# python3-numpy): the bundled full-attention models as llama.cpp's qwen3 architecture, f32 weights
# and an f32 KV cache:
#   kv-full   (word vocabulary)           audited with --render ids, by logprob and by generation,
#                                         and compared record by record with `phasekv sweep`;
#   code-full (SentencePiece BPE, 4096)   audited with --render text (logprob, generate) and
#                                         compared with the same audits of `phasekv serve`, and
#                                         --api chat (a plain-text template, reasoning off,
#                                         and phasekv serve's own template rendered by both);
#                                         a long-document grid with natural filler (the Vim
#                                         manuals), and the plan of 128K-token documents.
#
# Usage: bash scripts/interop-llamacpp.sh [OUT]    (default runs/interop-llamacpp; reruns resume)
#   WORK=DIR      llama.cpp's npm package, source and build (default ~/.cache/phasekv/llamacpp)
#   EXAMPLES=N    logical examples per audit (default 20; 8 phases each)
#   BUILD=0       do not build phasekv (build/ is current)
#   LONG=0        skip the long-document grid
#   SCORE_128K=1  also score one example of 128K-token documents (2 items, ~15 min each)
#   PHASEKV=BIN   the phasekv binary (default build/phasekv)
#   V4_MODEL=DIR  also a DeepSeek-V4 model directory (config.json, model.safetensors, task.json):
#                 served as llama.cpp's deepseek4, audited blind, compared, and held to
#                 `phasekv conform` (docs/CONFORM.md)
#   V4_ONLY=1     with V4_MODEL: only the DeepSeek-V4 part (no qwen3 models, no long documents)
#   CONFORM_EXAMPLES=N  logical examples per conformance condition (default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/interop-llamacpp}
WORK=${WORK:-$HOME/.cache/phasekv/llamacpp}
NODE_LLAMA_CPP=3.22.1 # pinned: its bundle is the llama.cpp source that was audited
EXAMPLES=${EXAMPLES:-20}
THREADS=${THREADS:-2}
PY=/usr/bin/python3 # Debian's, with python3-numpy (scripts/install-deps.sh)
PHASEKV=${PHASEKV:-build/phasekv} # a copy keeps a long run safe from rebuilds
[ "${BUILD:-1}" = 0 ] || bash scripts/build.sh
mkdir -p "$OUT" "$WORK"

# --- llama.cpp from the npm registry --------------------------------------------------------
if [ ! -f "$WORK/npm/node_modules/node-llama-cpp/llama/gitRelease.bundle" ]; then
  echo "== npm install node-llama-cpp@$NODE_LLAMA_CPP (llama.cpp's source bundle)"
  npm install --prefix "$WORK/npm" --ignore-scripts --no-audit --no-fund \
    "node-llama-cpp@$NODE_LLAMA_CPP" >"$WORK/npm.log" 2>&1
fi
if [ ! -d "$WORK/src/.git" ]; then
  git clone -q "$WORK/npm/node_modules/node-llama-cpp/llama/gitRelease.bundle" "$WORK/src"
fi
SERVER=$WORK/src/build/bin/llama-server
if [ ! -x "$SERVER" ]; then
  echo "== building llama-server (CPU only; about 20 minutes on 2 cores)"
  cmake -S "$WORK/src" -B "$WORK/src/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=OFF >"$WORK/cmake.log"
  cmake --build "$WORK/src/build" -j "$(nproc)" --target llama-server >"$WORK/build.log"
fi
LLAMA_VERSION=$("$SERVER" --version 2>&1 | grep -m1 version || true)
echo "== llama-server: $LLAMA_VERSION (node-llama-cpp $NODE_LLAMA_CPP)"

# --- the models as GGUF -----------------------------------------------------------------------
export PYTHONPATH=$WORK/src/gguf-py
QWEN3=1
[ "${V4_ONLY:-0}" = 0 ] || { [ -n "${V4_MODEL:-}" ] || { echo "V4_ONLY=1 needs V4_MODEL=DIR" >&2; exit 2; }; QWEN3=0; }
if [ "$QWEN3" = 1 ]; then
  $PY scripts/interop/phasekv_to_gguf.py models/kv-full "$OUT/kv-full.gguf"
  $PY scripts/interop/phasekv_to_gguf.py models/code-full "$OUT/code-full.gguf" \
    --chat-template scripts/interop/plain-chat.jinja
fi

# --- servers ----------------------------------------------------------------------------------
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
wait_up() { # URL LOG
  for _ in $(seq 1 120); do
    curl -sf "$1/health" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "server at $1 did not come up; its log: $2" >&2
  tail -n 20 "$2" >&2
  exit 1
}
llama() { # GGUF ALIAS PORT CTX [llama-server flags...]
  "$SERVER" -m "$1" --alias "$2" --port "$3" -c "$4" -np 1 -t "$THREADS" --no-webui \
    --cache-type-k f32 --cache-type-v f32 "${@:5}" >"$OUT/llama-server-$2.log" 2>&1 &
  PIDS+=($!)
  wait_up "http://127.0.0.1:$3" "$OUT/llama-server-$2.log"
}
phasekv_serve() { # MODEL NAME PORT
  $PHASEKV serve --model "$1" --name "$2" --port "$3" --torch-threads "$THREADS" \
    >"$OUT/phasekv-serve-$2.log" 2>&1 &
  PIDS+=($!)
  wait_up "http://127.0.0.1:$3" "$OUT/phasekv-serve-$2.log"
}
audit() { # PORT NAME OUT_SUBDIR [flags...]   (N=K, M=K before it: K examples, modulus K)
  local port=$1 name=$2 out=$3
  shift 3
  echo "== audit $out"
  $PHASEKV audit --endpoint "http://127.0.0.1:$port" --model "$name" --modulus "${M:-8}" \
    --examples "${N:-$EXAMPLES}" --concurrency 1 --out "$OUT/$out" "$@" 2>&1 | tail -n 4
}
compare() { # A B: records of two runs, joined on (example, phase[, cell])
  $PY scripts/interop/compare_records.py "$OUT/$1" "$OUT/$2" | tee "$OUT/compare-$1-vs-$2.txt"
}

qwen3_models() { # the bundled full-attention models as llama.cpp's qwen3
# kv-full: token ids, against the in-process sweep of the same examples.
llama "$OUT/kv-full.gguf" kv-full 8091 512
$PHASEKV sweep --model models/kv-full --task kv --padding prefix --modulus 8 \
  --examples "$EXAMPLES" --threads 1 --out "$OUT/kv-full-sweep" | tail -n 1
audit 8091 kv-full kv-full-ids --render ids --task-config models/kv-full/task.json
compare kv-full-sweep kv-full-ids
audit 8091 kv-full kv-full-ids-generate --render ids --task-config models/kv-full/task.json \
  --mode generate
compare kv-full-sweep kv-full-ids-generate

# code-full: text through llama.cpp's tokenizer and through phasekv's, the same audits.
llama "$OUT/code-full.gguf" code-full 8092 32768
phasekv_serve models/code-full code-full 8093
TEXT=(--render text --context-len 256 --n-records 4)
for s in 8092:llamacpp 8093:phasekv; do
  port=${s%%:*} who=${s##*:}
  audit "$port" code-full "code-full-text-$who" "${TEXT[@]}"
  audit "$port" code-full "code-full-text-generate-$who" "${TEXT[@]}" --mode generate
done
# Chat through llama.cpp's Jinja renderer of the template embedded in the GGUF: role lines around
# the content (scripts/interop/plain-chat.jinja), and phasekv's own template, taken from `phasekv
# serve`'s /v1/models and embedded in a second GGUF of the same weights. With the same template
# both servers must render the same prompts (the records' token-id hashes) and give the same
# answers.
audit 8092 code-full code-full-chat-llamacpp "${TEXT[@]}" --api chat --reasoning off
curl -sf http://127.0.0.1:8093/v1/models |
  $PY -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["phasekv"]["chat_template"], end="")' \
    >"$OUT/phasekv-chat.jinja"
$PY scripts/interop/phasekv_to_gguf.py models/code-full "$OUT/code-full-phasekv-chat.gguf" \
  --chat-template "$OUT/phasekv-chat.jinja"
llama "$OUT/code-full-phasekv-chat.gguf" code-full-phasekv-chat 8094 32768
audit 8093 code-full code-full-chat-phasekv "${TEXT[@]}" --api chat
audit 8094 code-full-phasekv-chat code-full-chat-llamacpp-phasekv-template "${TEXT[@]}" --api chat
compare code-full-text-phasekv code-full-text-llamacpp
compare code-full-text-generate-phasekv code-full-text-generate-llamacpp
compare code-full-chat-phasekv code-full-chat-llamacpp-phasekv-template
}
[ "$QWEN3" = 0 ] || qwen3_models

# A DeepSeek-V4 trained by phasekv (V4_MODEL, a V4 model directory with its task.json): llama.cpp's
# deepseek4 serves its f32 GGUF (flash attention off: docs/CONFORM.md), the audit finds its period
# blind (no --stride, the default modulus 24) and its records are compared item by item with the
# in-process sweep of the same examples; then `phasekv conform` under every engine condition.
if [ -n "${V4_MODEL:-}" ]; then
  PYTHONPATH=$WORK/src/gguf-py $PY scripts/interop/deepseek4_to_gguf.py "$V4_MODEL" "$OUT/v4.gguf"
  llama "$OUT/v4.gguf" v4 8096 2048 --flash-attn off
  $PHASEKV sweep --model "$V4_MODEL" --task lookup --padding prefix --modulus 24 --stride 4 \
    --examples "$EXAMPLES" --threads 1 --out "$OUT/v4-sweep" | tail -n 3
  M=24 audit 8096 v4 v4-ids --render ids --task-config "$V4_MODEL/task.json" --task lookup \
    --top-n 1000
  compare v4-sweep v4-ids
  EXAMPLES=${CONFORM_EXAMPLES:-10} PHASEKV=$PHASEKV PORT=8097 \
    bash scripts/interop/conform-deepseek4.sh "$V4_MODEL" "$OUT/v4-conform"
fi

if [ "${LONG:-1}" != 0 ] && [ "$QWEN3" = 1 ]; then
  # Long documents of natural text, through a GGUF that declares a 133,120-token context
  # (llama-server caps a slot to the declared length; the model was trained on 512 tokens, so
  # these audits test the harness and the server, not the model's retrieval). 128K-token items
  # are planned (--dry-run); SCORE_128K=1 scores one example of them at modulus 2 (2 items; a
  # 4-layer model's prefill of 128K tokens took 14 min per item on one thread).
  $PY scripts/interop/phasekv_to_gguf.py models/code-full "$OUT/code-full-133k.gguf" \
    --context-length 133120
  llama "$OUT/code-full-133k.gguf" code-full-133k 8095 133120
  LONGDOC=(--render text --filler data/filler/vim-manual.json)
  N=2 audit 8095 code-full-133k code-full-long "${LONGDOC[@]}" --context-tokens 1024,8192 \
    --depths 0,50,100
  N=2 audit 8095 code-full-133k code-full-long-128k "${LONGDOC[@]}" --context-tokens 131072 \
    --depths 50 --dry-run
  if [ "${SCORE_128K:-0}" = 1 ]; then
    M=2 N=1 audit 8095 code-full-133k code-full-long-128k "${LONGDOC[@]}" --context-tokens 131072 \
      --depths 50 --timeout-s 3600
  fi
fi
echo "== done: $OUT (compare-*.txt, */audit.json)"
