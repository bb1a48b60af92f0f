# LibTorch: Debian's libtorch-dev (1.13.1, CPU only) by default, or a CUDA
# LibTorch with -DSLUICE_TORCH_CUDA=ON (docs/gpu.md).
#
# A translation unit that includes <torch/torch.h> costs ~20 s to compile on
# two cores (~6 s with a precompiled header), so only the few TUs that need
# tensors may include it: the model code lives in one library that
# precompiles <torch/torch.h> once (target_precompile_headers) and other
# torch targets reuse it (REUSE_FROM).
#
#   SLUICE_TORCH_CUDA=OFF (default)  whatever LibTorch find_package finds;
#                                    CUDA is used if it has it
#   SLUICE_TORCH_CUDA=ON             a CUDA LibTorch is required: the one of
#                                    the PyTorch install that `python3`
#                                    imports (torch.utils.cmake_prefix_path)
#                                    unless Torch_DIR / CMAKE_PREFIX_PATH
#                                    name one; configuring fails when the
#                                    LibTorch found has no CUDA
#
# Exports SLUICE_TORCH_HAS_CUDA (ON/OFF) and, when ON, the compile definition
# SLUICE_TORCH_CUDA that common/torch_compat.h reads (the one place where
# version and CUDA differences are met in C++).
option(SLUICE_TORCH_CUDA "Build against a CUDA-enabled LibTorch (e.g. PyTorch's)" OFF)
if(SLUICE_TORCH_CUDA AND NOT Torch_DIR)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import torch; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE sluice_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE sluice_torch_rc ERROR_QUIET)
    if(sluice_torch_rc EQUAL 0 AND sluice_torch_prefix)
      list(PREPEND CMAKE_PREFIX_PATH ${sluice_torch_prefix})
      message(STATUS "SLUICE_TORCH_CUDA: LibTorch of ${Python3_EXECUTABLE}: ${sluice_torch_prefix}")
    endif()
  endif()
  # PyTorch's Caffe2 config looks for the CUDA toolkit; point it at the usual
  # place when nothing else does.
  if(NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDA_PATH} AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
endif()
find_package(Torch REQUIRED)
set(SLUICE_TORCH_HAS_CUDA OFF)
if(TORCH_CUDA_LIBRARIES OR "${TORCH_LIBRARIES}" MATCHES "torch_cuda")
  set(SLUICE_TORCH_HAS_CUDA ON)
endif()
if(SLUICE_TORCH_CUDA AND NOT SLUICE_TORCH_HAS_CUDA)
  message(FATAL_ERROR "SLUICE_TORCH_CUDA=ON but the LibTorch found (${Torch_DIR}) has no CUDA: "
                      "point Torch_DIR at a CUDA LibTorch, e.g. "
                      "-DTorch_DIR=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')/Torch")
endif()
if(SLUICE_TORCH_HAS_CUDA)
  add_compile_definitions(SLUICE_TORCH_CUDA)
  message(STATUS "LibTorch ${Torch_VERSION} with CUDA: model.device cuda[:N] is available")
else()
  message(STATUS "LibTorch ${Torch_VERSION} is CPU only: model.device cuda is refused at run "
                 "start (-DSLUICE_TORCH_CUDA=ON builds against a CUDA LibTorch)")
endif()

# sluice_torch_library(TARGET): a torch-heavy library (model, trainer, rollout
# worker). Each of its TUs costs 13-20 s on two cores even with the
# precompiled header, mostly in instantiating and emitting the same LibTorch
# templates again; a unity build (SLUICE_UNITY_BUILD=ON: its .cc files
# compiled a few at a time as one TU) emits them once per batch. A cold build
# (CI: .ci/run sets it) gains; day-to-day incremental builds would recompile a
# whole batch for a one-file change, so it is off by default. Test binaries
# stay one TU per file: their helpers share names. Measured cold
# (CCACHE_DISABLE=1, -j2, the machine shared with other builds): sluice_trainer's
# 18 TUs took 725 s of compile time (load ~5), its 3 unity TUs 147 s (load
# ~2.5); sluice_model's 5 TUs 207 s, its unity TU 23 s.
option(SLUICE_UNITY_BUILD "Unity builds of the LibTorch-heavy libraries (cold builds, CI)" OFF)
function(sluice_torch_library target)
  if(SLUICE_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 6)
  endif()
endfunction()
