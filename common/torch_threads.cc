#include "common/torch_threads.h"

// Only the parallel API: <torch/torch.h> would cost ~20 s of compile time here.
#include <ATen/Parallel.h>
#include <malloc.h>

namespace sluice {

TorchThreads ConfigureTorchThreads(int intra_op_threads) {
  if (intra_op_threads > 0) at::set_num_threads(intra_op_threads);
  TorchThreads threads;
  threads.intra_op = at::get_num_threads();
  threads.inter_op = at::get_num_interop_threads();
  return threads;
}

bool KeepTensorMemoryResident() {
  bool ok = mallopt(M_MMAP_THRESHOLD, 1 << 30) == 1;
  ok = mallopt(M_TRIM_THRESHOLD, static_cast<int>(4294967295u >> 1)) == 1 && ok;
  ok = mallopt(M_TOP_PAD, 256 << 20) == 1 && ok;
  return ok;
}

}  // namespace sluice
