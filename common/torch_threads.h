#ifndef SLUICE_COMMON_TORCH_THREADS_H_
#define SLUICE_COMMON_TORCH_THREADS_H_

#include <string>

namespace sluice {

// LibTorch's thread pools, as this process configured them.
struct TorchThreads {
  int intra_op = 0;  // at::get_num_threads(): OpenMP threads per op.
  int inter_op = 0;  // at::get_num_interop_threads().
};

// Pins LibTorch's intra-op pool. On a shared 2-core machine every service
// competes for the same cores, so each process says how many it takes instead
// of each assuming it owns the machine. `intra_op_threads` <= 0 keeps
// LibTorch's default. OpenBLAS's own pool is sized separately, by the
// OPENBLAS_NUM_THREADS environment variable read when the library loads.
// Call once, early in main, before any tensor work.
TorchThreads ConfigureTorchThreads(int intra_op_threads);

// Keeps freed tensor buffers in the process instead of handing them back to
// the kernel. glibc returns every free()d block above its mmap threshold
// (and trims the heap top) at once, so a training or decoding loop that
// allocates the same 1-2 MB activations every step page-faults them back in
// each time: profiled at ~27% of CPU in the kernel for the built-in model,
// and element-wise ops 3-6x slower. Raises the mmap threshold to 1 GiB, the
// trim threshold to 2 GiB (the largest it takes) and the top pad to 256 MiB (mallopt). Call once,
// early in main, in processes that run tensor loops (trainer, rollout worker).
// Returns false if glibc refused a setting.
bool KeepTensorMemoryResident();

}  // namespace sluice

#endif  // SLUICE_COMMON_TORCH_THREADS_H_
