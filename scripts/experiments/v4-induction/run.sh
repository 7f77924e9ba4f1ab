#!/usr/bin/env bash
# Which parts of the DeepSeek-V4 block keep it from learning the induction warm-up at width 64
# (docs/DEEPSEEK-V4.md, "The V4 block learns induction slowly"). Each row trains 300 steps of the
# warm-up of configs/train/v4-induction.toml (seed 0, one thread) on a V4 reduced towards the dense
# model of the suite (2 window layers of 32 tokens, nothing compressed, full RoPE on 16-dim heads,
# q and output ranks 64, one routed expert and a shared one), re-initialised by init.py, with the
# ablations of ablation.patch switched by PHASEKV_V4X:
#   sepv     a separate value projection (wv, v_norm) instead of V = K, values not rotated
#   nohc     one residual stream instead of the four hyper-connection streams
#   vnorope  V = K's content, but the values not rotated (and no inverse RoPE on the output)
#   nosink   no attention sinks
# The ablations are not DeepSeek-V4 (llama.cpp cannot serve them); they live in a patch, not in
# src/v4. Build a phasekv with the patch, then run this script with it:
#   git apply scripts/experiments/v4-induction/ablation.patch && cmake --build build --target phasekv
#   cp build/phasekv /tmp/phasekv-ablation && git apply -R scripts/experiments/v4-induction/ablation.patch
#   bash scripts/experiments/v4-induction/run.sh /tmp/phasekv-ablation /tmp/v4-induction
# Prints one line per row: the training accuracy and loss at step 300 (the dense reference first).
set -euo pipefail
PK=$(realpath "$1")
OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
PY=/usr/bin/python3
mkdir -p "$OUT"
cd "$ROOT"

short() {  # the training toml, 300 warm-up steps, evaluation and checkpoints out of the way
  sed -e 's/^steps = .*/steps = 300/' -e 's/^induction_steps = .*/induction_steps = 300/' \
      -e 's/^eval_every = .*/eval_every = 1000/' -e 's/^checkpoint_every = .*/checkpoint_every = 1000/' \
      -e 's/^log_every = .*/log_every = 100/' "$1"
}
report() { echo "$1: $(tr '\r' '\n' < "$2" | grep -E 'step +300/300' | tail -1)"; }

# The dense reference: the suite's W8S8 block (configs/train/lookup-chunked.toml) without biases.
short configs/train/lookup-chunked.toml | sed 's/^qkv_bias = true/qkv_bias = false/' > "$OUT/dense.toml"
"$PK" train --config "$OUT/dense.toml" --out "$OUT/run-dense" --force > "$OUT/dense.log" 2>&1
report "dense W8S8, no qkv bias" "$OUT/dense.log"

$PY - "$ROOT/configs/v4/lookup-topk-all.json" "$OUT/near.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(num_hidden_layers=2, compress_ratios=[0, 0], sliding_window=32, qk_rope_head_dim=16,
         q_lora_rank=64, o_groups=1, o_lora_rank=64, n_routed_experts=1, num_experts_per_tok=1,
         num_hash_layers=0)
json.dump(c, open(sys.argv[2], "w"), indent=1)
PYEOF

# name | PHASEKV_V4X | init mode ("" = phasekv's init_random)
while IFS='|' read -r name flags mode; do
  [ -z "$name" ] && continue
  dir="$OUT/$name"
  PHASEKV_V4X=$flags "$PK" init --config "$OUT/near.json" --out "$dir-init" --seed 0 --force > /dev/null
  init=$dir-init
  if [ -n "$mode" ]; then $PY "$HERE/init.py" "$dir-init" "$dir-init-$mode" "$mode" 2; init=$dir-init-$mode; fi
  short configs/train/v4-induction.toml | sed -e "s#^config = .*#config = \"$OUT/near.json\"#" \
      -e "s#^\[train\]#[train]\ninit_from = \"$init\"#" > "$dir.toml"
  PHASEKV_V4X=$flags "$PK" train --config "$dir.toml" --out "$dir-run" --force > "$dir.log" 2>&1
  report "$name" "$dir.log"
done <<'ROWS'
v4|none|
v4-dense-init||dense
v4-hc01||dense-hc01
nohc|nohc|dense
nohc-vnorope|nohc,vnorope|dense
sepv|sepv|dense
sepv-hc01|sepv|dense-hc01
sepv-nohc|sepv,nohc|dense
sepv-nohc-nosink|sepv,nohc,nosink|dense
ROWS
