#!/usr/bin/env bash
# The padding probe of docs/PROBE.md on the bundled lookup pair: configs/probe/lookup.toml (one
# lookup prompt behind 1 to 64 tokens of prefix padding, four filler families) on
# models/lookup-chunked and its full-attention control models/lookup-full, with the tables by
# L mod 8 and a retest over 8 consecutive lengths; copies the charts to docs/probe/.
# Usage: bash scripts/probe.sh [OUT]   (default runs/probe; a rerun resumes from results.jsonl)
#        BUILD=0 skips the build (when build/ is current).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/probe}
[ "${BUILD:-1}" = 0 ] || bash scripts/build.sh
mkdir -p docs/probe
for m in lookup-chunked lookup-full; do
  echo "== $m"
  build/phasekv probe --spec configs/probe/lookup.toml --model "models/$m" --stride 8 \
    --retest 8 --threads 1 --out "$OUT/$m"
  cp "$OUT/$m/probe.svg" "docs/probe/$m-margin.svg"
  cp "$OUT/$m/probe-f0.svg" "docs/probe/$m-f0.svg"
done
