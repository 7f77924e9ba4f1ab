#!/usr/bin/env bash
# Runs every analysis behind docs/EXPLANATION.md into runs/explain/ and regenerates the page.
# Subjects: the bundled kv pair (models/kv-*), its 2-KV-head twin (trained here with checkpoint
# snapshots, about 10 minutes on one thread), and the reproduction suite's runs W8S8, W8S8-4kv,
# W8S8-8kv and full-1kv (from `phasekv repro --suite configs/repro/study.toml --out
# runs/repro/study`; a run that is not there yet is skipped with a note). Every analysis is
# resumable, so a rerun only does what is missing.
# Usage: bash scripts/explain.sh [THREADS]   (PHASEKV=path/to/phasekv to use another binary)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${PHASEKV:-build/phasekv}
threads=${1:-2}
out=runs/explain
suite=runs/repro/study
mkdir -p "$out"
dirs=()
analyse() {  # analyse OUTDIR COMMAND ARGS...: run once (resumable) and list OUTDIR for the report
  local dir=$1
  shift
  "$bin" "$@" --out "$dir" --threads "$threads"
  dirs+=("$dir")
}

# The bundled kv pair (W4/S4, 1-token raw window) and its 2-KV-head twin.
twin=$out/kv-chunked-2kv
if [ ! -f "$twin/model.safetensors" ]; then
  PHASEKV=$bin bash scripts/train-snapshots.sh configs/explain/kv-chunked-2kv.toml "$twin" --force
fi
analyse $out/ko-kv-chunked knockout --model models/kv-chunked --examples 300
analyse $out/ko-kv-full knockout --model models/kv-full --stride 4 --examples 300
analyse $out/ko-kv-chunked-2kv knockout --model "$twin" --unit both --examples 300
analyse $out/gates-kv-chunked gates --model models/kv-chunked
analyse $out/gates-kv-chunked-2kv gates --model "$twin" --checkpoints "$twin/snapshots"
analyse $out/cycle-kv-chunked gate-cycle --model models/kv-chunked --delta all --examples 300
analyse $out/cycle-kv-chunked-L0 gate-cycle --model models/kv-chunked --delta all --layers 0 --examples 300
analyse $out/cycle-kv-chunked-L1 gate-cycle --model models/kv-chunked --delta all --layers 1 --examples 300
analyse $out/cycle-kv-chunked-2kv gate-cycle --model "$twin" --delta all --examples 300

# The reproduction suite's reference run, its KV-head variants and its control (16-token window).
have() {
  if [ -f "$suite/$1/train.done" ]; then return 0; fi
  echo "explain.sh: $suite/$1 has not finished training; its analyses are skipped" >&2
  return 1
}
if have W8S8; then
  analyse $out/ko-W8S8 knockout --model $suite/W8S8/model --stride 8 --examples 200
  analyse $out/gates-W8S8 gates --model $suite/W8S8/model
  analyse $out/cycle-W8S8 gate-cycle --model $suite/W8S8/model --delta all --examples 200
  analyse $out/cycle-W8S8-L1 gate-cycle --model $suite/W8S8/model --delta all --layers 1 --examples 200
fi
for kv in 4kv 8kv; do
  if have W8S8-$kv; then
    analyse $out/ko-W8S8-$kv knockout --model $suite/W8S8-$kv/model --unit both --stride 8 --examples 200
    analyse $out/gates-W8S8-$kv gates --model $suite/W8S8-$kv/model
  fi
done
if have full-1kv; then
  analyse $out/ko-full-1kv knockout --model $suite/full-1kv/model --stride 8 --examples 200
fi
if have full-8kv; then
  analyse $out/ko-full-8kv knockout --model $suite/full-8kv/model --unit both --stride 8 --examples 200
fi

"$bin" explain report "${dirs[@]}" --out docs/EXPLANATION.md --figures docs/explanation \
  --notes docs/explanation/notes.md
