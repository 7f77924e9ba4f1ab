#!/usr/bin/env bash
# Retrains the bundled models in models/ from their configs in configs/train/, a pair at a time
# (the two runs of a pair side by side, one thread each; docs/PERFORMANCE.md has the speed):
#   models/lookup-chunked  the study's geometry: lookup task, 16-token raw window, W8/S8, per-slot
#                          payload maps, 1 KV head (the reproduction suite's run W8S8)
#   models/lookup-full     its full-attention control (the suite's run full-1kv)
#   models/kv-chunked      a boundary-phase toy: S = W = 4, scalar gates, raw window 1 token
#   models/kv-full         its full-attention control
# Training logs stay in runs/train-<name>/ (train_log.jsonl, train.json); models/<name>/ gets what
# serving and sweeping need. Pass pair names to retrain only those: lookup, kv.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
mkdir -p runs models
pairs=("$@")
[ ${#pairs[@]} -gt 0 ] || pairs=(lookup kv)
for pair in "${pairs[@]}"; do
  case "$pair" in
    lookup | kv) ;;
    *) echo "train-bundled.sh: unknown pair '$pair' (allowed: lookup, kv)" >&2; exit 2 ;;
  esac
  names=("$pair-chunked" "$pair-full")
  pids=()
  for name in "${names[@]}"; do
    build/phasekv train --config "configs/train/$name.toml" --out "runs/train-$name" --force \
      > "runs/train-$name.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!names[@]}"; do
    if ! wait "${pids[$i]}"; then
      echo "training ${names[$i]} failed; see runs/train-${names[$i]}.log" >&2
      exit 1
    fi
  done
  for name in "${names[@]}"; do
    tmp="models/.$name.tmp"
    rm -rf "$tmp" && mkdir -p "$tmp"
    cp "runs/train-$name"/{config.json,model.safetensors,task.json,tokenizer.json,train.json} "$tmp/"
    rm -rf "models/$name" && mv "$tmp" "models/$name"
    tail -n 1 "runs/train-$name.log"
  done
done
