#include "troupe/config.hpp"

#include <atomic>
#include <stdexcept>
#include <string>

#include "troupe/device.hpp"
#include "troupe/runtime.hpp"

#include "gpu/gpu.hpp"

namespace troupe::config {
namespace {

std::atomic<bool>& tensor_float_32() {
  static std::atomic<bool> enabled{true};
  return enabled;
}

}  // namespace

void enable_tensor_float_32_execution(bool enabled) noexcept {
  tensor_float_32().store(enabled, std::memory_order_relaxed);
}

bool tensor_float_32_execution_enabled() noexcept { return tensor_float_32().load(std::memory_order_relaxed); }

namespace experimental {
namespace {

int gpu_index(std::string_view spec, const char* op) {
  const Device device = Device::parse(spec);
  if (!device.is_gpu()) {
    throw std::invalid_argument(std::string(op) + ": " + device.to_string() +
                                " is not a GPU (troupe counts the memory of GPUs only; name one as GPU:0)");
  }
  const int gpus = Runtime::gpu_count();
  if (device.index() >= gpus) {
    throw std::invalid_argument(std::string(op) + ": " + device.to_string() + " does not exist (this machine has " +
                                std::to_string(gpus) + " GPU" + (gpus == 1 ? "" : "s") + ")");
  }
  return device.index();
}

}  // namespace

MemoryInfo get_memory_info(std::string_view device) {
  const auto held = troupe::detail::gpu::memory(gpu_index(device, "get_memory_info"));
  return {held.current, held.peak};
}

void reset_memory_stats(std::string_view device) {
  troupe::detail::gpu::reset_peak(gpu_index(device, "reset_memory_stats"));
}

}  // namespace experimental

}  // namespace troupe::config
