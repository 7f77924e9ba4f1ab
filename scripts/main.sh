#!/usr/bin/env bash
# The main job on the bundled default: phase sweeps (every logical example with its target key at
# every phase r = position mod M) of the bundled chunked models and their full-attention controls,
# each pair then side by side:
#   lookup-chunked / lookup-full  the study's geometry (16-token raw window, W8/S8): interior-phase
#                                 weak spots; 100 examples x 24 phases
#   kv-chunked / kv-full          a boundary-phase toy (S = 4, raw window 1 token); 300 x 8 phases
# Outputs: runs/main/<model>/ (summary.json, phase.csv, phase.svg, report.html, results.jsonl) and
# runs/main/compare-<pair>/. A rerun resumes finished sweeps.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh --run  # only what the sweeps need: no test tools, no test binaries
sweep_pair() {  # pair task examples modulus
  local pair=$1 task=$2 examples=$3 modulus=$4
  for name in "$pair-chunked" "$pair-full"; do
    echo "== $name: phase sweep, $examples logical examples x $modulus phases"
    build/phasekv sweep --model "models/$name" --task "$task" --examples "$examples" \
      --modulus "$modulus" --padding prefix --out "runs/main/$name"
    echo
  done
  build/phasekv compare "runs/main/$pair-chunked" "runs/main/$pair-full" --out "runs/main/compare-$pair"
  echo
}
sweep_pair lookup lookup "${EXAMPLES_LOOKUP:-100}" 24
sweep_pair kv kv "${EXAMPLES:-300}" 8
echo "reports: runs/main/{lookup,kv}-{chunked,full}/report.html runs/main/compare-{lookup,kv}/"
