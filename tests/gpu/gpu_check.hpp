#pragma once

// Whether a GPU test executable runs here, decided the same way by all of them. It is skipped
// (exit 77, with a line saying why) only on a machine without any NVIDIA device node. Where a
// node exists, any CUDA error (an outdated driver, a runtime newer than the driver, every device
// hidden by CUDA_VISIBLE_DEVICES) fails the run with CUDA's own words: a GPU host whose GPUs
// cannot be used must not read as "no GPU".

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "../common/gpu_nodes.hpp"

namespace troupe::testing {

/// ctest's SKIP_RETURN_CODE for the GPU tests.
constexpr int skipped_exit_code = 77;

/// What check_gpus found: the GPUs to test on, or the exit code to leave with at once.
struct gpu_check {
  int devices = 0;     ///< GPUs the CUDA runtime reports (> 0 when run)
  int exit_code = -1;  ///< -1: run the tests; 77: skipped; 1: failed
  bool run() const { return exit_code < 0; }
};

/// Clears an inherited TROUPE_FORCE_CPU (under which the runtime reports no GPU and every GPU test
/// would pass without touching one), then decides; prints one line either way. Call it first
/// thing in main, before any runtime or CUDA call.
inline gpu_check check_gpus(const char* suite) {
  unsetenv("TROUPE_FORCE_CPU");
  const auto nodes = nvidia_device_nodes();
  if (nodes.empty()) {
    std::printf("SKIPPED: %s: this machine has no GPU (no /dev/nvidia* device node)\n", suite);
    return {0, skipped_exit_code};
  }
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string hint =
      visible != nullptr ? std::string(" (CUDA_VISIBLE_DEVICES=\"") + visible + "\")" : std::string();
  if (e != cudaSuccess) {
    std::printf("FAIL %s: %s exists but cudaGetDeviceCount failed: %s: %s%s\n", suite, nodes.front().c_str(),
                cudaGetErrorName(e), cudaGetErrorString(e), hint.c_str());
    return {0, 1};
  }
  if (devices == 0) {
    std::printf("FAIL %s: %s exists but the CUDA runtime reports no device%s\n", suite, nodes.front().c_str(),
                hint.c_str());
    return {0, 1};
  }
  int driver = 0, runtime = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  std::printf("%s: %d GPU(s), CUDA driver %d, runtime %d\n", suite, devices, driver, runtime);
  return {devices, -1};
}

/// A path of a test that needs more GPUs than one.
struct multi_gpu_path {
  int gpus;          ///< the GPUs it needs
  const char* what;  ///< what it checks
};

/// One visible line per path this machine has too few GPUs for: a run that passed did not
/// check it.
inline void report_unexercised(int devices, const char* suite, std::initializer_list<multi_gpu_path> paths) {
  for (const multi_gpu_path& p : paths) {
    if (devices < p.gpus) {
      std::printf("NOT EXERCISED on %d GPU(s): %s: %s (needs %d GPUs)\n", devices, suite, p.what, p.gpus);
    }
  }
}

}  // namespace troupe::testing
