#!/usr/bin/env bash
# The whole test suite, libtorch-linked code included, under AddressSanitizer +
# UndefinedBehaviorSanitizer (issue 20; docs/RELIABILITY.md). scripts/fuzz.sh covers the torch-free
# library in CI; this is the longer documented run of everything else, not part of CI.
#
# In build-asan/ (git-ignored: build-*/), with the main build's compiler and Debian's libtorch,
# which is not instrumented itself: ASan sees every access phasekv's own code makes, into
# libtorch's tensors included, and UBSan checks phasekv's code. vptr checks are off: they compare
# type_info across the uninstrumented libtorch libraries. Leak checking is off by default
# (ASAN_OPTIONS overrides it): the torch-free library is leak-checked by scripts/fuzz.sh.
#
# Usage: nice -n 19 bash scripts/sanitize-all.sh            (build and run, JOBS=1 by default)
#        CONFIGURE_ONLY=1 bash scripts/sanitize-all.sh      (only configure build-asan/)
# Environment: ASAN_BUILD (default build-asan), JOBS (default 1), CTEST_ARGS (extra ctest
# arguments, e.g. "-R Safetensors"). The browser and OpenAI-client tests are left out (they need
# chromium and node, and test HTML and the wire protocol rather than memory).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${ASAN_BUILD:-build-asan}
JOBS=${JOBS:-1}
SAN="-fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=all -fno-omit-frame-pointer"
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="$SAN" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" > /dev/null
echo "sanitize-all: configured $B"
[ "${CONFIGURE_ONLY:-0}" = 1 ] && exit 0
cmake --build "$B" -j "$JOBS" --target phasekv phasekv_tests phasekv_tokenizer_tests
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# shellcheck disable=SC2086 # CTEST_ARGS is a list of arguments
# (-E: the browser tests' placeholder entry, which carries no label, since they are not built.)
ctest --test-dir "$B" -LE 'browser|openai' -E '^phasekv_browser_tests' -j "$JOBS" \
  --output-on-failure ${CTEST_ARGS:-}
echo "sanitize-all: every test passed under ASan + UBSan"
