#!/usr/bin/env bash
# Failure drills (issue 20; docs/RELIABILITY.md has the measured outcomes):
#
#   bash scripts/drills.sh kill     kill -9 `phasekv sweep` and `phasekv train` at random points,
#                                   rerun them, and compare their final records and model with an
#                                   uninterrupted run (byte for byte)
#   bash scripts/drills.sh server   `phasekv serve` under 64 keep-alive clients, 40 stalled
#                                   clients and oversize bodies: /health must answer throughout;
#                                   then repeated large requests, with the server's RSS before
#                                   and after (scripts/drills_server.sh)
#   bash scripts/drills.sh all      both (about 4 minutes on 2 cores)
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
trap 'rm -rf "$WORK"' EXIT
[ -x "$BIN" ] || { echo "drills: $BIN is not built (cmake --build build)" >&2; exit 2; }

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

drill_sweep() {
  local args=(sweep --model models/kv-chunked --task kv --examples 300 --modulus 8 --padding prefix
              --threads 1 --batch 8 --bootstrap-reps 200 --permutations 100)
  local t0; t0=$(now_ms)
  "$BIN" "${args[@]}" --out "$WORK/sweep-ref" >>"$WORK/log" 2>&1 || fail "reference sweep"
  local took=$(( $(now_ms) - t0 ))
  local total; total=$(wc -l <"$WORK/sweep-ref/results.jsonl")
  echo "sweep: uninterrupted run $took ms, $total records"
  for i in $(seq 1 "$KILLS"); do
    local out="$WORK/sweep-$i" kills=0 outcome at=""
    # Two kills at random points, then a run to the end.
    for point in $(kill_points "$total"); do
      outcome=$(kill_at "$out/results.jsonl" "$point" "$BIN" "${args[@]}" --out "$out")
      case "$outcome" in
        killed) kills=$((kills + 1)); at="$at $(lines_of "$out/results.jsonl")" ;;
        finished) ;;
        *) fail "sweep $i: a run $outcome (see the log)" ;;
      esac
    done
    "$BIN" "${args[@]}" --out "$out" >>"$WORK/log" 2>&1 || fail "sweep rerun $i (see the log)"
    local lines; lines=$(wc -l <"$out/results.jsonl")
    cmp -s <(sort "$out/results.jsonl") <(sort "$WORK/sweep-ref/results.jsonl") ||
      fail "sweep $i: records differ from the uninterrupted run"
    cmp -s "$out/phase.csv" "$WORK/sweep-ref/phase.csv" || fail "sweep $i: phase.csv differs"
    echo "sweep $i: killed $kills times (records on disk then:${at:- none}), rerun: $lines records" \
      "identical, phase.csv identical"
  done
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

drill_server() {
  bash scripts/drills_server.sh --bin "$BIN" --model models/lookup-chunked \
    --large "${DRILL_LARGE:-24}" || fail "server drill"
}

case "${1:-all}" in
  kill) drill_sweep; drill_train ;;
  server) drill_server ;;
  all) drill_sweep; drill_train; drill_server ;;
  *) echo "usage: bash scripts/drills.sh [kill|server|all]" >&2; exit 2 ;;
esac
echo "drills: all checks held"
