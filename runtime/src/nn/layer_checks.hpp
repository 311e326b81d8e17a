#pragma once

// Private to runtime/src/nn: what the layers check of their inputs, how they reach the host, and
// the window arithmetic the convolution and pooling layers share.

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "troupe/dtype.hpp"
#include "troupe/nn/layer.hpp"
#include "troupe/tensor.hpp"

namespace troupe::nn::detail {

/// A layer's variable: "<layer>/<what>", or `what` for a layer without a name.
inline std::string variable_name(const std::string& layer, const char* what) {
  return layer.empty() ? std::string(what) : layer + "/" + what;
}

/// `value`, when it is positive; otherwise std::invalid_argument, "<who>: <what> is <value>
/// (expected a positive number)".
inline int positive(const char* who, int value, const char* what) {
  if (value <= 0) {
    throw std::invalid_argument(std::string(who) + ": " + what + " is " + std::to_string(value) +
                                " (expected a positive number)");
  }
  return value;
}

/// `value`, when both its sizes are positive; otherwise std::invalid_argument naming `who` and `what`.
inline Size2 positive(const char* who, Size2 value, const char* what) {
  if (value.height <= 0 || value.width <= 0) {
    throw std::invalid_argument(std::string(who) + ": " + what + " is " + std::to_string(value.height) + "x" +
                                std::to_string(value.width) + " (expected positive sizes)");
  }
  return value;
}

/// `dtype`, when it is float32 or float64; otherwise std::invalid_argument naming `who`.
inline DType float_dtype(const char* who, DType dtype) {
  if (dtype != DType::f32 && dtype != DType::f64) {
    throw std::invalid_argument(std::string(who) + ": dtype " + std::string(dtype_name(dtype)) +
                                " (expected float32 or float64)");
  }
  return dtype;
}

/// Throws std::invalid_argument, "<who>: input of shape [..] (expected <expected_text>)", unless
/// `shape` has the rank of `expected` and its sizes where `expected` gives one (-1 in `shape`,
/// unknown, matches anything).
inline void check_input_shape(const std::string& who, const Shape& shape, const Shape& expected,
                              const std::string& expected_text) {
  bool ok = shape.size() == expected.size();
  for (std::size_t d = 0; ok && d < shape.size(); ++d) {
    ok = expected[d] < 0 || shape[d] < 0 || shape[d] == expected[d];
  }
  if (!ok) {
    throw std::invalid_argument(who + ": input of shape " + shape_to_string(shape) + " (expected " + expected_text +
                                ")");
  }
}

/// Throws unless `x` is float32 or float64 and, when `dtype` is given, that dtype.
inline void check_float_input(const std::string& who, const Tensor& x, const DType* dtype = nullptr) {
  if (x.dtype() != DType::f32 && x.dtype() != DType::f64) {
    throw std::invalid_argument(who + ": input is " + std::string(dtype_name(x.dtype())) +
                                " (expected float32 or float64)");
  }
  if (dtype != nullptr && x.dtype() != *dtype) {
    throw std::invalid_argument(who + ": input is " + std::string(dtype_name(x.dtype())) + " but the layer's variables are " +
                                std::string(dtype_name(*dtype)) + " (expected one dtype: cast the input)");
  }
}

/// Throws unless `grad` has the shape and dtype of `output`.
inline void check_grad_output(const std::string& who, const Tensor& grad, const Tensor& output) {
  if (grad.shape() != output.shape() || grad.dtype() != output.dtype()) {
    throw std::invalid_argument(who + ": grad_output is " + std::string(dtype_name(grad.dtype())) + " " +
                                shape_to_string(grad.shape()) + " (expected the output's " +
                                std::string(dtype_name(output.dtype())) + " " + shape_to_string(output.shape()) + ")");
  }
}

/// `t` in host memory (a copy when it is on a GPU).
inline Tensor on_host(const Tensor& t) { return t.is_gpu() ? t.to(Device()) : t; }

/// `t` moved to the device of `like` (nothing when both are on the host).
inline Tensor like_device(const Tensor& t, const Tensor& like) { return like.is_gpu() ? t.to(like.device()) : t; }

/// One spatial axis of a window: output size and the padding before the first window.
struct Window {
  std::int64_t out = 0;
  std::int64_t pad_before = 0;
};

/// TensorFlow's arithmetic: valid: floor((in - size) / stride) + 1 (0 when the window is larger);
/// same: ceil(in / stride), padded by max((out - 1) * stride + size - in, 0), half of it (rounded
/// down) before. An unknown `in` (-1) gives an unknown output.
inline Window window(std::int64_t in, std::int64_t size, std::int64_t stride, Padding padding) {
  if (in < 0) return {-1, 0};
  if (padding == Padding::valid) return {in < size ? 0 : (in - size) / stride + 1, 0};
  const std::int64_t out = (in + stride - 1) / stride;
  const std::int64_t total = std::max<std::int64_t>((out - 1) * stride + size - in, 0);
  return {out, total / 2};
}

}  // namespace troupe::nn::detail

namespace troupe::nn::detail {

/// A shape as Keras prints it, None for unknown sizes: "(None, 13, 13, 8)"; "?" for an unknown rank.
inline std::string keras_shape(const Shape& shape) {
  if (shape.empty()) return "?";
  std::string out = "(";
  for (std::size_t d = 0; d < shape.size(); ++d) {
    out += (d > 0 ? ", " : "") + (shape[d] < 0 ? std::string("None") : std::to_string(shape[d]));
  }
  return out + ")";
}

}  // namespace troupe::nn::detail
