# LibTorch (Debian's libtorch-dev, 1.13.1 CPU).
#
# A translation unit that includes <torch/torch.h> costs ~20 s to compile on
# two cores (~6 s with a precompiled header), so only the few TUs that need
# tensors may include it: today none does (common/torch_threads.cc includes
# only <ATen/Parallel.h>). When the model code arrives it goes into one
# library that precompiles <torch/torch.h> once (target_precompile_headers)
# and other torch targets reuse it (REUSE_FROM).
find_package(Torch REQUIRED)
