#include "troupe/kernels/reduce_kernels.hpp"

#include "troupe/kernels/half_kernels.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace troupe::kernels {
namespace {

// Blocks small enough that the running sum stays in L1 while the inputs stream past it.
constexpr std::int64_t block_bytes = 8 * 1024;

// Copies `bytes` from L1 to `dst`. Streaming stores bypass the cache: an output that is written
// whole and not read back soon then costs one write instead of a read-for-ownership plus a write.
void store_block(void* dst, const void* src, std::size_t bytes, bool streaming) {
#if defined(__SSE2__)
  if (streaming && reinterpret_cast<std::uintptr_t>(dst) % 16 == 0) {
    auto* d = static_cast<__m128i*>(dst);
    const auto* s = static_cast<const __m128i*>(src);
    const std::size_t units = bytes / 16;
    for (std::size_t i = 0; i < units; ++i) _mm_stream_si128(d + i, _mm_load_si128(s + i));
    const std::size_t done = units * 16;
    if (done < bytes) std::memcpy(static_cast<char*>(dst) + done, static_cast<const char*>(src) + done, bytes - done);
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

template <class T>
void reduce_typed(const void* const* ins, int n, void* const* outs, int num_outs, std::int64_t begin,
                  std::int64_t end, reduce_kind op, bool streaming) {
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
      store_block(static_cast<T*>(outs[o]) + b, acc, static_cast<std::size_t>(len) * sizeof(T), streaming);
    }
  }
}

// The 16-bit wire formats: every element is widened to float32, summed in input order (and divided
// for mean) in float32, and rounded once to the format, nearest even. Widening is exact and the
// float32 operations are IEEE ones in a fixed order, so the bits are the same on every host.
void reduce_16(const void* const* ins, int n, void* const* outs, int num_outs, std::int64_t begin, std::int64_t end,
               scalar_type type, reduce_kind op) {
  constexpr std::int64_t block = block_bytes / sizeof(float);
  alignas(64) float acc[block];
  alignas(64) float next[block];
  alignas(64) std::uint16_t packed[block];
  const float divisor = static_cast<float>(n);
  for (std::int64_t b = begin; b < end; b += block) {
    const std::int64_t len = std::min(block, end - b);
    decompress_range(static_cast<const std::uint16_t*>(ins[0]) + b, acc, len, type);
    for (int r = 1; r < n; ++r) {
      decompress_range(static_cast<const std::uint16_t*>(ins[r]) + b, next, len, type);
      for (std::int64_t i = 0; i < len; ++i) acc[i] += next[i];
    }
    if (op == reduce_kind::mean) {
      for (std::int64_t i = 0; i < len; ++i) acc[i] /= divisor;
    }
    compress_range(acc, packed, len, type);
    for (int o = 0; o < num_outs; ++o) {
      std::memcpy(static_cast<std::uint16_t*>(outs[o]) + b, packed, static_cast<std::size_t>(len) * 2);
    }
  }
}

void scale_16(void* data, std::int64_t count, scalar_type type, int divisor) {
  constexpr std::int64_t block = block_bytes / sizeof(float);
  alignas(64) float values[block];
  auto* p = static_cast<std::uint16_t*>(data);
  const float d = static_cast<float>(divisor);
  for (std::int64_t b = 0; b < count; b += block) {
    const std::int64_t len = std::min(block, count - b);
    decompress_range(p + b, values, len, type);
    for (std::int64_t i = 0; i < len; ++i) values[i] /= d;
    compress_range(values, p + b, len, type);
  }
}

}  // namespace

void reduce_range(const void* const* ins, int n, void* const* outs, int num_outs, std::int64_t begin,
                  std::int64_t end, scalar_type type, reduce_kind op, bool streaming) {
  if (begin >= end) return;
  switch (type) {
    case scalar_type::f32: reduce_typed<float>(ins, n, outs, num_outs, begin, end, op, streaming); break;
    case scalar_type::f64: reduce_typed<double>(ins, n, outs, num_outs, begin, end, op, streaming); break;
    case scalar_type::i32: reduce_typed<std::int32_t>(ins, n, outs, num_outs, begin, end, op, streaming); break;
    case scalar_type::i64: reduce_typed<std::int64_t>(ins, n, outs, num_outs, begin, end, op, streaming); break;
    case scalar_type::f16:
    case scalar_type::bf16: reduce_16(ins, n, outs, num_outs, begin, end, type, op); break;
  }
#if defined(__SSE2__)
  // Streaming stores are weakly ordered: fence them before the barrier publishes the result.
  if (streaming) _mm_sfence();
#endif
}

void scale_range(void* data, std::int64_t count, scalar_type type, int divisor) {
  auto run = [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    const T d = static_cast<T>(divisor);
    for (std::int64_t i = 0; i < count; ++i) p[i] /= d;
  };
  switch (type) {
    case scalar_type::f32: run(static_cast<float*>(data)); break;
    case scalar_type::f64: run(static_cast<double*>(data)); break;
    case scalar_type::i32: run(static_cast<std::int32_t*>(data)); break;
    case scalar_type::i64: run(static_cast<std::int64_t*>(data)); break;
    case scalar_type::f16:
    case scalar_type::bf16: scale_16(data, count, type, divisor); break;
  }
}

}  // namespace troupe::kernels
