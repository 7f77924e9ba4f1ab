#!/usr/bin/env bash
# Retrains the two bundled models in models/ from their configs in configs/train/:
#   models/kv-chunked  chunked attention (S = W = 4, scalar gates, 1 KV head, raw window 1 token)
#   models/kv-full     its full-attention control (same size, task, optimiser, steps and seed)
# The two runs go side by side, one thread each (docs/PERFORMANCE.md has the training speed).
# Training logs stay in runs/train-<name>/ (train_log.jsonl, train.json); models/<name>/ gets what
# serving and sweeping need.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
mkdir -p runs models
names=(kv-chunked kv-full)
pids=()
for name in "${names[@]}"; do
  build/phasekv train --config "configs/train/$name.toml" --out "runs/train-$name" \
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
