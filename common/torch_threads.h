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

}  // namespace sluice

#endif  // SLUICE_COMMON_TORCH_THREADS_H_
