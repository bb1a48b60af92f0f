#!/usr/bin/env bash
# Runs one of deploy/k8s's validation scripts with a clear message when a
# tool is missing (ctest calls this; see deploy/k8s/tests.cmake).
#   deploy/k8s/validate/run.sh validate.mjs|breakage_test.mjs [ARGS...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
k8s_dir=$(dirname "$here")
script=$1
shift
# Missing tools fail the test (never skip it), saying what to install.
if ! command -v node >/dev/null 2>&1; then
  echo "k8s validation: node not found: install Debian's nodejs (scripts/install-deps.sh does)" >&2
  exit 1
fi
# `kubectl kustomize` renders the overlays; they use components and
# patches with targets, which need the kustomize built into kubectl 1.21 or
# newer (tested with 1.32). Debian 12's kubernetes-client is 1.20.
kubectl_help="install kubectl 1.21 or newer (tested with 1.32; Debian 12's kubernetes-client package is 1.20, too old): the Kubernetes project's kubectl package or release binary, on PATH"
if ! command -v kubectl >/dev/null 2>&1; then
  echo "k8s validation: kubectl not found: $kubectl_help" >&2
  exit 1
fi
kubectl_version=$(kubectl version --client 2>/dev/null | sed -n 's/^Client Version: v\{0,1\}\([0-9]*\.[0-9]*\).*/\1/p' | head -1)
if [[ -z $kubectl_version ]]; then
  kubectl_version=$(kubectl version --client --short 2>/dev/null | sed -n 's/.*v\([0-9]*\.[0-9]*\).*/\1/p' | head -1)
fi
if [[ -n $kubectl_version ]] && (( ${kubectl_version%%.*} == 1 && ${kubectl_version#*.} < 21 )); then
  echo "k8s validation: kubectl $kubectl_version is too old: $kubectl_help" >&2
  exit 1
fi
if [[ ! -d $k8s_dir/node_modules/kubernetes-models ]]; then
  echo "k8s validation: $k8s_dir/node_modules is missing: run scripts/install-deps.sh" \
       "(npm ci in deploy/k8s)" >&2
  exit 1
fi
exec node "$here/$script" --k8s-dir "$k8s_dir" "$@"
