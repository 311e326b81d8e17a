#include "storage.hpp"

#include "gpu/gpu.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace troupe::detail {
namespace {

constexpr std::size_t cache_min_bytes = 64 * 1024;
constexpr std::size_t huge_page_bytes = 2 * 1024 * 1024;
constexpr std::size_t cache_max_bytes = std::size_t{1} << 31;  // 2 GiB of idle blocks at most

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// A process-wide cache of large freed blocks, keyed by capacity. It is the allocator's own state,
// like malloc's arenas, which is why it is not owned by a Runtime: tensors live without one.
class block_cache {
 public:
  void* take(std::size_t capacity) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(capacity);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= capacity;
        return p;
      }
    }
    const std::size_t align = capacity >= huge_page_bytes ? huge_page_bytes : 4096;
    void* p = std::aligned_alloc(align, capacity);
    if (p == nullptr) throw std::bad_alloc();
    if (capacity >= huge_page_bytes) madvise(p, capacity, MADV_HUGEPAGE);
    return p;
  }

  void give(void* p, std::size_t capacity) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cached_bytes_ + capacity <= cache_max_bytes) {
        free_[capacity].push_back(p);
        cached_bytes_ += capacity;
        return;
      }
    }
    std::free(p);
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::size_t cached_bytes_ = 0;
};

block_cache& cache() {
  static auto* c = new block_cache;  // never destroyed: tensors may outlive static destruction
  return *c;
}

}  // namespace

Storage::Storage(std::size_t n) : nbytes(n) {
  if (n == 0) return;
  if (n >= cache_min_bytes) {
    capacity = round_up(n, n >= huge_page_bytes ? huge_page_bytes : 4096);
    data = cache().take(capacity);
  } else {
    capacity = round_up(n, 64);
    data = std::aligned_alloc(64, capacity);
    if (data == nullptr) throw std::bad_alloc();
  }
}

Storage::Storage(int device, std::size_t n) : nbytes(n), gpu(device) { data = gpu::allocate(device, n, &capacity); }

Storage::~Storage() {
  if (data == nullptr) return;
  if (gpu >= 0) {
    gpu::release(gpu, data, capacity);
    return;
  }
  if (capacity >= cache_min_bytes) {
    cache().give(data, capacity);
  } else {
    std::free(data);
  }
}

std::shared_ptr<Storage> allocate_storage(std::size_t nbytes) { return std::make_shared<Storage>(nbytes); }

std::shared_ptr<Storage> allocate_storage(std::size_t nbytes, const Device& device) {
  if (device.is_gpu()) return std::make_shared<Storage>(device.index(), nbytes);
  return std::make_shared<Storage>(nbytes);
}

}  // namespace troupe::detail
