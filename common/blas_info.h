#ifndef SLUICE_COMMON_BLAS_INFO_H_
#define SLUICE_COMMON_BLAS_INFO_H_

#include <string>

namespace sluice {

// Which BLAS this process actually loaded, found without touching LibTorch.
//
// Debian's LibTorch links the generic libblas.so.3, which the alternatives
// system points at OpenBLAS when libopenblas0-pthread is installed and at the
// reference BLAS (~50x slower) otherwise. Every process logs this at start-up
// so that a silent fallback is visible in the first lines of its log.
struct BlasInfo {
  // Resolved path of the loaded BLAS library; empty when none is loaded (a
  // process that does not use tensors).
  std::string library_path;
  // "OpenBLAS", "reference", "MKL", "none" or "unknown".
  std::string vendor;
  // openblas_get_config() when the BLAS is OpenBLAS, else empty.
  std::string config;
  // OpenBLAS's thread-pool size (sized by OPENBLAS_NUM_THREADS), or -1 when
  // not known.
  int threads = -1;
};

// Inspects the libraries mapped into this process. Cheap; thread-safe.
BlasInfo DetectBlas();

}  // namespace sluice

#endif  // SLUICE_COMMON_BLAS_INFO_H_
