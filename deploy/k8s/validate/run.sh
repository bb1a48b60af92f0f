#!/usr/bin/env bash
# Runs one of deploy/k8s's validation scripts with a clear message when a
# tool is missing (ctest calls this; see deploy/k8s/tests.cmake).
#   deploy/k8s/validate/run.sh validate.mjs|breakage_test.mjs [ARGS...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
k8s_dir=$(dirname "$here")
script=$1
shift
for tool in node kubectl; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "k8s validation: $tool not found (node: Debian's nodejs; kubectl: the machine image's 1.32)" >&2
    exit 1
  fi
done
if [[ ! -d $k8s_dir/node_modules/kubernetes-models ]]; then
  echo "k8s validation: $k8s_dir/node_modules is missing: run scripts/install-deps.sh" \
       "(npm ci in deploy/k8s)" >&2
  exit 1
fi
exec node "$here/$script" --k8s-dir "$k8s_dir" "$@"
