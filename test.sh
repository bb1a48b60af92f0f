#!/usr/bin/env bash
# The whole test suite: install dependencies, build, run every test through
# ctest, then fuzz every parser of untrusted input briefly (scripts/fuzz.sh:
# 20 s per target, as many at once as there are cores). Exits non-zero on any
# failure. Arguments go to ctest (and skip the fuzzing).
set -euo pipefail
cd "$(dirname "$0")"
./scripts/install-deps.sh
start=$(date +%s)
./scripts/build.sh
echo "test.sh: build took $(( $(date +%s) - start )) s"
start=$(date +%s)
(cd "${SLUICE_BUILD_DIR:-build}" && ctest --output-on-failure -j "${SLUICE_TEST_JOBS:-2}" "$@")
echo "test.sh: tests took $(( $(date +%s) - start )) s"
# libFuzzer on every untrusted-input parser (a clang build of just the fuzz
# targets), briefly; SLUICE_FUZZ_SECONDS sets the seconds per target, 0 skips.
if (($# == 0)); then
  start=$(date +%s)
  ./scripts/fuzz.sh "${SLUICE_FUZZ_SECONDS:-20}"
  echo "test.sh: fuzzing took $(( $(date +%s) - start )) s"
fi
