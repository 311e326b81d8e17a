// float16 and bfloat16 on GPU tensors: casts and reductions, bit for bit as on the CPU.

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels.hpp"
#include "launch.cuh"

namespace troupe::kernels::cuda {
using namespace detail;  // NOLINT(google-build-using-namespace): the launch helpers of this folder

// The conversions of kernels/half_kernels.hpp, bit for bit, in integer arithmetic (no device
// rounding mode or intrinsic involved), so that a cast on the GPU gives the CPU's bits.
namespace {

__device__ std::uint16_t device_float_to_bf16(float f) {
  std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

__device__ float device_bf16_to_float(std::uint16_t h) { return __uint_as_float(static_cast<std::uint32_t>(h) << 16); }

__device__ std::uint16_t device_float_to_f16(float f) {
  const std::uint32_t u = __float_as_uint(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x03ffu));
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (a < 0x38800000u) {
    const std::uint32_t exp = a >> 23;
    if (exp < 102) return sign;
    const std::uint32_t sig = (a & 0x007fffffu) | 0x00800000u;
    const std::uint32_t shift = 126 - exp;
    std::uint32_t m = sig >> shift;
    const std::uint32_t rest = sig & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (m & 1u))) ++m;
    return static_cast<std::uint16_t>(sign | m);
  }
  a += 0xc8000fffu + ((a >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (a >> 13));
}

__device__ float device_f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x03ffu;
  if (exp == 0) return __uint_as_float(sign | __float_as_uint(static_cast<float>(mant) * 0x1p-24f));
  if (exp == 31) return __uint_as_float(mant == 0 ? (sign | 0x7f800000u) : (sign | 0x7fc00000u | (mant << 13)));
  return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// kernels::float_round_to_odd, for float64 and 64-bit integers on their way to 16 bits.
__device__ float device_round_to_odd(double d) {
  const auto u = static_cast<std::uint64_t>(__double_as_longlong(d));
  const auto sign = static_cast<std::uint32_t>(u >> 32) & 0x80000000u;
  const std::uint64_t mant = u & 0x000fffffffffffffull;
  const int exp = static_cast<int>((u >> 52) & 0x7ffu);
  if (exp == 0x7ff) {
    return __uint_as_float(sign | 0x7f800000u |
                           (mant != 0 ? 0x00400000u | static_cast<std::uint32_t>(mant >> 29) : 0u));
  }
  if (exp == 0 && mant == 0) return __uint_as_float(sign);
  const int e = exp == 0 ? -1022 : exp - 1023;
  const std::uint64_t sig = exp == 0 ? mant : (mant | (1ull << 52));
  if (e > 127) return __uint_as_float(sign | 0x7f7fffffu);
  if (e >= -126) {
    const std::uint32_t sticky = (sig & ((1ull << 29) - 1)) != 0 ? 1u : 0u;
    return __uint_as_float(sign | (static_cast<std::uint32_t>(e + 127) << 23) |
                           static_cast<std::uint32_t>((sig >> 29) & 0x007fffffu) | sticky);
  }
  const int shift = 29 + (-126 - e);
  if (shift >= 64) return __uint_as_float(sign | 1u);
  const std::uint32_t sticky = (sig & ((1ull << shift) - 1)) != 0 ? 1u : 0u;
  return __uint_as_float(sign | static_cast<std::uint32_t>(sig >> shift) | sticky);
}

__device__ float device_round_to_odd(std::int64_t v) {
  const std::uint32_t sign = v < 0 ? 0x80000000u : 0u;
  const std::uint64_t mag = v < 0 ? 0 - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
  if (mag < (1ull << 24)) return __uint_as_float(sign | __float_as_uint(static_cast<float>(mag)));
  const int top = 63 - __clzll(static_cast<long long>(mag));
  const int shift = top - 23;
  const std::uint32_t sticky = (mag & ((1ull << shift) - 1)) != 0 ? 1u : 0u;
  return __uint_as_float(sign | (static_cast<std::uint32_t>(top + 127) << 23) |
                         (static_cast<std::uint32_t>(mag >> shift) & 0x007fffffu) | sticky);
}

// A 16-bit element type in a kernel: its bits, and whether it is bfloat16.
template <bool BF16>
struct half_tag {
  std::uint16_t bits;
};

template <bool BF16>
__device__ float widen(half_tag<BF16> h) {
  return BF16 ? device_bf16_to_float(h.bits) : device_f16_to_float(h.bits);
}
template <bool BF16>
__device__ half_tag<BF16> narrow(float f) {
  return {BF16 ? device_float_to_bf16(f) : device_float_to_f16(f)};
}

// One element of any type as float32 on its way to a 16-bit format (rounded to odd where the
// float32 is not exact), and a float32 as any type (C++'s conversion).
template <class T>
__device__ float to_float_for_16(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, double>) {
    return device_round_to_odd(v);
  } else if constexpr (std::is_same_v<T, half_tag<true>> || std::is_same_v<T, half_tag<false>>) {
    return widen(v);
  } else {
    return device_round_to_odd(static_cast<std::int64_t>(v));
  }
}

template <class From, class To>
struct cast_16_fn {
  const From* in;
  To* out;
  __device__ void operator()(std::int64_t i) const {
    if constexpr (std::is_same_v<To, half_tag<true>> || std::is_same_v<To, half_tag<false>>) {
      out[i] = narrow<std::is_same_v<To, half_tag<true>>>(to_float_for_16(in[i]));
    } else if constexpr (std::is_same_v<From, half_tag<true>> || std::is_same_v<From, half_tag<false>>) {
      out[i] = static_cast<To>(widen(in[i]));  // exact into float32, then C++'s conversion
    } else {
      out[i] = static_cast<To>(in[i]);  // not sent here (launch_cast's pairs), but instantiated
    }
  }
};

template <class F>
int with_any_type(scalar_type type, F&& f) {
  switch (type) {
    case scalar_type::f16: return f(half_tag<false>{});
    case scalar_type::bf16: return f(half_tag<true>{});
    default: return with_type(type, std::forward<F>(f));
  }
}

template <bool BF16>
struct reduce_n_16_fn {
  input_table ins;
  int n;
  bool mean;
  std::uint16_t* out;
  __device__ void operator()(std::int64_t i) const {
    float acc = widen(half_tag<BF16>{static_cast<const std::uint16_t*>(ins.ptr[0])[i]});
    for (int r = 1; r < n; ++r) acc += widen(half_tag<BF16>{static_cast<const std::uint16_t*>(ins.ptr[r])[i]});
    if (mean) acc /= static_cast<float>(n);
    out[i] = narrow<BF16>(acc).bits;
  }
};

}  // namespace

bool is_16bit(scalar_type type) { return type == scalar_type::f16 || type == scalar_type::bf16; }

int launch_cast_16(const void* in, scalar_type from, void* out, scalar_type to, std::int64_t count, void* stream) {
  if (count <= 0) return 0;
  if (!is_16bit(from) && !is_16bit(to)) return launch_cast(in, from, out, to, count, stream);
  return with_any_type(from, [&](auto from_value) {
    using From = decltype(from_value);
    return with_any_type(to, [&](auto to_value) {
      using To = decltype(to_value);
      if constexpr (std::is_same_v<From, To>) {
        const auto bytes = static_cast<std::size_t>(count) * sizeof(std::uint16_t);
        return static_cast<int>(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice,
                                                static_cast<cudaStream_t>(stream)));
      } else {
        return launch_elementwise(count, cast_16_fn<From, To>{static_cast<const From*>(in), static_cast<To*>(out)},
                                  stream);
      }
    });
  });
}

int launch_reduce_n_16(const void* const* ins, int n, void* out, std::int64_t count, scalar_type type,
                       reduce_kind op, void* stream) {
  if (count <= 0) return 0;
  if (!is_16bit(type) || ins == nullptr || n < 1 || n > max_reduce_inputs) return invalid();
  input_table table{};
  for (int r = 0; r < n; ++r) table.ptr[r] = ins[r];
  const bool mean = op == reduce_kind::mean;
  auto* o = static_cast<std::uint16_t*>(out);
  if (type == scalar_type::bf16) return launch_elementwise(count, reduce_n_16_fn<true>{table, n, mean, o}, stream);
  return launch_elementwise(count, reduce_n_16_fn<false>{table, n, mean, o}, stream);
}

}  // namespace troupe::kernels::cuda
