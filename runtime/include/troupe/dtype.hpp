#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "troupe/half.hpp"

namespace troupe {

/// Element type of a Tensor. f16 (IEEE binary16) and bf16 (bfloat16) store 2 bytes per element
/// (troupe::float16_t, troupe::bfloat16_t); their arithmetic on the CPU runs in float32, rounded
/// once per operation to the 16-bit format.
enum class DType { f32, f64, i32, i64, f16, bf16 };

/// Returns "float32", "float64", "int32", "int64", "float16" or "bfloat16", as TensorFlow names
/// them.
std::string_view dtype_name(DType dtype);

/// Returns the size of one element in bytes.
std::size_t dtype_size(DType dtype);

/// The DType TensorFlow calls `name` ("float32", "float16", "bfloat16"...); std::invalid_argument
/// listing the names otherwise.
DType dtype_from_name(std::string_view name);

/// True for f32, f64, f16 and bf16.
constexpr bool dtype_is_floating(DType dtype) noexcept { return dtype != DType::i32 && dtype != DType::i64; }

/// Maps a C++ element type to its DType: float, double, float16_t, bfloat16_t, and signed
/// integers of 32 or 64 bits.
template <class T, class = void>
struct dtype_of {};
template <>
struct dtype_of<float> : std::integral_constant<DType, DType::f32> {};
template <>
struct dtype_of<double> : std::integral_constant<DType, DType::f64> {};
template <>
struct dtype_of<float16_t> : std::integral_constant<DType, DType::f16> {};
template <>
struct dtype_of<bfloat16_t> : std::integral_constant<DType, DType::bf16> {};
template <class T>
struct dtype_of<T, std::enable_if_t<std::is_integral_v<T> && std::is_signed_v<T> &&
                                    !std::is_same_v<T, bool> && sizeof(T) == 4>>
    : std::integral_constant<DType, DType::i32> {};
template <class T>
struct dtype_of<T, std::enable_if_t<std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) == 8>>
    : std::integral_constant<DType, DType::i64> {};

/// The DType of the C++ element type T.
template <class T>
inline constexpr DType dtype_v = dtype_of<std::remove_cv_t<T>>::value;

}  // namespace troupe
