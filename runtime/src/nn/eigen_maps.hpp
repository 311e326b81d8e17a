#pragma once

// Private to runtime/src/nn: Eigen views over tensors' storage, and the argument checks the
// kernels share. Eigen stays out of the public headers.

#include <cstdint>
#include <stdexcept>
#include <string>

#include <Eigen/Core>

#include "troupe/tensor.hpp"

namespace troupe::nn::eigen {

template <class T>
using RowMajorMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using RowVector = Eigen::Matrix<T, 1, Eigen::Dynamic>;

/// A rank-2 tensor as a row-major matrix, without a copy.
template <class T>
Eigen::Map<const RowMajorMatrix<T>> matrix(const Tensor& t) {
  return {t.data<T>(), static_cast<Eigen::Index>(t.shape()[0]), static_cast<Eigen::Index>(t.shape()[1])};
}
/// A rank-2 tensor made with Tensor::empty and not yet shared, writable.
template <class T>
Eigen::Map<RowMajorMatrix<T>> matrix(Tensor& t) {
  return {t.mutable_data<T>(), static_cast<Eigen::Index>(t.shape()[0]), static_cast<Eigen::Index>(t.shape()[1])};
}
/// Any tensor as a 1-D array of its elements.
template <class T>
Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>> array(const Tensor& t) {
  return {t.data<T>(), static_cast<Eigen::Index>(t.num_elements())};
}
template <class T>
Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> array(Tensor& t) {
  return {t.mutable_data<T>(), static_cast<Eigen::Index>(t.num_elements())};
}
/// A rank-1 tensor as a row vector.
template <class T>
Eigen::Map<const RowVector<T>> row_vector(const Tensor& t) {
  return {t.data<T>(), static_cast<Eigen::Index>(t.num_elements())};
}
template <class T>
Eigen::Map<RowVector<T>> row_vector(Tensor& t) {
  return {t.mutable_data<T>(), static_cast<Eigen::Index>(t.num_elements())};
}

/// Calls f(T{}) with T float or double for an f32 or f64 dtype.
template <class F>
void dispatch_float(DType dtype, F&& f) {
  if (dtype == DType::f32) {
    f(float{});
  } else if (dtype == DType::f64) {
    f(double{});
  } else {
    throw std::logic_error("dispatch_float: " + std::string(dtype_name(dtype)) + " reached a float kernel");
  }
}

inline void check_float(const Tensor& t, const char* op) {
  if (t.dtype() != DType::f32 && t.dtype() != DType::f64) {
    throw std::invalid_argument(std::string(op) + ": got a " + std::string(dtype_name(t.dtype())) +
                                " tensor (expected float32 or float64)");
  }
}

inline void check_rank(const Tensor& t, int rank, const char* op, const char* what) {
  if (t.rank() != rank) {
    throw std::invalid_argument(std::string(op) + ": " + what + " has shape " + shape_to_string(t.shape()) +
                                " (expected rank " + std::to_string(rank) + ")");
  }
}

inline void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  if (a.dtype() != b.dtype()) {
    throw std::invalid_argument(std::string(op) + ": operands are " + std::string(dtype_name(a.dtype())) + " and " +
                                std::string(dtype_name(b.dtype())) + " (expected one dtype)");
  }
}

inline void check_same_shape(const Tensor& a, const Tensor& b, const char* op) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) {
    throw std::invalid_argument(std::string(op) + ": operands differ: " + std::string(dtype_name(a.dtype())) + " " +
                                shape_to_string(a.shape()) + " and " + std::string(dtype_name(b.dtype())) + " " +
                                shape_to_string(b.shape()) + " (expected one shape and dtype)");
  }
}

/// Integer labels ([rows] or [rows, 1], int32 or int64) as int64 [rows].
inline Tensor labels_as_i64(const Tensor& labels, std::int64_t rows, const char* op) {
  const bool shape_ok = (labels.rank() == 1 && labels.shape()[0] == rows) ||
                        (labels.rank() == 2 && labels.shape()[0] == rows && labels.shape()[1] == 1);
  if (!shape_ok || (labels.dtype() != DType::i32 && labels.dtype() != DType::i64)) {
    throw std::invalid_argument(std::string(op) + ": labels are " + std::string(dtype_name(labels.dtype())) + " " +
                                shape_to_string(labels.shape()) + " (expected int32 or int64 [" +
                                std::to_string(rows) + "] or [" + std::to_string(rows) + ", 1])");
  }
  Tensor flat = labels.reshape({rows});
  return flat.dtype() == DType::i64 ? flat : flat.cast(DType::i64);
}

}  // namespace troupe::nn::eigen
