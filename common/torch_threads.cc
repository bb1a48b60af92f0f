#include "common/torch_threads.h"

// Only the parallel API: <torch/torch.h> would cost ~20 s of compile time here.
#include <ATen/Parallel.h>

namespace sluice {

TorchThreads ConfigureTorchThreads(int intra_op_threads) {
  if (intra_op_threads > 0) at::set_num_threads(intra_op_threads);
  TorchThreads threads;
  threads.intra_op = at::get_num_threads();
  threads.inter_op = at::get_num_interop_threads();
  return threads;
}

}  // namespace sluice
