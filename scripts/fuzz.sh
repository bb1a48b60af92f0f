#!/usr/bin/env bash
# Fuzzes every parser of untrusted input with libFuzzer (AddressSanitizer +
# UndefinedBehaviorSanitizer), each target starting from its checked-in corpus
# and what earlier runs of this script found (kept in build-fuzz/corpus/).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#     SECONDS   per target; default 20 (or $SLUICE_FUZZ_SECONDS); 0 skips
#     TARGET    default all; targets run in parallel, $SLUICE_FUZZ_JOBS at a
#               time (default: the number of cores), so the fuzzing takes
#               about SECONDS * ceil(targets / jobs)
#
#   scripts/fuzz.sh 20               what ./test.sh runs: every target, 20 s each
#   scripts/fuzz.sh 600 run_spec     one target for ten minutes
#   scripts/fuzz.sh 300 dataset safetensors
#
# The targets, each <name>_fuzz_target.cc in its component's fuzz/ folder
# with its seed corpus beside it in fuzz/corpus/<name>/ (sluice_fuzz_target in
# cmake/SluiceHelpers.cmake builds them, and ctest's <Name>FuzzReplay replays
# the corpus in every build):
#   math           reward_server: a model's answer against a reference
#   run_spec       controller: YAML run specs and binary
#                  SubmitRunRequests through SubmitRun's validation
#   dataset        common/task: dataset files (JSONL, GSM8K, MATH, HumanEval, gzip)
#   safetensors    common/model: safetensors files and sharded indexes
#   model_config   common/model: Hugging Face config.json
#   tokenizer      common/tokenizer: tokenizer.json, then encoding with it
#   insert_groups  replay_buffer: InsertGroupsRequest, validated and inserted
#   message_bounds services/runtime: any request's bytes, bounded before parsing
#
# Builds only the fuzz binaries and what they link, with clang, in build-fuzz/
# (ccache keeps rebuilds quick). A crash, leak, sanitizer report, timeout
# (-timeout) or memory blow-up (-rss_limit_mb) exits non-zero and leaves the
# reproducer in build-fuzz/artifacts/<name>/; once the parser is fixed, add
# it to <component>/fuzz/corpus/<name>/ so that the replay test keeps it.
# Each target's log is build-fuzz/logs/<name>.log; the summary gives its
# executions, executions per second, coverage (cov: edges, ft: features) and
# corpus size.
set -euo pipefail
cd "$(dirname "$0")/.."

# name -> seed corpus and -max_len (bytes; above the largest seed, small
# enough that an input is quick to run).
declare -A corpus_of=(
  [math]=reward_server/fuzz/corpus/math
  [run_spec]=controller/fuzz/corpus/run_spec
  [dataset]=common/task/fuzz/corpus/dataset
  [safetensors]=common/model/fuzz/corpus/safetensors
  [model_config]=common/model/fuzz/corpus/model_config
  [tokenizer]=common/tokenizer/fuzz/corpus/tokenizer
  [insert_groups]=replay_buffer/fuzz/corpus/insert_groups
  [message_bounds]=services/runtime/fuzz/corpus/message_bounds
)
declare -A max_len_of=(
  [math]=4096 [run_spec]=4096 [dataset]=8192 [safetensors]=4096 [model_config]=4096
  [tokenizer]=16384 [insert_groups]=8192 [message_bounds]=8192
)
all_targets=(math run_spec dataset safetensors model_config tokenizer insert_groups message_bounds)

seconds=${1:-${SLUICE_FUZZ_SECONDS:-20}}
shift || true
targets=("$@")
((${#targets[@]})) || targets=("${all_targets[@]}")
for target in "${targets[@]}"; do
  if [[ -z ${corpus_of[$target]:-} ]]; then
    echo "fuzz.sh: unknown target '$target'; targets: ${all_targets[*]}" >&2
    exit 2
  fi
done
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
build_start=$(date +%s)
ninja -C "$build" "${targets[@]/%/_fuzz}"
echo "fuzz.sh: built the fuzz targets in $(($(date +%s) - build_start)) s"

mkdir -p "$build/logs"
for target in "${targets[@]}"; do
  mkdir -p "$build/corpus/$target" "$build/artifacts/$target"
  rm -f "$build/logs/$target.log" "$build/logs/$target.status"
done
if [[ " ${targets[*]} " == *" math "* ]]; then
  # Seeds: every gold and prediction of Math-Verify's cases, one file each.
  /usr/bin/python3 - "$build/corpus/math" <<'PY'
import json, sys, hashlib, os
out = sys.argv[1]
for line in open("testdata/math_verify/cases.jsonl", encoding="utf-8"):
    row = json.loads(line)
    for text in (row["gold"], row["prediction"], row["gold"] + "\0" + row["prediction"]):
        data = text.encode("utf-8")
        with open(os.path.join(out, hashlib.sha1(data).hexdigest()), "wb") as f:
            f.write(data)
PY
fi

# One target: new inputs go to build-fuzz/corpus/<name> (the first corpus
# directory), the checked-in seeds are only read.
fuzz_one() {
  local target=$1 status=0
  ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS="suppressions=$PWD/common/fuzz/lsan.supp" \
    "$build/bin/${target}_fuzz" "$build/corpus/$target" "${corpus_of[$target]}" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="${max_len_of[$target]}" \
    -artifact_prefix="$build/artifacts/$target/" -print_final_stats=1 \
    >"$build/logs/$target.log" 2>&1 || status=$?
  echo "$status" >"$build/logs/$target.status"
}

jobs=${SLUICE_FUZZ_JOBS:-$(nproc)}
echo "fuzz.sh: fuzzing ${targets[*]} for ${seconds} s each, $jobs at a time"
for target in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  fuzz_one "$target" &
done
wait

# The final figures of a log: a libFuzzer stat:: line, and a field of the last
# progress line ("#N  DONE  cov: C ft: F corp: U/S ...").
final_stat() { sed -n "s/^stat::$2: *//p" "$1" | tail -1; }
progress_field() { grep -E '^#[0-9]+' "$1" | tail -1 | sed -n "s/.* $2: \([0-9]*\).*/\1/p"; }
failed=()
printf '%-14s %10s %8s %7s %7s %7s  %s\n' target execs exec/s cov ft corpus result
for target in "${targets[@]}"; do
  log="$build/logs/$target.log"
  status=$(cat "$build/logs/$target.status" 2>/dev/null || echo 1)
  result=ok
  if [[ $status != 0 ]]; then
    result="FAILED (exit $status; $log, reproducer in $build/artifacts/$target/)"
    failed+=("$target")
  fi
  printf '%-14s %10s %8s %7s %7s %7s  %s\n' "$target" "$(final_stat "$log" number_of_executed_units)" \
    "$(final_stat "$log" average_exec_per_sec)" "$(progress_field "$log" cov)" \
    "$(progress_field "$log" ft)" "$(progress_field "$log" corp)" "$result"
done
for target in "${failed[@]}"; do
  echo "---- $target: tail of $build/logs/$target.log" >&2
  tail -40 "$build/logs/$target.log" >&2
done
if ((${#failed[@]})); then
  echo "fuzz.sh: the fuzzer found a problem in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: no crash in ${seconds} s per target"
