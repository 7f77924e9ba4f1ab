#!/usr/bin/env bash
# docs/PROBE.md's measurements on the bundled code pair (models/code-chunked, W8/S4, and its
# full-attention control models/code-full; train them with `bash scripts/train-bundled.sh code`):
#   1. the `T.Cast(FP` probe (configs/probe/fp8-cast.toml) on both, tables by L mod 4;
#   2. the flip search (configs/probe/flips.toml: 256 held-out sites x 2 filler families x 32
#      lengths) on both, at the compressed model's stride 4;
#   3. the probe of the compressed model's example sites (flips/examples/) on both models,
#      charts copied to docs/probe/.
# Usage: bash scripts/code-probe.sh [OUT]  (default runs/code-probe; reruns resume every step)
#        BUILD=0 skips the build (when build/ is current).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/code-probe}
[ "${BUILD:-1}" = 0 ] || bash scripts/build.sh
mkdir -p docs/probe
for m in code-chunked code-full; do
  echo "== $m: fp8-cast probe"
  build/phasekv probe --spec configs/probe/fp8-cast.toml --model "models/$m" --stride 4 \
    --retest 4 --threads 1 --out "$OUT/$m/fp8-cast"
  cp "$OUT/$m/fp8-cast/probe.svg" "docs/probe/$m-fp8-cast-margin.svg"
  echo "== $m: flip search"
  build/phasekv flips --spec configs/probe/flips.toml --model "models/$m" --stride 4 \
    --threads 1 --out "$OUT/$m/flips"
done
# The compressed model's example sites, probed on both models (the same spec for each).
for spec in "$OUT"/code-chunked/flips/examples/*.json; do
  [ -e "$spec" ] || continue
  site=$(basename "$spec" .json)
  for m in code-chunked code-full; do
    echo "== $m: $site"
    build/phasekv probe --spec "$spec" --model "models/$m" --stride 4 --threads 1 \
      --out "$OUT/$m/examples/$site" | head -n 1
    # An example spec has one family: its chart is the one probe-FAMILY.svg (probe.svg is the margin).
    cp "$OUT/$m/examples/$site"/probe-*.svg "docs/probe/$m-$site.svg"
  done
done
