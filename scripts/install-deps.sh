#!/usr/bin/env bash
# Installs phasekv's dependencies from Debian's packages.
#   bash scripts/install-deps.sh        everything: what builds and runs phasekv, and the tests'
#                                       and developers' tools (GoogleTest, Google Benchmark,
#                                       Chromium, clang with its sanitizer runtimes, Node with the
#                                       openai npm package, PyTorch for Python, clang-format).
#                                       CI (.ci/run) and scripts/test.sh.
#   bash scripts/install-deps.sh --run  only what building and running `phasekv` needs: the
#                                       main job (scripts/main.sh).
# Idempotent: packages already present are left alone, so CI can run it on every build.
set -euo pipefail

case "${1:-}" in
  "") set_name="all" ;;
  --run) set_name="run" ;;
  *) echo "usage: bash scripts/install-deps.sh [--run]" >&2; exit 2 ;;
esac

# Building and running phasekv (every find_package of CMakeLists.txt outside the tests).
RUN_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev
  # Without the pthread OpenBLAS, Debian's libtorch falls back to the reference BLAS:
  # fp32 matmul measured ~50x slower on the CI machine.
  libopenblas0-pthread
  # oneDNN's headers: phasekv runs its f32 GEMMs through oneDNN's sgemm (AVX-512), ~2x the
  # AVX2 kernels OpenBLAS 0.3.21 picks on CPUs it does not know (measured on AMD Zen 5).
  libdnnl-dev
  nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libssl-dev libfmt-dev
  libsentencepiece-dev libtomlplusplus-dev
)
# Testing, fuzzing, benchmarking and formatting, and the texts of the optional corpora.
DEV_PACKAGES=(
  clang-format
  googletest libgtest-dev libbenchmark-dev
  # The PyTorch-Python reference used by bench/ (numerics and speed comparison).
  python3-torch python3-numpy
  # The code corpus (data/corpus/python-stdlib.json): the Python standard library's sources.
  libpython3.11-minimal libpython3.11-stdlib
  # The long-document filler (data/filler/vim-manual.json): the Vim manuals' plain text.
  vim-runtime
  chromium  # headless browser for tests/browser (renders report.html and compare.html)
  # clang with its libFuzzer and sanitizer runtimes: scripts/fuzz.sh (ASan + UBSan, fuzz/).
  clang libclang-rt-14-dev
  xz-utils  # scripts/keep-runs.sh (a suite's finished runs, kept in git)
)
PACKAGES=("${RUN_PACKAGES[@]}")
[ "$set_name" = all ] && PACKAGES+=("${DEV_PACKAGES[@]}")

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node and npm for tests/openai (the official OpenAI client drives `phasekv serve`). Debian's
# packages only when the commands are missing: a NodeSource nodejs ships its own npm, and
# Debian's npm package conflicts with it.
if [ "$set_name" = all ]; then
  command -v node >/dev/null || missing+=(nodejs)
  command -v npm >/dev/null || missing+=(npm)
fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present ($set_name)"
else
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

[ "$set_name" = all ] || exit 0
# The `openai` npm package (v4, pinned by tests/openai/package-lock.json) into the git-ignored
# tests/openai/node_modules, from the npm registry.
openai_dir="$(cd "$(dirname "$0")/.." && pwd)/tests/openai"
if [ ! -f "$openai_dir/node_modules/openai/package.json" ]; then
  echo "install-deps: npm ci in tests/openai (the openai client for the OpenAIClient test)"
  (cd "$openai_dir" && npm ci --no-audit --no-fund)
fi

# llama.cpp for the `llamacpp` tests and phasekv-llama-logits (DeepSeek-V4 parity, issue 40):
# npm's node-llama-cpp 3.22.1 (its git bundle is llama.cpp release v0.5.0's source: headers,
# gguf-py) and @node-llama-cpp/linux-x64 (the same release prebuilt for x86-64 CPUs). Only these
# two: --omit=optional leaves out the ~600 MB of CUDA, Vulkan and other platforms' builds. The
# same layout as scripts/interop-llamacpp.sh's WORK (which builds llama-server on top of it).
# Measured: 15 s in all (npm cache warm; 85 MB installed), nothing when both are present.
llama_dir=${PHASEKV_LLAMACPP_DIR:-$HOME/.cache/phasekv/llamacpp}
llama_bins=$llama_dir/npm/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
llama_bundle=$llama_dir/npm/node_modules/node-llama-cpp/llama/gitRelease.bundle
if [ ! -f "$llama_bins/libllama.v0.5.0.so" ] || [ ! -f "$llama_bundle" ]; then
  echo "install-deps: npm install node-llama-cpp@3.22.1 @node-llama-cpp/linux-x64@3.22.1 into $llama_dir/npm"
  mkdir -p "$llama_dir/npm"
  npm install --prefix "$llama_dir/npm" --ignore-scripts --no-audit --no-fund --omit=optional \
    node-llama-cpp@3.22.1 @node-llama-cpp/linux-x64@3.22.1 >"$llama_dir/npm.log" 2>&1 ||
    { tail -n 20 "$llama_dir/npm.log" >&2; exit 1; }
fi
if [ ! -f "$llama_dir/src/include/llama.h" ]; then
  echo "install-deps: cloning llama.cpp's source from node-llama-cpp's bundle into $llama_dir/src"
  rm -rf "$llama_dir/src"
  git -c advice.detachedHead=false clone -q "$llama_bundle" "$llama_dir/src"
fi
