#!/usr/bin/env bash
# Configures and builds Sluice into ${SLUICE_BUILD_DIR:-build} with Ninja and
# ccache. Shared by quickstart.sh and test.sh.
#
#   SLUICE_WERROR=ON       compile with warnings as errors (.ci/run sets it)
#   SLUICE_UNITY_BUILD=ON  unity builds of the LibTorch-heavy libraries, for
#                          cold builds (.ci/run sets it; cmake/SluiceTorch.cmake)
#   SLUICE_JOBS=N          parallel jobs (default: the number of cores)
# A build directory is configured again when SLUICE_WERROR or
# SLUICE_UNITY_BUILD is set.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${SLUICE_BUILD_DIR:-build}
jobs=${SLUICE_JOBS:-$(nproc)}
configure=(-DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-RelWithDebInfo})
[[ -z ${SLUICE_WERROR:-} ]] || configure+=(-DSLUICE_WERROR=${SLUICE_WERROR})
[[ -z ${SLUICE_UNITY_BUILD:-} ]] || configure+=(-DSLUICE_UNITY_BUILD=${SLUICE_UNITY_BUILD})
if [[ ! -f $build_dir/build.ninja || -n ${SLUICE_WERROR:-}${SLUICE_UNITY_BUILD:-} ]]; then
  cmake -S . -B "$build_dir" -G Ninja "${configure[@]}"
fi
cmake --build "$build_dir" -j "$jobs"
