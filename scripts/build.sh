#!/usr/bin/env bash
# Configures and builds phasekv (Release) into build/.
#   bash scripts/build.sh              every dependency (install-deps.sh) and every target, the
#                                      tests included
#   bash scripts/build.sh --run        only the run dependencies (install-deps.sh --run) and only
#                                      phasekv and phasekv-tokenizer: the main job's build
#   bash scripts/build.sh [--run] T..  only the targets T (e.g. phasekv_tests)
set -euo pipefail
cd "$(dirname "$0")/.."
deps=()
if [ "${1:-}" = --run ]; then
  deps=(--run)
  shift
  [ $# -gt 0 ] || set -- phasekv  # builds phasekv-tokenizer too (a dependency)
fi
bash scripts/install-deps.sh "${deps[@]}" >/dev/null
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build -j "$(nproc)" "${targets[@]}"
