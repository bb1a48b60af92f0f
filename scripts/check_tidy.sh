#!/usr/bin/env bash
# Runs clang-tidy with the repository's .clang-tidy over the core libraries
# that build without LibTorch (their .cc files, tests excluded), in parallel;
# fails on any finding (WarningsAsErrors). Needs a configured build directory
# (its compile_commands.json). The build's own warning flags are GCC's: clang
# is told to ignore those it does not know and not to treat warnings as
# errors (a CI build has -Werror); only the checks of .clang-tidy fail it.
#   scripts/check_tidy.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
if ! command -v clang-tidy >/dev/null 2>&1; then
  echo "check_tidy: clang-tidy not found: install Debian's clang-tidy (scripts/install-deps.sh does)" >&2
  exit 1
fi
if [[ ! -f $build_dir/compile_commands.json ]]; then
  echo "check_tidy: $build_dir/compile_commands.json is missing: configure the build first" \
       "(scripts/build.sh)" >&2
  exit 1
fi
# The rooms checked: every .cc of these folders but tests, fuzz targets and
# the files compiled with LibTorch (directly or through a precompiled header,
# which clang cannot read from GCC).
rooms=(common/run controller replay_buffer services/clients services/weights services/runtime
       reward_server cli)
mapfile -t files < <(/usr/bin/python3 - "$build_dir/compile_commands.json" "${rooms[@]}" <<'PY'
import json, os, sys
commands = json.load(open(sys.argv[1]))
rooms = sys.argv[2:]
root = os.getcwd()
seen = set()
for c in commands:
    path = os.path.relpath(c["file"], root)
    if path in seen or not any(path.startswith(r + "/") for r in rooms):
        continue
    if path.endswith("_test.cc") or "/fuzz/" in path or "/tools/" in path:
        continue
    if "torch" in c["command"] or "cmake_pch" in c["command"]:
        continue
    seen.add(path)
    print(path)
PY
)
echo "check_tidy: ${#files[@]} files" >&2
jobs=$(nproc)
printf '%s\n' "${files[@]}" |
  xargs -P "$jobs" -n 4 clang-tidy -p "$build_dir" --quiet \
    --extra-arg=-Wno-error --extra-arg=-Wno-unknown-warning-option 2>/dev/null
