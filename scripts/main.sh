#!/usr/bin/env bash
# The main job on the bundled default: a phase sweep (every logical example with its target key at
# every phase r = position mod 8) of the bundled chunked model and of its full-attention control,
# then both side by side. Outputs: runs/main/{kv-chunked,kv-full}/ (summary.json, phase.csv,
# phase.svg, report.html, results.jsonl) and runs/main/compare/. A rerun resumes finished sweeps.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
examples=${EXAMPLES:-300}
for name in kv-chunked kv-full; do
  echo "== $name: phase sweep, $examples logical examples x 8 phases"
  build/phasekv sweep --model "models/$name" --task kv --examples "$examples" --modulus 8 \
    --padding prefix --out "runs/main/$name"
  echo
done
build/phasekv compare runs/main/kv-chunked runs/main/kv-full --out runs/main/compare
echo
echo "reports: runs/main/kv-chunked/report.html runs/main/kv-full/report.html runs/main/compare/"
