#!/usr/bin/env bash
# The inference-time mitigations of docs/MITIGATIONS.md, measured on the bundled lookup pair:
#  1. phase sweeps at the README's main settings (100 examples x 24 phases) under prefix and
#     in-sequence padding: plain (baseline), phase ensembling K = 2, 4, 8, a recent copy of the
#     target record. The full-attention control has no stride, so it gets --stride 8: the chunked
#     model's interior/boundary split and the same ensemble shifts;
#  2. the KV-cache bytes per token at 4K and 128K tokens, from `phasekv info`;
#  3. the time per item: the same settings on 20 examples, one thread, repeated 3 times in turn
#     (the fastest repeat counts: this machine is shared, and a busy core only adds time).
# Ends with the markdown tables of docs/MITIGATIONS.md, read from the summary.json files.
# Usage: bash scripts/mitigations.sh [OUT]   (default runs/mitigations; a rerun resumes the sweeps)
#        BUILD=0 skips the build (when build/ is current).
#
# Second mode, issue 19's comparison on the reproduction suite's reference geometry:
#        bash scripts/mitigations.sh study [SUITE_DIR] [OUT] [CANDIDATES_DIR]
# (defaults runs/repro/study, runs/mitigations-study and runs/repro/mitigations: the candidate
# suite configs/repro/mitigations.toml, trained by `phasekv repro --suite
# configs/repro/mitigations.toml --out runs/repro/mitigations`; left out when it does not exist). `phasekv mitigations commands` lists
# the inference sweeps still missing (ensemble 2, 4, 8 and recent copy on the suite's W8S8 under
# every padding with the suite's modulus, examples and seed; REPEATS timing rounds; the same
# settings on W8S8's other seeds), each at --threads 1; they run one after another (a finished
# sweep is not listed again, an interrupted one resumes). Then `phasekv mitigations report`
# rewrites docs/MITIGATIONS.md's generated section and docs/mitigations/pareto.svg from the
# suite's runs and these sweeps.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/mitigations}
EXAMPLES=${EXAMPLES:-100}
REPEATS=${REPEATS:-3}
[ "${BUILD:-1}" = 0 ] || bash scripts/build.sh

if [ "${1:-}" = study ]; then
  SUITE=${2:-runs/repro/study}
  STUDY_OUT=${3:-runs/mitigations-study}
  CANDIDATES=${4:-runs/repro/mitigations}
  extra=()
  [ -f "$CANDIDATES/suite.json" ] && extra=(--candidates "$CANDIDATES")
  missing=$(build/phasekv mitigations commands --suite "$SUITE" --inference "$STUDY_OUT" \
    --repeats "$REPEATS")
  while IFS= read -r cmd; do
    [ -n "$cmd" ] || continue
    echo "== ${cmd##* --out }"
    eval "$cmd" | tail -n 1
  done <<< "$missing"
  build/phasekv mitigations report --suite "$SUITE" --inference "$STUDY_OUT" "${extra[@]}" \
    --out docs/MITIGATIONS.md --svg docs/mitigations/pareto.svg
  exit 0
fi

MODELS=(lookup-chunked lookup-full)
SETTINGS=(baseline ensemble2 ensemble4 ensemble8 recent-copy)

# sweep MODEL PADDING SETTING OUT [more flags]
sweep() {
  local model=$1 padding=$2 setting=$3 out=$4
  shift 4
  local extra=()
  case $setting in
    baseline) ;;
    ensemble*) extra=(--ensemble "${setting#ensemble}") ;;
    recent-copy) extra=(--recent-copy) ;;
  esac
  [ "$model" = lookup-full ] && extra+=(--stride 8)
  build/phasekv sweep --model "models/$model" --task lookup --modulus 24 --padding "$padding" \
    "${extra[@]}" --out "$out" "$@"
}

for model in "${MODELS[@]}"; do
  for padding in prefix in_sequence; do
    for setting in "${SETTINGS[@]}"; do
      echo "== $model $padding $setting"
      sweep "$model" "$padding" "$setting" "$OUT/$model/$padding/$setting" \
        --examples "$EXAMPLES" | tail -n 4
    done
  done
done

for model in "${MODELS[@]}"; do
  for T in 4096 131072; do
    total=$(build/phasekv info --model "models/$model" --context "$T" | awk '$1 == "total" {print $2}')
    echo "$model $T $total" >> "$OUT/cache_bytes.txt.new"
  done
done
mv "$OUT/cache_bytes.txt.new" "$OUT/cache_bytes.txt"

for rep in $(seq 1 "$REPEATS"); do
  for model in "${MODELS[@]}"; do
    for setting in "${SETTINGS[@]}"; do
      dir="$OUT/timing/$rep/$model/$setting"
      [ -f "$dir/summary.json" ] && continue
      echo "== timing $rep $model $setting"
      sweep "$model" prefix "$setting" "$dir" --examples 20 --threads 1 \
        --bootstrap-reps 0 --permutations 0 > /dev/null 2>&1
    done
  done
done

python3 - "$OUT" "$REPEATS" <<'EOF'
import json, sys, pathlib
out, repeats = pathlib.Path(sys.argv[1]), int(sys.argv[2])
models = ["lookup-chunked", "lookup-full"]
settings = ["baseline", "ensemble2", "ensemble4", "ensemble8", "recent-copy"]
load = lambda p: json.loads(p.read_text())

print("| model | padding | setting | mean | worst phase (r) | gap pp [95% CI] "
      "| interior gap pp [95% CI] | period (p) |")
print("|---|---|---|---|---|---|---|---|")
for model in models:
    for padding in ["prefix", "in_sequence"]:
        for setting in settings:
            s = load(out / model / padding / setting / "summary.json")
            gap, inner, period = s["gap_ci_pp"], s["interior"], s["period"]
            sig = period["p_value"] < 0.05
            print(f"| {model} | {padding} | {setting} | {s['mean_acc']:.3f} | "
                  f"{s['worst_acc']:.3f} ({s['worst_phase']}) | "
                  f"{s['gap_pp']:.1f} [{gap[0]:.1f}, {gap[1]:.1f}] | "
                  f"{inner['gap_pp']:.1f} [{inner['gap_ci_pp'][0]:.1f}, {inner['gap_ci_pp'][1]:.1f}] | "
                  f"{period['detected'] if sig else 'none'} ({period['p_value']:.3f}) |")

print()
print("| model | KV-cache bytes per token at 4K | at 128K |")
print("|---|---|---|")
bytes_at = {}
for line in (out / "cache_bytes.txt").read_text().split("\n"):
    if line:
        model, T, total = line.split()
        bytes_at[(model, int(T))] = int(total) / int(T)
for model in models:
    print(f"| {model} | {bytes_at[(model, 4096)]:.2f} | {bytes_at[(model, 131072)]:.2f} |")

print()
print("| model | setting | forwards per item | context tokens | ms per item, fastest of "
      f"{repeats} | x baseline |")
print("|---|---|---|---|---|---|")
for model in models:
    base = None
    for setting in settings:
        ms = []
        for rep in range(1, repeats + 1):
            s = load(out / "timing" / str(rep) / model / setting / "summary.json")
            rec, sweep = s["meta"]["records"], s["meta"]["sweep"]
            ms.append(1000 * rec["scoring_seconds"] / rec["scored_this_run"])
        first = json.loads((out / "timing" / "1" / model / setting / "results.jsonl")
                           .open().readline())
        shifts = sweep["ensemble_shifts"]
        tokens = "/".join(str(first["query_pos"] + 1 + k) for k in shifts)
        base = base or min(ms)
        print(f"| {model} | {setting} | {len(shifts)} | {tokens} | {min(ms):.2f} | "
              f"{min(ms) / base:.1f} |")
EOF
