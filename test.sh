#!/usr/bin/env bash
# The whole test suite: install dependencies, build, run every test through
# ctest, then fuzz every parser of untrusted input briefly (scripts/fuzz.sh:
# 20 s per target, as many at once as there are cores). Exits non-zero on any
# failure. Arguments go to ctest (and skip the fuzzing).
#
# At the end (also after a failure) it prints how long each phase took and
# the 15 slowest tests (scripts/ctest_report.py reads ctest's JUnit file,
# <build>/ctest-junit.xml). With SLUICE_REQUIRE_ALL_TESTS_RUN=1 (.ci/run sets
# it) a test that ctest did not run (skipped, disabled, not run) fails the
# suite, as a failed test does: only tests that need a GPU may stay unrun, and
# only on a machine without one.
set -euo pipefail
cd "$(dirname "$0")"
build_dir=${SLUICE_BUILD_DIR:-build}
junit="$build_dir/ctest-junit.xml"

phases=()
phase=""
phase_start=0
begin_phase() { phase=$1; phase_start=$(date +%s); }
end_phase() {
  phases+=("$(printf '%-8s %5d s%s' "$phase" $(($(date +%s) - phase_start)) "${1:-}")")
  phase=""
}
summary() {
  local status=$?
  [[ -z $phase ]] || end_phase "  (did not finish)"
  echo
  echo "test.sh: time by phase"
  local line
  for line in "${phases[@]}"; do echo "  $line"; done
  if [[ -f $junit ]]; then
    /usr/bin/python3 scripts/ctest_report.py --slowest 15 "$junit" || true
  fi
  exit "$status"
}
trap summary EXIT

begin_phase install
./scripts/install-deps.sh
end_phase

begin_phase build
./scripts/build.sh
end_phase

begin_phase tests
rm -f "$junit"
tests_status=0
(cd "$build_dir" && ctest --output-on-failure -j "${SLUICE_TEST_JOBS:-2}" \
   --output-junit "$(basename "$junit")" "$@") || tests_status=$?
end_phase
if [[ ${SLUICE_REQUIRE_ALL_TESTS_RUN:-0} == 1 ]]; then
  # Skipped or not run counts as failed here: a test that cannot run must
  # say so by failing, not pass silently.
  /usr/bin/python3 scripts/ctest_report.py --require-all-run "$junit" || tests_status=1
fi
((tests_status == 0)) || exit "$tests_status"

# libFuzzer on every untrusted-input parser (a clang build of just the fuzz
# targets), briefly; SLUICE_FUZZ_SECONDS sets the seconds per target, 0 skips.
if (($# == 0)); then
  begin_phase fuzz
  ./scripts/fuzz.sh "${SLUICE_FUZZ_SECONDS:-20}"
  end_phase
fi
