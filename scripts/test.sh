#!/usr/bin/env bash
# Builds phasekv and runs the whole test suite (ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
