#pragma once

#include <cstddef>
#include <memory>

#include "troupe/device.hpp"

namespace troupe::detail {

/// The bytes behind one or more tensors. Large blocks come from a cache of freed blocks, so that a
/// step that allocates the same tensors every time does not pay the kernel's page faults again
/// (a fresh 16 MiB buffer costs thousands of faults on first touch).
struct Storage {
  /// Host memory.
  explicit Storage(std::size_t nbytes);
  /// Memory of GPU `gpu` (gpu >= 0).
  Storage(int gpu, std::size_t nbytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data = nullptr;
  std::size_t nbytes = 0;
  std::size_t capacity = 0;
  int gpu = -1;  ///< the GPU whose memory holds the bytes; -1: host memory
};

std::shared_ptr<Storage> allocate_storage(std::size_t nbytes);
/// Storage where `device` keeps its elements: host memory for CPU devices, the GPU's own for GPUs.
std::shared_ptr<Storage> allocate_storage(std::size_t nbytes, const Device& device);

}  // namespace troupe::detail
