#pragma once

// The 16-bit wire formats of compressed cross-worker all-reduces: IEEE binary16 (f16) and
// bfloat16 (bf16), held as raw bits. Conversions from float32 round to nearest, ties to even, the
// way every IEEE conversion does by default (and numpy, TensorFlow and Horovod's fp16 compressor);
// they are written out bit by bit so that every compiler, instruction set and rounding-mode setting
// gives the same bits. NaN stays NaN (quiet, sign kept), infinities stay infinite, a float32 past
// the format's largest finite value becomes infinite, and values below the smallest normal become
// denormals (f16) or keep their denormal bits (bf16, which shares float32's exponent).

#include <cstdint>
#include <cstring>

#include "troupe/base/elements.hpp"

namespace troupe::kernels {

using base::scalar_type;

namespace detail {
inline std::uint32_t bits_of(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float float_of(std::uint32_t u) noexcept {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace detail

/// float32 -> bfloat16 bits, round to nearest even.
inline std::uint16_t float_to_bf16(float f) noexcept {
  std::uint32_t u = detail::bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // a carry into the exponent is the right rounding, up to infinity
  return static_cast<std::uint16_t>(u >> 16);
}

/// bfloat16 bits -> float32 (exact).
inline float bf16_to_float(std::uint16_t h) noexcept { return detail::float_of(static_cast<std::uint32_t>(h) << 16); }

/// float32 -> IEEE binary16 bits, round to nearest even.
inline std::uint16_t float_to_f16(float f) noexcept {
  const std::uint32_t u = detail::bits_of(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x03ffu));  // quiet NaN
  // 65520 lies halfway between 65504 (the largest f16, odd mantissa) and 65536: it and everything
  // above round to infinity.
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (a < 0x38800000u) {
    // Below 2^-14: an f16 denormal, m * 2^-24. In integer arithmetic (no FPU mode involved):
    // the float's significand with its implicit bit, shifted right by what separates its exponent
    // from 2^-24's, rounded to nearest even by the bits shifted out.
    const std::uint32_t exp = a >> 23;
    if (exp < 102) return sign;  // below 2^-25: rounds to zero (2^-25 itself is a tie to 0)
    const std::uint32_t sig = (a & 0x007fffffu) | 0x00800000u;
    const std::uint32_t shift = 126 - exp;  // 14..24
    std::uint32_t m = sig >> shift;
    const std::uint32_t rest = sig & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (m & 1u))) ++m;  // may carry into the smallest normal: right
    return static_cast<std::uint16_t>(sign | m);
  }
  // Normal: re-bias the exponent (127 -> 15) and round the 13 dropped bits to nearest even; a carry
  // out of the mantissa moves into the exponent, which is the correct rounding.
  a += 0xc8000fffu + ((a >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (a >> 13));
}

/// IEEE binary16 bits -> float32 (exact).
inline float f16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x03ffu;
  if (exp == 0) {
    const float mag = static_cast<float>(mant) * 0x1p-24f;  // exact: mant < 2^10
    return detail::float_of(sign | detail::bits_of(mag));
  }
  if (exp == 31) {
    if (mant == 0) return detail::float_of(sign | 0x7f800000u);  // infinity
    return detail::float_of(sign | 0x7fc00000u | (mant << 13));    // NaN, quieted (as IEEE converts)
  }
  return detail::float_of(sign | ((exp + 112u) << 23) | (mant << 13));
}

/// Rounds `count` float32 values to `type` (f16 or bf16) bits; std::invalid_argument otherwise.
/// Eight at a time with F16C (f16) or AVX2 (bf16) where the CPU has them, else SSE2 or the scalar
/// code: the same bits on every path.
void compress_range(const float* in, std::uint16_t* out, std::int64_t count, scalar_type type);

/// Widens `count` `type` (f16 or bf16) values to float32 (exact); std::invalid_argument otherwise.
/// F16C or SSE2 where present, with the same bits.
void decompress_range(const std::uint16_t* in, float* out, std::int64_t count, scalar_type type);

}  // namespace troupe::kernels
