#pragma once

#include <cstdint>
#include <string_view>

/// Process-wide settings of how troupe computes, with tf.config's names.
namespace troupe::config {

/// Lets float32 matrix products on GPUs (matmul, Dense, and what is built on them) round their
/// inputs to TensorFloat-32 (10-bit mantissa) and multiply on the tensor cores, accumulating in
/// float32, as tf.config.experimental.enable_tensor_float_32_execution does. On, as in
/// TensorFlow, by default: products run several times faster on GPUs that have TF32 (Ampere and
/// newer) and differ from exact float32 products by about 1e-3 relative. Off, they are exact
/// float32 products (within float32 rounding of the CPU's). CPU products are always exact
/// float32. Every replica uses the same setting at a product, so replicas keep identical weights.
/// Takes effect at the next product; safe to call from any thread.
void enable_tensor_float_32_execution(bool enabled) noexcept;

/// Whether TensorFloat-32 is allowed (tf.config.experimental.tensor_float_32_execution_enabled).
bool tensor_float_32_execution_enabled() noexcept;

namespace experimental {

/// Bytes of GPU memory held by tensors on one GPU (tf.config.experimental.get_memory_info).
struct MemoryInfo {
  std::int64_t current = 0;  ///< held now
  std::int64_t peak = 0;     ///< the most held at once since the start or reset_memory_stats
};

/// The memory held by tensors on `device` ("GPU:0", "/device:GPU:1", as Device::parse reads
/// them): allocator blocks handed to tensors, rounded as the allocator rounds them, counted when
/// handed out and when given back (blocks the allocator keeps for reuse are not held). Comparable
/// with PyTorch's torch.cuda.memory_allocated / max_memory_allocated. A CPU device, a malformed
/// name or a GPU that does not exist throws std::invalid_argument.
MemoryInfo get_memory_info(std::string_view device);

/// Starts the peak of `device` again from what is held now (tf.config.experimental.reset_memory_stats).
void reset_memory_stats(std::string_view device);

}  // namespace experimental

}  // namespace troupe::config
