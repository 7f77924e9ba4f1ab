#!/usr/bin/env bash
# Retrains the bundled models in models/ from their configs in configs/train/, a pair at a time
# (the two runs of a pair side by side, one thread each; docs/PERFORMANCE.md has the speed):
#   models/lookup-chunked  the study's geometry: lookup task, 16-token raw window, W8/S8, per-slot
#                          payload maps, 1 KV head (the reproduction suite's run W8S8)
#   models/lookup-full     its full-attention control (the suite's run full-1kv)
#   models/kv-chunked      a boundary-phase toy: S = W = 4, scalar gates, raw window 1 token
#   models/kv-full         its full-attention control
#   models/code-chunked    a code model: next-token loss on the Python standard library, W8/S4,
#                          per-slot payload maps, 16-token raw window (docs/PROBE.md)
#   models/code-full       its full-attention control
#   models/v4-lookup       a DeepSeek-V4 (src/v4) on the lookup task, in two stages: the induction
#                          warm-up (configs/train/v4-induction.toml -> runs/v4-induction), then
#                          the task (configs/train/v4-lookup.toml, which starts from it); the
#                          model llama.cpp's deepseek4 serves in scripts/interop-llamacpp.sh
# Training logs stay in runs/train-<name>/ (train_log.jsonl, train.json); models/<name>/ gets what
# serving and sweeping need. Pass pair names to retrain only those: lookup, kv, code, v4 (v4 is
# not in the default set: on one thread of the Intel Xeon with AMX-BF16, shared, stage 1 took about
# 27 minutes and 2,500 of stage 2's 3,000 steps 102 minutes).
# RESUME=1 continues runs/train-<name> from its checkpoint instead of training afresh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
mkdir -p runs models
pairs=("$@")
[ ${#pairs[@]} -gt 0 ] || pairs=(lookup kv code)
start=--force
[ "${RESUME:-0}" = 1 ] && start=--resume
# The V4 model: two stages one after the other (stage 2's init_from names runs/v4-induction).
train_v4() {
  for stage in v4-induction v4-lookup; do
    [ "$start" = --resume ] || : > "runs/$stage.log"
    build/phasekv train --config "configs/train/$stage.toml" --out "runs/$stage" $start \
      >> "runs/$stage.log" 2>&1 || { echo "training $stage failed; see runs/$stage.log" >&2; exit 1; }
  done
  rm -rf models/.v4-lookup.tmp && mkdir -p models/.v4-lookup.tmp
  cp runs/v4-lookup/{config.json,model.safetensors,task.json,tokenizer.json,train.json} \
    models/.v4-lookup.tmp/
  rm -rf models/v4-lookup && mv models/.v4-lookup.tmp models/v4-lookup
  tail -n 1 runs/v4-lookup.log
}
for pair in "${pairs[@]}"; do
  case "$pair" in
    lookup | kv | code) ;;
    v4) train_v4; continue ;;
    *) echo "train-bundled.sh: unknown pair '$pair' (allowed: lookup, kv, code, v4)" >&2; exit 2 ;;
  esac
  names=("$pair-chunked" "$pair-full")
  pids=()
  for name in "${names[@]}"; do
    [ "$start" = --resume ] || : > "runs/train-$name.log"
    build/phasekv train --config "configs/train/$name.toml" --out "runs/train-$name" $start \
      >> "runs/train-$name.log" 2>&1 &
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
    cp "runs/train-$name"/{config.json,model.safetensors,tokenizer.json,train.json} "$tmp/"
    # A task model carries its task; a corpus model its sentencepiece model instead.
    for extra in task.json tokenizer.model; do
      [ ! -f "runs/train-$name/$extra" ] || cp "runs/train-$name/$extra" "$tmp/"
    done
    rm -rf "models/$name" && mv "$tmp" "models/$name"
    tail -n 1 "runs/train-$name.log"
  done
done
