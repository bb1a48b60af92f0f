#!/usr/bin/env bash
# The GPU checks and benchmarks, for a machine with an NVIDIA GPU, CUDA
# (nvcc), CMake, Ninja and a PyTorch install (its LibTorch, and transformers
# for the baselines). docs/gpu.md says what each step checks.
#
#   scripts/gpu-check.sh [OUT_DIR]          (default gpu-check-out)
#
# Environment:
#   PYTHON            the python with torch and transformers (python3)
#   SLUICE_GPU_DEPS   a prefix with absl, nlohmann_json, spdlog, fmt, CLI11,
#                     zlib and GoogleTest (CMake configs under it); default
#                     .gpu/sysroot/usr, made here by scripts/gpu-deps.sh from
#                     Debian's -dev packages when the GPU machine has none
#   BUILD_DIR         build directory (build-gpu)
#   GPU_CHECK_QUICK=1 a small model, short runs (a smoke test)
#   GPU_CHECK_STEPS   the steps to run, comma-separated (default
#                     gpu_check,hf_baseline,handoff,model_test)
#
# It builds gpu/ (the model, the engine, the trainer's loss, common/cuda's
# IPC / NCCL / CRC code: no gRPC, see gpu/CMakeLists.txt) against the
# PyTorch's LibTorch, then runs, each step on even if one before failed:
#   1. gpu_check        logits GPU vs CPU, generation, one trainer step;
#                       decode tokens/s at batch 1, 32, 256 with the HBM
#                       roofline; trainer tokens/s
#   2. hf_baseline      transformers generate and a PyTorch eager PPO step,
#                       same shapes, same GPU
#   3. handoff          cuda_weight_handoff_check: CUDA IPC hand-off of
#                       0.5B / 1.5B-sized bf16 versions to another process,
#                       CRC-tree checked, against a host-staged copy; NCCL
#                       broadcast on one rank
#   4. model_test       the model's unit tests incl. the CUDA placement ones
#   5. summary.json     the ratios
# Exit status: 0 when every step ran and every check passed.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-gpu-check-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
DEPS=${SLUICE_GPU_DEPS:-$ROOT/.gpu/sysroot/usr}
BUILD=${BUILD_DIR:-$ROOT/build-gpu}
QUICK=${GPU_CHECK_QUICK:-0}
STEPS=",${GPU_CHECK_STEPS:-gpu_check,hf_baseline,handoff,model_test},"
wants() { [[ "$STEPS" == *",$1,"* ]]; }
failed=()
step() { echo "== $(date +%T) $*" >&2; }

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi -L fails): nothing to check" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
TORCH_PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)') || {
  echo "gpu-check: $PY cannot import torch" >&2; exit 2; }
if [ ! -d "$DEPS" ]; then
  echo "gpu-check: no dependency prefix at $DEPS (set SLUICE_GPU_DEPS, or run scripts/gpu-deps.sh on a Debian 12 machine and carry .gpu/)" >&2
  exit 2
fi
export LD_LIBRARY_PATH="$DEPS/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="/usr/local/cuda/bin:$PATH"
# NCCL: the toolkit's, else the one PyTorch's wheel brought (nvidia-nccl).
if [ -z "${NCCL_ROOT:-}" ] && [ ! -e /usr/local/cuda/include/nccl.h ]; then
  NCCL_ROOT=$("$PY" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' \
    2>/dev/null) && export NCCL_ROOT
fi

step "configure + build (LibTorch of $PY: $TORCH_PREFIX)"
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
cmake -S "$ROOT/gpu" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$DEPS" -DSLUICE_CUDA_ARCHITECTURES="${arch:-90}" \
  >"$OUT/configure.log" 2>&1 || { tail -40 "$OUT/configure.log" >&2; failed+=(configure); }
timeout 300 ninja -C "$BUILD" -k 0 gpu_check model_test cuda_weight_handoff_check >"$OUT/build.log" 2>&1 ||
  { grep -E "error|Error" "$OUT/build.log" | head -40 >&2; failed+=(build); }

if wants gpu_check && [ -x "$BUILD/bin/gpu_check" ]; then
  step "gpu_check"
  quick=(); [ "$QUICK" = 1 ] && quick=(--quick)
  timeout 240 "$BUILD/bin/gpu_check" --device cuda --out "$OUT/gpu_check.json" "${quick[@]}" \
    2>&1 | tee "$OUT/gpu_check.log" >&2
  [ "${PIPESTATUS[0]}" = 0 ] || failed+=(gpu_check)
fi

if wants hf_baseline && [ "$QUICK" != 1 ]; then
  step "hf_baseline"
  PYTHONUNBUFFERED=1 timeout 180 "$PY" "$ROOT/gpu/hf_baseline.py" --out "$OUT/hf_baseline.json" \
    2>&1 | tee "$OUT/hf_baseline.log" >&2
  [ "${PIPESTATUS[0]}" = 0 ] || failed+=(hf_baseline)
fi

handoff=$(find "$BUILD" -name cuda_weight_handoff_check -type f -perm -u+x | head -1)
if ! wants handoff; then
  :
elif [ -n "$handoff" ]; then
  step "handoff"
  sizes=988,3087; [ "$QUICK" = 1 ] && sizes=64
  timeout 120 "$handoff" --sizes-mb "$sizes" --output "$OUT/handoff.json" \
    >"$OUT/handoff.log" 2>&1 || { tail -30 "$OUT/handoff.log" >&2; failed+=(handoff); }
else
  failed+=(handoff-missing)
fi

if wants model_test && [ -x "$BUILD/bin/model_test" ]; then
  step "model_test"
  timeout 90 "$BUILD/bin/model_test" --gtest_brief=1 --gtest_output="json:$OUT/model_test.json" \
    >"$OUT/model_test.log" 2>&1 || { tail -30 "$OUT/model_test.log" >&2; failed+=(model_test); }
  tail -3 "$OUT/model_test.log" >&2
fi

step "summary"
"$PY" "$ROOT/gpu/summarize.py" "$OUT" >&2 || failed+=(summary)
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu-check: FAILED: ${failed[*]} (logs in $OUT)" >&2
  exit 1
fi
echo "gpu-check: every step ran and every check passed (results in $OUT/summary.json)" >&2
