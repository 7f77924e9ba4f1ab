#!/usr/bin/env bash
# The sanitizer and fuzzing run (docs/RELIABILITY.md). In build-fuzz/, with clang:
#  1. phasekv_base (everything without libtorch: configs, tasks, results files, statistics,
#     reports, suites, the HTTP client's parsers), its unit tests and the libFuzzer targets of
#     fuzz/, all under AddressSanitizer + UndefinedBehaviorSanitizer;
#  2. ctest there: the sanitized unit tests and a replay of every seed corpus (fuzz/corpus/);
#  3. each target fuzzed for FUZZ_SECONDS (default 60). New corpus entries stay in
#     build-fuzz/corpus/; a crashing input is saved as build-fuzz/findings/TARGET-crash-* and the
#     script fails (add it to fuzz/corpus/TARGET once fixed: the replay keeps it checked).
# Usage: bash scripts/fuzz.sh                       (CI: FUZZ_SECONDS=30)
#        FUZZ_SECONDS=3600 bash scripts/fuzz.sh     (the long documented run)
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
failed=0
for t in $targets; do
  mkdir -p "$B/corpus/$t"
  echo "== $t: ${SECS} s"
  if ! "$B/fuzz/$t" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$B/findings/$t-" "$B/corpus/$t" "fuzz/corpus/$t" > "$B/$t.log" 2>&1; then
    failed=1
    tail -n 30 "$B/$t.log"
  fi
  grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb)' "$B/$t.log" || true
done
[ "$failed" = 0 ] || { echo "fuzz: findings in $B/findings/" >&2; exit 1; }
echo "fuzz: no findings ($(echo $targets | wc -w) targets x ${SECS} s)"
