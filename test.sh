#!/usr/bin/env bash
# The whole test suite: install dependencies, build, run every test through
# ctest. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")"
./scripts/install-deps.sh
start=$(date +%s)
./scripts/build.sh
echo "test.sh: build took $(( $(date +%s) - start )) s"
start=$(date +%s)
cd "${SLUICE_BUILD_DIR:-build}"
ctest --output-on-failure -j "${SLUICE_TEST_JOBS:-2}" "$@"
echo "test.sh: tests took $(( $(date +%s) - start )) s"
