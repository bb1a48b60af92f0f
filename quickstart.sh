#!/usr/bin/env bash
# The main job: install dependencies, build, and run `sluice quickstart`,
# which brings the five services up on loopback, shows them healthy, and stops
# them. Extra arguments go to `sluice quickstart` (e.g. --runs-dir DIR).
set -euo pipefail
cd "$(dirname "$0")"
./scripts/install-deps.sh
./scripts/build.sh
exec "${SLUICE_BUILD_DIR:-build}/bin/sluice" quickstart "$@"
