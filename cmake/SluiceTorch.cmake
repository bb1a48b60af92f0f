# LibTorch support.
#
# A translation unit that includes <torch/torch.h> costs ~20 s to compile on
# two cores (~6 s with a precompiled header). Only the few TUs that really need
# tensors link against `sluice_torch_deps`; everything else stays torch-free.
#
# sluice_use_torch(target): links LibTorch and reuses one precompiled
# <torch/torch.h> across every target that asks for it.
find_package(Torch REQUIRED)

function(sluice_use_torch target)
  target_link_libraries(${target} PUBLIC torch)
  if(TARGET sluice_torch_pch)
    target_precompile_headers(${target} REUSE_FROM sluice_torch_pch)
  endif()
endfunction()
