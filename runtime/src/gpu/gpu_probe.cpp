#include "gpu_probe.hpp"

#include "env.hpp"

#include <cstdlib>
#include <cstring>

#ifdef TROUPE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace troupe::detail {

int cuda_device_count() {
  if (force_cpu_from_environment()) return 0;
#ifdef TROUPE_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver (35) or no device (100): a CPU-only machine
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

}  // namespace troupe::detail
