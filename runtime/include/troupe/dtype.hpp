#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace troupe {

/// Element type of a Tensor.
enum class DType { f32, f64, i32, i64 };

/// Returns "float32", "float64", "int32" or "int64", as TensorFlow names them.
std::string_view dtype_name(DType dtype);

/// Returns the size of one element in bytes.
std::size_t dtype_size(DType dtype);

/// Maps a C++ element type to its DType: float, double, and signed integers of 32 or 64 bits.
template <class T, class = void>
struct dtype_of {};
template <>
struct dtype_of<float> : std::integral_constant<DType, DType::f32> {};
template <>
struct dtype_of<double> : std::integral_constant<DType, DType::f64> {};
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
