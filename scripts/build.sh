#!/usr/bin/env bash
# Configures and builds Sluice into ${SLUICE_BUILD_DIR:-build} with Ninja and
# ccache. Shared by quickstart.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${SLUICE_BUILD_DIR:-build}
jobs=${SLUICE_JOBS:-$(nproc)}
if [[ ! -f $build_dir/build.ninja ]]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-RelWithDebInfo}
fi
cmake --build "$build_dir" -j "$jobs"
