#include "troupe/transport/reduce_kernels.hpp"

#include <algorithm>
#include <cstring>

namespace troupe::transport {
namespace {

// Blocks small enough that the running sum stays in L1 while the inputs stream past it.
constexpr std::int64_t block_bytes = 8 * 1024;

template <class T>
void reduce_typed(const void* const* ins, int n, void* const* outs, int num_outs, std::int64_t begin,
                  std::int64_t end, reduce_kind op) {
  constexpr std::int64_t block = block_bytes / sizeof(T);
  alignas(64) T acc[block];
  const T divisor = static_cast<T>(n);
  for (std::int64_t b = begin; b < end; b += block) {
    const std::int64_t len = std::min(block, end - b);
    const T* __restrict first = static_cast<const T*>(ins[0]) + b;
    for (std::int64_t i = 0; i < len; ++i) acc[i] = first[i];
    for (int r = 1; r < n; ++r) {
      const T* __restrict in = static_cast<const T*>(ins[r]) + b;
      for (std::int64_t i = 0; i < len; ++i) acc[i] += in[i];
    }
    if (op == reduce_kind::mean) {
      for (std::int64_t i = 0; i < len; ++i) acc[i] /= divisor;
    }
    for (int o = 0; o < num_outs; ++o) {
      std::memcpy(static_cast<T*>(outs[o]) + b, acc, static_cast<std::size_t>(len) * sizeof(T));
    }
  }
}

}  // namespace

void reduce_range(const void* const* ins, int n, void* const* outs, int num_outs, std::int64_t begin,
                  std::int64_t end, scalar_type type, reduce_kind op) {
  if (begin >= end) return;
  switch (type) {
    case scalar_type::f32: return reduce_typed<float>(ins, n, outs, num_outs, begin, end, op);
    case scalar_type::f64: return reduce_typed<double>(ins, n, outs, num_outs, begin, end, op);
    case scalar_type::i32: return reduce_typed<std::int32_t>(ins, n, outs, num_outs, begin, end, op);
    case scalar_type::i64: return reduce_typed<std::int64_t>(ins, n, outs, num_outs, begin, end, op);
  }
}

}  // namespace troupe::transport
