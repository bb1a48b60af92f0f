#!/usr/bin/env bash
# The whole test suite: install dependencies, build, run every test through
# ctest, then fuzz the math verifier for a minute. Exits non-zero on any
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
# libFuzzer on the math verifier's untrusted-text path (a clang build of just
# that target), briefly; SLUICE_FUZZ_SECONDS=0 skips it, e.g. with a filter.
if (($# == 0)); then
  start=$(date +%s)
  ./scripts/fuzz.sh "${SLUICE_FUZZ_SECONDS:-60}"
  echo "test.sh: fuzzing took $(( $(date +%s) - start )) s"
fi
