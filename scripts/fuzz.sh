#!/usr/bin/env bash
# The sanitizer and fuzzing run (docs/RELIABILITY.md). In build-fuzz/, with clang:
#  1. phasekv_base (everything without libtorch: configs, tasks, results files, statistics,
#     reports, suites, the HTTP client's parsers), its unit tests and the libFuzzer targets of
#     fuzz/, all under AddressSanitizer + UndefinedBehaviorSanitizer;
#  2. ctest there: the sanitized unit tests and a replay of every seed corpus (fuzz/corpus/);
#  3. each target fuzzed for FUZZ_SECONDS (default 60). New corpus entries stay in
#     build-fuzz/corpus/; a crashing input is saved as build-fuzz/findings/TARGET-crash-* and the
#     script fails (add it to fuzz/corpus/TARGET once fixed: the replay keeps it checked).
# Usage: bash scripts/fuzz.sh                       (CI: FUZZ_SECONDS=60 FUZZ_PARALLEL=2)
#        FUZZ_SECONDS=1440 FUZZ_PARALLEL=2 bash scripts/fuzz.sh   (the long documented run)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${FUZZ_BUILD:-build-fuzz}
SECS=${FUZZ_SECONDS:-60}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$B" -G Ninja -DPHASEKV_BASE_ONLY=ON -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
cmake --build "$B" -j "$JOBS"
ctest --test-dir "$B" --output-on-failure -j "$JOBS"

targets=$(for f in fuzz/fuzz_*.cpp; do basename "$f" .cpp; done)  # as fuzz/CMakeLists.txt
mkdir -p "$B/findings"
rm -f "$B/failed"
touch "$B/run-start"  # the table below counts the findings saved after it
# One target: a libFuzzer process with its own log; a finding leaves the marker file $B/failed.
fuzz_one() {
  local t=$1
  mkdir -p "$B/corpus/$t"
  echo "== $t: ${SECS} s"
  if ! "$B/fuzz/$t" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$B/findings/$t-" "$B/corpus/$t" "fuzz/corpus/$t" > "$B/$t.log" 2>&1; then
    touch "$B/failed"
    tail -n 30 "$B/$t.log"
  fi
  grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb)' "$B/$t.log" |
    sed "s/^/$t: /" || true
}
# FUZZ_PARALLEL targets at a time (default 1): each is one single-threaded process, so a long
# run on an idle machine can give every core a target.
PAR=${FUZZ_PARALLEL:-1}
for t in $targets; do
  fuzz_one "$t" &
  while [ "$(jobs -rp | wc -l)" -ge "$PAR" ]; do wait -n || true; done
done
wait

# The run's figures per target, as docs/RELIABILITY.md tabulates them: libFuzzer's own counts at
# the end (inputs and seconds from "Done N runs in S second(s)", coverage and corpus entries
# from the last status line, stat::peak_rss_mb) and the crashing inputs saved. A target stopped
# by a finding has no "Done" line: its inputs are stat::number_of_executed_units.
echo "| target | inputs executed | seconds | per second | coverage (edges) | corpus entries | peak RSS | findings |"
echo "|---|---|---|---|---|---|---|---|"
for t in $targets; do
  found=$(find "$B/findings" -name "$t-*" -newer "$B/run-start" | wc -l)
  awk -v t="$t" -v found="$found" '
    / cov: / { for (i = 1; i <= NF; i++) { if ($i == "cov:") cov = $(i + 1); if ($i == "corp:") { split($(i + 1), c, "/"); corp = c[1] } } }
    /^Done [0-9]+ runs in [0-9]+ second/ { runs = $2; secs = $5 }
    /^stat::number_of_executed_units:/ { units = $2 }
    /^stat::peak_rss_mb:/ { rss = $2 }
    END {
      if (runs == "" && units == "") { printf "| `%s` | (no final stats: see %s.log) | | | | | | %d |\n", t, t, found; exit }
      if (runs == "") { printf "| `%s` | %d | stopped by a finding | | %s | %s | %s MB | %d |\n", t, units, cov, corp, rss, found; exit }
      printf "| `%s` | %d | %d | %d | %s | %s | %s MB | %d |\n", t, runs, secs, runs / (secs > 0 ? secs : 1), cov, corp, rss, found
    }' "$B/$t.log"
done
[ ! -e "$B/failed" ] || { echo "fuzz: findings in $B/findings/" >&2; exit 1; }
echo "fuzz: no findings ($(echo $targets | wc -w) targets x ${SECS} s, ${PAR} at a time)"
