#include "common/blas_info.h"

#include <dlfcn.h>
#include <link.h>
#include <limits.h>
#include <stdlib.h>

#include "absl/strings/string_view.h"

namespace sluice {
namespace {

int CollectBlas(struct dl_phdr_info* info, size_t, void* data) {
  auto* found = static_cast<std::string*>(data);
  if (info->dlpi_name == nullptr || !found->empty()) return 0;
  const absl::string_view name(info->dlpi_name);
  const size_t slash = name.rfind('/');
  const absl::string_view base = slash == absl::string_view::npos ? name : name.substr(slash + 1);
  if (base.rfind("libblas.so", 0) == 0 || base.rfind("libopenblas", 0) == 0 ||
      base.rfind("libmkl_rt", 0) == 0 || base.rfind("libblis", 0) == 0) {
    char resolved[PATH_MAX];
    *found = realpath(info->dlpi_name, resolved) != nullptr ? std::string(resolved)
                                                           : std::string(name);
  }
  return 0;
}

}  // namespace

BlasInfo DetectBlas() {
  BlasInfo info;
  dl_iterate_phdr(&CollectBlas, &info.library_path);

  using ConfigFn = char* (*)();
  using ThreadsFn = int (*)();
  auto config = reinterpret_cast<ConfigFn>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  auto threads = reinterpret_cast<ThreadsFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (config != nullptr) {
    info.vendor = "OpenBLAS";
    info.config = config();
    if (threads != nullptr) info.threads = threads();
  } else if (info.library_path.empty()) {
    info.vendor = "none";
  } else if (info.library_path.find("mkl") != std::string::npos) {
    info.vendor = "MKL";
  } else if (info.library_path.find("/blas/") != std::string::npos) {
    // Debian's netlib reference implementation lives in .../blas/libblas.so.3.
    info.vendor = "reference";
  } else {
    info.vendor = "unknown";
  }
  return info;
}

}  // namespace sluice
