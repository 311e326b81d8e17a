#pragma once

// The 16-bit floating element types of Tensor (DType::f16, DType::bf16), for reading and writing
// their elements: tensor.to_vector<float16_t>(), Tensor::from_vector<bfloat16_t>(...). They hold
// raw bits and do no arithmetic of their own (compute in float32: Tensor::cast, or float(x)).
// Conversions into them round to nearest, ties to even, as IEEE conversions, NumPy and TensorFlow
// do; NaN stays NaN, infinities stay infinite, and a value past the largest finite one becomes
// infinite. Conversions out of them are exact into float32 and float64 (an integer type truncates
// toward zero, as a C++ cast does).

#include <cstdint>
#include <type_traits>

namespace troupe {

namespace detail {
std::uint16_t float16_bits_of(float v) noexcept;
std::uint16_t float16_bits_of(double v) noexcept;
std::uint16_t float16_bits_of(std::int64_t v) noexcept;
std::uint16_t float16_bits_of(std::uint64_t v) noexcept;
float float16_value(std::uint16_t bits) noexcept;
std::uint16_t bfloat16_bits_of(float v) noexcept;
std::uint16_t bfloat16_bits_of(double v) noexcept;
std::uint16_t bfloat16_bits_of(std::int64_t v) noexcept;
std::uint16_t bfloat16_bits_of(std::uint64_t v) noexcept;
float bfloat16_value(std::uint16_t bits) noexcept;

// float and double as they are; integers widened to 64 bits (the conversion rounds once).
template <class T>
auto widened(T v) noexcept {
  if constexpr (std::is_floating_point_v<T>) {
    if constexpr (sizeof(T) <= sizeof(float)) {
      return static_cast<float>(v);
    } else {
      return static_cast<double>(v);  // long double: rounded to double first
    }
  } else if constexpr (std::is_signed_v<T>) {
    return static_cast<std::int64_t>(v);
  } else {
    return static_cast<std::uint64_t>(v);
  }
}
}  // namespace detail

/// IEEE 754 binary16 (TensorFlow's float16): 1 sign, 5 exponent and 10 mantissa bits; largest
/// finite value 65504.
struct float16_t {
  std::uint16_t bits = 0;  ///< the raw bits

  float16_t() = default;
  /// `v` rounded to nearest even (a value of magnitude 65520 or more becomes infinite).
  template <class T, std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, int> = 0>
  explicit float16_t(T v) noexcept : bits(detail::float16_bits_of(detail::widened(v))) {}
  /// The value with these bits.
  static float16_t from_bits(std::uint16_t b) noexcept {
    float16_t h;
    h.bits = b;
    return h;
  }
  /// The value as T (exact for float and double).
  template <class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
  explicit operator T() const noexcept {
    return static_cast<T>(detail::float16_value(bits));
  }
  /// Equal bits (so NaN == NaN when the bits match, and -0 != +0).
  friend bool operator==(float16_t a, float16_t b) noexcept { return a.bits == b.bits; }
  friend bool operator!=(float16_t a, float16_t b) noexcept { return a.bits != b.bits; }
};

/// bfloat16 (TensorFlow's bfloat16): the upper half of a float32, 1 sign, 8 exponent and 7
/// mantissa bits; float32's range with 8 bits of precision.
struct bfloat16_t {
  std::uint16_t bits = 0;  ///< the raw bits

  bfloat16_t() = default;
  /// `v` rounded to nearest even.
  template <class T, std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, int> = 0>
  explicit bfloat16_t(T v) noexcept : bits(detail::bfloat16_bits_of(detail::widened(v))) {}
  /// The value with these bits.
  static bfloat16_t from_bits(std::uint16_t b) noexcept {
    bfloat16_t h;
    h.bits = b;
    return h;
  }
  /// The value as T (exact for float and double).
  template <class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
  explicit operator T() const noexcept {
    return static_cast<T>(detail::bfloat16_value(bits));
  }
  /// Equal bits.
  friend bool operator==(bfloat16_t a, bfloat16_t b) noexcept { return a.bits == b.bits; }
  friend bool operator!=(bfloat16_t a, bfloat16_t b) noexcept { return a.bits != b.bits; }
};

}  // namespace troupe
