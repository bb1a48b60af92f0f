#!/usr/bin/env bash
# Fuzzes the math verifier's answer extraction, normalisation, parsing and
# comparison with libFuzzer (AddressSanitizer + UndefinedBehaviorSanitizer)
# for a while, starting from the checked-in corpus and Math-Verify's cases.
#
#   scripts/fuzz.sh [SECONDS]     default 60; 0 skips
#
# Builds only the fuzz target and what it links, with clang, in build-fuzz/
# (ccache keeps rebuilds quick). A crash, leak, sanitizer report or timeout
# exits non-zero and leaves the reproducer in build-fuzz/artifacts/; add it to
# reward_server/fuzz/corpus/ once fixed so that ctest's MathFuzzReplay keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-${SLUICE_FUZZ_SECONDS:-60}}
if [[ $seconds == 0 ]]; then
  echo "fuzz.sh: skipped (0 seconds)"
  exit 0
fi
./scripts/install-deps.sh
build=${SLUICE_FUZZ_BUILD_DIR:-build-fuzz}
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -g -O1"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" \
  -DCMAKE_CXX_FLAGS="$flags" -DSLUICE_FUZZ=ON -DSLUICE_BUILD_TESTS=OFF >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
ninja -C "$build" math_fuzz
corpus="$build/corpus"
mkdir -p "$corpus" "$build/artifacts"
cp reward_server/fuzz/corpus/* "$corpus/"
# Seeds: every gold and prediction of Math-Verify's cases, one file each.
/usr/bin/python3 - "$corpus" <<'PY'
import json, sys, hashlib, os
out = sys.argv[1]
for line in open("testdata/math_verify/cases.jsonl", encoding="utf-8"):
    row = json.loads(line)
    for text in (row["gold"], row["prediction"], row["gold"] + "\0" + row["prediction"]):
        data = text.encode("utf-8")
        with open(os.path.join(out, hashlib.sha1(data).hexdigest()), "wb") as f:
            f.write(data)
PY
echo "fuzz.sh: fuzzing for ${seconds} s from $(ls "$corpus" | wc -l) seeds"
status=0
ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS="suppressions=$PWD/reward_server/fuzz/lsan.supp" \
  "$build/bin/math_fuzz" "$corpus" \
  -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
  -artifact_prefix="$build/artifacts/" -print_final_stats=1 >"$build/fuzz.log" 2>&1 || status=$?
tail -25 "$build/fuzz.log"
if [[ $status != 0 ]]; then
  echo "fuzz.sh: the fuzzer found a problem (exit $status); reproducer in $build/artifacts/" >&2
  exit "$status"
fi
echo "fuzz.sh: no crash in ${seconds} s"
