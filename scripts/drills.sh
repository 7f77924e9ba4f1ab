#!/usr/bin/env bash
# Failure drills (issue 20; docs/RELIABILITY.md has the measured outcomes):
#
#   bash scripts/drills.sh kill     kill -9 `phasekv sweep` and `phasekv train` at random points,
#                                   rerun them, and compare their final records and model with an
#                                   uninterrupted run (byte for byte)
#   bash scripts/drills.sh audit    kill -9 `phasekv audit --render ids` against `phasekv serve`
#                                   of models/kv-chunked at random points, rerun, compare records
#                                   (the text rendering needs a tokenizer that knows its words,
#                                   which no bundled model has: HardeningDrills.TextAudit... in
#                                   tests/test_hardening_drills.cpp kills it against a fake
#                                   llama-server, AuditResume.KilledTextAudit... in test_audit_resume.cpp
#                                   against phasekv serve of a random model over those words)
#   bash scripts/drills.sh repro    kill -9 a `phasekv repro` of scripts/drills/suite.toml and its
#                                   children (the process group, as a job scheduler or the OOM
#                                   killer of a cgroup does) at random times, rerun, compare every
#                                   run's model and records with an uninterrupted suite
#   bash scripts/drills.sh server   `phasekv serve` under 64 keep-alive clients, 40 stalled
#                                   clients and oversize bodies: /health must answer throughout;
#                                   then repeated large requests, with the server's RSS before
#                                   and after (scripts/drills_server.sh)
#   bash scripts/drills.sh all      all of them (about 5 minutes on 2 cores)
#
# Environment: PHASEKV (the binary, default build/phasekv), DRILL_KILLS (runs killed per drill,
# default 4), DRILL_SEED (the kill points, default 1), DRILL_LARGE (large requests, default 24).
# Exit 0 when every check held; 1 naming the first that did not.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PHASEKV:-build/phasekv}
KILLS=${DRILL_KILLS:-4}
RANDOM=${DRILL_SEED:-1}
WORK=$(mktemp -d /tmp/phasekv-drills.XXXXXX)
SERVE_PID=""
trap '[ -n "$SERVE_PID" ] && kill "$SERVE_PID" 2>/dev/null; rm -rf "$WORK"' EXIT
[ -x "$BIN" ] || { echo "drills: $BIN is not built (cmake --build build)" >&2; exit 2; }
# The drills run a copy: a rebuild while they run would replace the binary under them (exit 126
# while the linker writes it) or mix two versions' records.
cp "$BIN" "$WORK/phasekv"
BIN=$WORK/phasekv

fail() { echo "DRILL FAILED: $*" >&2; tail -n 20 "$WORK/log" >&2; exit 1; }
now_ms() { date +%s%3N; }

# Runs "$@" (after the first two arguments) in the background and kill -9s it, 0-50 ms after
# the file $1 has reached $2 lines (records written, log lines of steps done), so every kill
# lands mid-run; prints "killed" or "finished" (it ended first).
kill_at() {
  local file=$1 lines=$2 sent=0; shift 2
  "$@" >>"$WORK/log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$(lines_of "$file")" -ge "$lines" ]; then
      sleep "0.0$((RANDOM % 5))"
      kill -9 "$pid" 2>/dev/null && sent=1
      break
    fi
    sleep 0.01
  done
  local status=0
  wait "$pid" 2>/dev/null || status=$?
  if [ "$sent" = 1 ] && [ "$status" = 137 ]; then echo killed
  elif [ "$status" = 0 ]; then echo finished
  else echo "failed with exit status $status"; fi
}

lines_of() { { wc -l <"$1"; } 2>/dev/null || echo 0; }

# Two kill points in lines of a run of $1: one in the first half, one later.
kill_points() {
  local first=$(( 1 + RANDOM % ($1 / 2) ))
  echo "$first $(( first + 1 + RANDOM % ($1 - first - 1) ))"
}

# The drill of a command that streams records into OUT/results.jsonl and resumes them on a rerun
# (sweep, audit): $1 names it, the rest is the command without --out. One uninterrupted run, then
# DRILL_KILLS runs killed twice each at random numbers of records on disk and rerun to the end;
# their sorted records and phase.csv must equal the uninterrupted run's byte for byte.
drill_records() {
  local label=$1; shift
  local t0; t0=$(now_ms)
  "$@" --out "$WORK/$label-ref" >>"$WORK/log" 2>&1 || fail "reference $label"
  local took=$(( $(now_ms) - t0 ))
  local total; total=$(wc -l <"$WORK/$label-ref/results.jsonl")
  echo "$label: uninterrupted run $took ms, $total records"
  for i in $(seq 1 "$KILLS"); do
    local out="$WORK/$label-$i" kills=0 outcome at=""
    # Two kills at random points, then a run to the end.
    for point in $(kill_points "$total"); do
      outcome=$(kill_at "$out/results.jsonl" "$point" "$@" --out "$out")
      case "$outcome" in
        killed) kills=$((kills + 1)); at="$at $(lines_of "$out/results.jsonl")" ;;
        finished) ;;
        *) fail "$label $i: a run $outcome (see the log)" ;;
      esac
    done
    "$@" --out "$out" >>"$WORK/log" 2>&1 || fail "$label rerun $i (see the log)"
    local lines; lines=$(wc -l <"$out/results.jsonl")
    cmp -s <(sort "$out/results.jsonl") <(sort "$WORK/$label-ref/results.jsonl") ||
      fail "$label $i: records differ from the uninterrupted run"
    cmp -s "$out/phase.csv" "$WORK/$label-ref/phase.csv" || fail "$label $i: phase.csv differs"
    echo "$label $i: killed $kills times (records on disk then:${at:- none}), rerun: $lines records" \
      "identical, phase.csv identical"
  done
}

drill_sweep() {
  drill_records sweep "$BIN" sweep --model models/kv-chunked --task kv --examples 300 --modulus 8 \
    --padding prefix --threads 1 --batch 8 --bootstrap-reps 200 --permutations 100
}

drill_train() {
  sed -e 's/^steps = .*/steps = 300/' -e 's/^batch = .*/batch = 16/' -e 's/^log_every = .*/log_every = 10/' \
    -e 's/^checkpoint_every = .*/checkpoint_every = 25/' -e 's/^eval_every = .*/eval_every = 1000/' \
    -e 's/^eval_examples = .*/eval_examples = 64/' configs/train/kv-chunked.toml >"$WORK/tiny.toml"
  local t0; t0=$(now_ms)
  "$BIN" train --config "$WORK/tiny.toml" --out "$WORK/train-ref" >>"$WORK/log" 2>&1 ||
    fail "reference training"
  local took=$(( $(now_ms) - t0 ))
  local total; total=$(wc -l <"$WORK/train-ref/train_log.jsonl")
  echo "train: uninterrupted run $took ms (300 steps, a checkpoint every 25, $total log lines)"
  for i in $(seq 1 "$KILLS"); do
    local out="$WORK/train-$i" kills=0 outcome at=""
    for point in $(kill_points "$total"); do
      local resume=()
      [ -d "$out/checkpoint" ] && resume=(--resume)
      [ ${#resume[@]} -eq 0 ] && [ -e "$out" ] && resume=(--force)
      outcome=$(kill_at "$out/train_log.jsonl" "$point" "$BIN" train --config "$WORK/tiny.toml" \
                  --out "$out" "${resume[@]}")
      case "$outcome" in killed|finished) ;; *) fail "train $i: a run $outcome" ;; esac
      if [ "$outcome" = killed ]; then
        kills=$((kills + 1))
        at="$at $( (grep -o '"step":[0-9]*' "$out/checkpoint/state.json" 2>/dev/null || echo none) |
                   grep -o '[0-9]*$\|none')"
      fi
      [ "$outcome" = finished ] && [ -f "$out/model.safetensors" ] && break
    done
    if [ ! -f "$out/model.safetensors" ]; then
      local resume=(--force)
      [ -d "$out/checkpoint" ] && resume=(--resume)
      "$BIN" train --config "$WORK/tiny.toml" --out "$out" "${resume[@]}" >>"$WORK/log" 2>&1 ||
        fail "train rerun $i (see the log)"
    fi
    cmp -s "$out/model.safetensors" "$WORK/train-ref/model.safetensors" ||
      fail "train $i: model.safetensors differs from the uninterrupted run"
    echo "train $i: killed $kills times (checkpoint step then:${at:- none}), resumed:" \
      "model.safetensors identical"
  done
}

# Starts `phasekv serve --model $1` on a free port in the background; sets SERVE_PID and
# SERVE_URL. The drill's EXIT trap stops it.
start_server() {
  "$BIN" serve --model "$1" --port 0 --torch-threads 1 >"$WORK/serve.log" 2>&1 &
  SERVE_PID=$!
  SERVE_URL=""
  for _ in $(seq 1 200); do
    SERVE_URL=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$WORK/serve.log" | head -n 1) || true
    [ -n "$SERVE_URL" ] && return 0
    kill -0 "$SERVE_PID" 2>/dev/null || break
    sleep 0.05
  done
  cat "$WORK/serve.log" >&2
  fail "phasekv serve --model $1 did not start"
}

drill_audit() {
  start_server models/kv-chunked
  local name; name=$(curl -sf "$SERVE_URL/v1/models" | jq -r '.data[0].id')
  echo "audit: phasekv serve --model models/kv-chunked at $SERVE_URL"
  drill_records "audit-ids" "$BIN" audit --endpoint "$SERVE_URL" --model "$name" --render ids \
    --modulus 8 --examples 150 --concurrency 4 --bootstrap-reps 200 --permutations 100
  kill "$SERVE_PID"
  wait "$SERVE_PID" 2>/dev/null || true
  SERVE_PID=""
}

# The files of a suite's output that must not depend on kills: every run's final model, and every
# sweep's records (sorted: resumed runs append in another order) and phase.csv. Prints one line per
# file, "PATH HASH".
suite_outputs() {
  (cd "$1" && find . -path '*/checkpoint' -prune -o \( -name model.safetensors -o -name phase.csv \) \
     -print | sort | xargs sha256sum
   cd "$1" && find . -name results.jsonl | sort | while read -r f; do
     echo "$(sort "$f" | sha256sum | cut -d' ' -f1)  $f (sorted)"; done)
}

drill_repro() {
  local suite=scripts/drills/suite.toml
  local t0; t0=$(now_ms)
  "$BIN" repro --suite "$suite" --out "$WORK/repro-ref" --jobs 2 >>"$WORK/log" 2>&1 ||
    fail "reference suite"
  local took=$(( $(now_ms) - t0 ))
  suite_outputs "$WORK/repro-ref" >"$WORK/repro-ref.files"
  echo "repro: uninterrupted suite $took ms, $(wc -l <"$WORK/repro-ref.files") files compared"
  for i in $(seq 1 "$KILLS"); do
    local out="$WORK/repro-$i" at=""
    # Two kills of the whole process group (repro and the train/sweep children it runs) at random
    # times, the first within the first quarter of the uninterrupted run's duration (its training
    # takes about that), the second within all of it; then a run to the end.
    for part in 4 1; do
      local ms=$(( RANDOM * took / part / 32768 ))
      setsid "$BIN" repro --suite "$suite" --out "$out" --jobs 2 >>"$WORK/log" 2>&1 &
      local pid=$!
      sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
      local status=0
      kill -9 -- "-$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || status=$?
      # Killed children are zombies until init reaps them; anything else still runs.
      sleep 0.2
      ps -o stat= -g "$pid" | grep -qv '^Z' && fail "repro $i: processes of the killed group survive"
      case $status in
        137) local trained swept
             trained=$( { find "$out" -name train.done 2>/dev/null || true; } | wc -l)
             swept=$( { find "$out" -name summary.json 2>/dev/null || true; } | wc -l)
             at="$at $ms ms ($trained trained, $swept sweeps done);" ;;
        0) at="$at finished before $ms ms;" ;;
        *) fail "repro $i: a run failed with exit status $status (see the log)" ;;
      esac
    done
    "$BIN" repro --suite "$suite" --out "$out" --jobs 2 >>"$WORK/log" 2>&1 ||
      fail "repro rerun $i (see the log)"
    suite_outputs "$out" >"$WORK/repro-$i.files"
    diff "$WORK/repro-ref.files" "$WORK/repro-$i.files" >&2 ||
      fail "repro $i: models or records differ from the uninterrupted suite"
    echo "repro $i: killed at${at} rerun: every model, records and phase.csv identical"
  done
}

drill_server() {
  bash scripts/drills_server.sh --bin "$BIN" --model models/lookup-chunked \
    --large "${DRILL_LARGE:-24}" || fail "server drill"
}

case "${1:-all}" in
  kill) drill_sweep; drill_train ;;
  audit) drill_audit ;;
  repro) drill_repro ;;
  server) drill_server ;;
  all) drill_sweep; drill_train; drill_audit; drill_repro; drill_server ;;
  *) echo "usage: bash scripts/drills.sh [kill|audit|repro|server|all]" >&2; exit 2 ;;
esac
echo "drills: all checks held"
