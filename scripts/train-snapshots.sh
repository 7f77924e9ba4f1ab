#!/usr/bin/env bash
# Trains CONFIG into OUT and keeps a copy of every checkpoint it writes (OUT/snapshots/step-N,
# weights and state.json), for `phasekv gates --checkpoints OUT/snapshots`. The trainer keeps only
# its latest checkpoint; this polls it while training runs ([train] checkpoint_every sets how
# often one appears). Usage: bash scripts/train-snapshots.sh CONFIG OUT [phasekv train flags]
set -euo pipefail
config=$1 out=$2
shift 2
bin=${PHASEKV:-build/phasekv}
mkdir -p "$out/snapshots"
"$bin" train --config "$config" --out "$out" "$@" &
pid=$!
snapshot() {
  local state="$out/checkpoint/state.json" step tmp
  [ -f "$state" ] || return 0
  step=$(sed -n 's/.*"step":\([0-9]*\).*/\1/p' "$state" 2>/dev/null || true)
  [ -n "$step" ] && [ ! -d "$out/snapshots/step-$step" ] || return 0
  tmp="$out/snapshots/.step-$step"
  rm -rf "$tmp"
  # The checkpoint is replaced by a rename; a copy that raced with it is retried next poll.
  if cp -r "$out/checkpoint" "$tmp" 2>/dev/null &&
     grep -q "\"step\":$step[,}]" "$tmp/state.json" 2>/dev/null; then
    rm -f "$tmp/optimizer.pt"
    mv "$tmp" "$out/snapshots/step-$step"
  else
    rm -rf "$tmp"
  fi
}
while kill -0 "$pid" 2>/dev/null; do
  snapshot
  sleep 0.2
done
wait "$pid"
snapshot
ls "$out/snapshots"
