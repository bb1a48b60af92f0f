#!/usr/bin/env bash
# Installs every build and runtime dependency of Sluice from Debian 12's packages.
#
# Idempotent: when everything is already installed it only runs dpkg-query and
# exits in well under a second. Works as root on a fresh machine (CI) and with
# sudo otherwise. Nothing is downloaded from anywhere but Debian's repositories.
set -euo pipefail

packages=(
  # Toolchain.
  build-essential cmake ninja-build ccache pkg-config git ca-certificates
  # RPC and contracts.
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev
  # Tensors. Without libopenblas0-pthread LibTorch falls back to the reference
  # BLAS (~2 GFLOP/s instead of ~100 on two cores).
  libtorch-dev libopenblas0-pthread
  # Observability, config, CLI, logging.
  prometheus-cpp-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  # Reward server: GiNaC for symbolic math equivalence; bubblewrap and
  # libseccomp for the code sandbox; python3 runs the sandboxed programs and
  # python3-sympy is bench_reward's baseline checker; clang builds the
  # libFuzzer target (libclang-rt-dev holds libFuzzer itself).
  libginac-dev libcln-dev bubblewrap libseccomp-dev python3 python3-sympy clang libclang-rt-dev
  libre2-dev zlib1g-dev
  # Tokenizers: Unicode categories, NFC and the pre-tokenizer regexes (lookahead, \p{L}).
  libicu-dev
  # bench_model's baseline: the same forward in Python PyTorch (the same LibTorch 1.13.1).
  python3-torch
  # Tests and benchmarks.
  libgtest-dev libgmock-dev libbenchmark-dev
  # Used by tests and scripts to talk HTTP to /metrics.
  curl procps
  # Multi-host tests (network namespaces and veth pairs) and bench_weight_fanout's
  # loopback baseline.
  iproute2 iperf3
  # Observability (deploy/prometheus): promtool checks and unit-tests the alert
  # rules, and the observability test runs a real Prometheus server against a
  # local stack. Debian's package starts a prometheus service where an init
  # system runs; the tests start their own on a free loopback port.
  prometheus
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [[ $status == installed ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo=()
if ((EUID != 0)); then
  if command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi

echo "install-deps: installing ${#missing[@]} packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
