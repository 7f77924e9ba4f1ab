#!/usr/bin/env bash
# Does bf16 training reach the f32 loss? Trains configs/train/kv-chunked.toml (or CONFIG) once per
# seed and precision, same run length, then compares the final losses (mean of the last logged
# window of train_log.jsonl) seed by seed.
#   SEEDS="0 1 2 3 4" bash bench/bf16_loss.sh      results in ${OUT:-/tmp/phasekv-bf16}/
# Runs already finished in OUT are kept (the script can be stopped and restarted). Writes
# OUT/bf16_loss.csv (one row per seed) and OUT/bf16_loss.json (the summary printed at the end).
# A run that passes through a sharp learning transition lands at losses that differ by ~20 %
# from seed to seed, so the comparison is paired by seed and needs several seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
PHASEKV=${PHASEKV:-build-perf/phasekv}
CONFIG=${CONFIG:-configs/train/kv-chunked.toml}
OUT=${OUT:-/tmp/phasekv-bf16}
SEEDS=${SEEDS:-0 1 2 3 4}
STEPS_ARG=()
[ -n "${STEPS:-}" ] && STEPS_ARG=(--steps "$STEPS")
mkdir -p "$OUT"
for seed in $SEEDS; do
  for prec in f32 bf16; do
    run="$OUT/out-$seed-$prec"
    [ -f "$run/train.json" ] && continue
    sed -e "s/^seed = .*/seed = $seed/" -e "s/^\[train\]$/[train]\nprecision = \"$prec\"/" \
      "$CONFIG" > "$OUT/cfg-$seed-$prec.toml"
    echo "== seed $seed, $prec"
    "$PHASEKV" train --config "$OUT/cfg-$seed-$prec.toml" --out "$run" "${STEPS_ARG[@]}" \
      2>&1 | tail -n 2
  done
done
python3 - "$OUT" $SEEDS <<'PY'
import json, math, os, statistics as st, sys
out, seeds = sys.argv[1], [int(s) for s in sys.argv[2:]]
# One-sided 95 % Student t quantiles by degrees of freedom (scipy is not a dependency).
T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833,
       10: 1.812, 15: 1.753, 20: 1.725, 30: 1.697}
def final(seed, prec):
    with open(f"{out}/out-{seed}-{prec}/train_log.jsonl") as f:
        return json.loads(f.read().strip().splitlines()[-1])
def write_atomic(path, text):  # a reader never sees half a file
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
rows, csv_lines = [], ["seed,steps,f32_loss,bf16_loss,ratio,f32_eval_acc,bf16_eval_acc\n"]
for s in seeds:
    a, b = final(s, "f32"), final(s, "bf16")
    r = b["loss"] / a["loss"]
    rows.append(r)
    csv_lines.append(f"{s},{a['step']},{a['loss']:.6f},{b['loss']:.6f},{r:.6f},"
                     f"{a.get('eval_acc', '')},{b.get('eval_acc', '')}\n")
    print(f"seed {s}: f32 {a['loss']:.4f}  bf16 {b['loss']:.4f}  bf16/f32 {r:.4f}")
n = len(rows)
summary = {"seeds": seeds, "mean_ratio": st.mean(rows)}
if n > 1:
    se = st.stdev(rows) / math.sqrt(n)
    t = T95[max(k for k in T95 if k <= n - 1)]
    summary.update(sd_ratio=st.stdev(rows), upper95_ratio=st.mean(rows) + t * se)
    print(f"bf16/f32 final loss over {n} seeds: mean {summary['mean_ratio']:.4f}, "
          f"sd {summary['sd_ratio']:.4f}, one-sided 95 % upper bound {summary['upper95_ratio']:.4f}"
          f" ({'within' if summary['upper95_ratio'] <= 1.02 else 'NOT shown within'} 2 %)")
write_atomic(f"{out}/bf16_loss.csv", "".join(csv_lines))
write_atomic(f"{out}/bf16_loss.json", json.dumps(summary, indent=2) + "\n")
PY
