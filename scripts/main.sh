#!/usr/bin/env bash
# The main job on the bundled default. Until the phase sweep lands this initialises the bundled
# tiny chunked config and prints its architecture and cache bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
out=$(mktemp -d)
build/phasekv init --config configs/tiny-chunked.json --out "$out/model" --seed 1
build/phasekv info "$out/model" --context 4096
rm -rf "$out"
