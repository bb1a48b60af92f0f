#!/usr/bin/env bash
# Runs clang-tidy with the repository's .clang-tidy over the core libraries
# that build without LibTorch (their .cc files, tests excluded), in parallel;
# fails on any finding (WarningsAsErrors). Needs a configured build directory
# (its compile_commands.json).
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
# the files that include LibTorch.
rooms=(common/run controller replay_buffer services/clients services/weights services/runtime
       reward_server cli)
mapfile -t files < <(git ls-files -- "${rooms[@]/%//*.cc}" |
  grep -v -e '_test\.cc$' -e '/fuzz/' -e '/tools/' |
  while read -r f; do grep -q 'torch/' "$f" || echo "$f"; done)
echo "check_tidy: ${#files[@]} files" >&2
jobs=$(nproc)
printf '%s\n' "${files[@]}" |
  xargs -P "$jobs" -n 4 clang-tidy -p "$build_dir" --quiet 2>/dev/null
