#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <string>
#include <utility>

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

/// An allocation that failed, as a std::bad_alloc that says what was being allocated and how
/// much (a tensor's shape and bytes, a batch's elements), so that the caller's message names it.
class named_bad_alloc : public std::bad_alloc {
 public:
  explicit named_bad_alloc(std::string what) : what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

std::shared_ptr<Storage> allocate_storage(std::size_t nbytes);
/// Storage where `device` keeps its elements: host memory for CPU devices, the GPU's own for GPUs.
std::shared_ptr<Storage> allocate_storage(std::size_t nbytes, const Device& device);

}  // namespace troupe::detail
