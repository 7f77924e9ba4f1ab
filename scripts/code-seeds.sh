#!/usr/bin/env bash
# Replicates the bundled code pair (configs/train/code-chunked.toml and code-full.toml) with other
# seeds (initial weights and data order) and runs the flip search (configs/probe/flips.toml) on
# each: docs/PROBE.md's table over seeds. The two trainings of a seed run side by side, one
# thread each, into runs/train-code-{chunked,full}-s<seed>; an interrupted run resumes.
# Usage: bash scripts/code-seeds.sh [SEED ...]   (default: 1)
#        BUILD=0 skips the build (when build/ is current).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${BUILD:-1}" = 0 ] || bash scripts/build.sh
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(1)
mkdir -p runs
for seed in "${seeds[@]}"; do
  pids=()
  for m in code-chunked code-full; do
    out="runs/train-$m-s$seed"
    start=--force
    [ ! -d "$out/checkpoint" ] || start=--resume
    if [ ! -f "$out/model.safetensors" ]; then
      build/phasekv train --config "configs/train/$m.toml" --seed "$seed" --out "$out" $start \
        >> "$out.log" 2>&1 &
      pids+=($!)
    fi
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  for m in code-chunked code-full; do
    tail -n 1 "runs/train-$m-s$seed.log"
    build/phasekv flips --spec configs/probe/flips.toml --model "runs/train-$m-s$seed" --stride 4 \
      --threads 1 --out "runs/code-probe/$m-s$seed/flips" | head -n 1
  done
done
