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

/// `d` as a float32 rounded to odd: truncated toward zero, with the lowest mantissa bit set when
/// anything was cut off (NaN and infinities kept, a magnitude beyond float32's largest becomes the
/// largest). Rounding that float32 to f16 or bf16 (nearest even) then gives the correctly rounded
/// 16-bit value of `d` (float32 keeps more than two bits beyond either format, which is what
/// rounding to odd needs): a direct float64 -> float32 -> 16-bit cast could round twice.
inline float float_round_to_odd(double d) noexcept {
  std::uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  const auto sign = static_cast<std::uint32_t>(u >> 32) & 0x80000000u;
  const std::uint64_t mant = u & 0x000fffffffffffffull;
  const int exp = static_cast<int>((u >> 52) & 0x7ffu);
  if (exp == 0x7ff) {  // infinity, or NaN (quiet, its top payload bits kept)
    return detail::float_of(sign | 0x7f800000u | (mant != 0 ? 0x00400000u | static_cast<std::uint32_t>(mant >> 29) : 0u));
  }
  if (exp == 0 && mant == 0) return detail::float_of(sign);  // +-0
  const int e = exp == 0 ? -1022 : exp - 1023;                 // unbiased exponent
  const std::uint64_t sig = exp == 0 ? mant : (mant | (1ull << 52));  // value = sig * 2^(e - 52)
  if (e > 127) return detail::float_of(sign | 0x7f7fffffu);     // beyond float32: its largest (odd)
  if (e >= -126) {  // a float32 normal: keep 23 of the 52 mantissa bits
    const std::uint32_t sticky = (sig & ((1ull << 29) - 1)) != 0 ? 1u : 0u;
    return detail::float_of(sign | (static_cast<std::uint32_t>(e + 127) << 23) |
                            static_cast<std::uint32_t>((sig >> 29) & 0x007fffffu) | sticky);
  }
  // A float32 denormal, m * 2^-149: sig * 2^(e - 52) = (sig >> shift) * 2^-149.
  const int shift = 29 + (-126 - e);
  if (shift >= 64) return detail::float_of(sign | 1u);  // nonzero, below the smallest denormal
  const std::uint32_t sticky = (sig & ((1ull << shift) - 1)) != 0 ? 1u : 0u;
  return detail::float_of(sign | static_cast<std::uint32_t>(sig >> shift) | sticky);
}

/// `v` as a float32 rounded to odd (exact below 2^24), for the same use.
inline float float_round_to_odd(std::uint64_t v, bool negative = false) noexcept {
  const std::uint32_t sign = negative ? 0x80000000u : 0u;
  if (v < (1ull << 24)) return detail::float_of(sign | detail::bits_of(static_cast<float>(v)));
  const int top = 63 - __builtin_clzll(v);  // 24..63
  const int shift = top - 23;
  const std::uint32_t sticky = (v & ((1ull << shift) - 1)) != 0 ? 1u : 0u;
  return detail::float_of(sign | (static_cast<std::uint32_t>(top + 127) << 23) |
                          (static_cast<std::uint32_t>(v >> shift) & 0x007fffffu) | sticky);
}
inline float float_round_to_odd(std::int64_t v) noexcept {
  const std::uint64_t mag = v < 0 ? 0 - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
  return float_round_to_odd(mag, v < 0);
}

/// Rounds `count` float32 values to `type` (f16 or bf16) bits; std::invalid_argument otherwise.
/// Eight at a time with F16C (f16) or AVX2 (bf16) where the CPU has them, else SSE2 or the scalar
/// code: the same bits on every path.
void compress_range(const float* in, std::uint16_t* out, std::int64_t count, scalar_type type);

/// Widens `count` `type` (f16 or bf16) values to float32 (exact); std::invalid_argument otherwise.
/// F16C or SSE2 where present, with the same bits.
void decompress_range(const std::uint16_t* in, float* out, std::int64_t count, scalar_type type);

}  // namespace troupe::kernels
