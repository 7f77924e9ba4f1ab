#!/usr/bin/env bash
# The figures of docs/PERFORMANCE.md in one go; add --quick for about a minute of benchmarks (the
# bf16 training comparison is skipped then).
#   bash bench/run.sh [--quick]          results in ${OUT:-/tmp/phasekv-bench}/
# Needs a built phasekv (PHASEKV, default build-perf/phasekv) and Debian's python3-torch.
# Full-attention prefill grows as T^2: CONTEXTS=4096,16384,65536 (the issue's sizes) needs an idle
# machine and a long wait at 64K; the default stops at 16K.
set -euo pipefail
cd "$(dirname "$0")/.."
PHASEKV=${PHASEKV:-build-perf/phasekv}
PY=${PY:-/usr/bin/python3}
OUT=${OUT:-/tmp/phasekv-bench}
THREADS=${THREADS:-1}  # 1: on a machine shared with other jobs, 2 OpenMP threads stall
CONTEXTS=${CONTEXTS:-1024,4096,16384}
QUICK=${1:-}
mkdir -p "$OUT"

echo "== numerics: phasekv vs PyTorch, same weights and batch, one f32 step"
for size in small large study; do
  "$PHASEKV" bench dump --size "$size" --out "$OUT/check-$size" $QUICK
  "$PY" bench/torch_reference.py check "$OUT/check-$size" | tee "$OUT/check-$size.json"
done

echo "== benchmarks"
SIZES=(--contexts "$CONTEXTS")
[ "$QUICK" = "--quick" ] && SIZES=(--quick)
"$PHASEKV" bench all --threads "$THREADS" --python "$PY" --json "$OUT/bench.json" "${SIZES[@]}" \
  | tee "$OUT/bench.txt"

if [ "$QUICK" != "--quick" ]; then
  echo "== bf16 vs f32 training loss, configs/train/kv-chunked.toml, seeds ${SEEDS:=0 1 2 3 4}"
  PHASEKV="$PHASEKV" OUT="$OUT/bf16-loss" SEEDS="$SEEDS" bash bench/bf16_loss.sh
fi
