#pragma once

// The runtime's one mapping onto the element vocabulary of the layers below (troupe/base):
// DType to scalar_type, ReduceOp to reduce_kind, and a tensor as a participant of check_agree.

#include <string_view>

#include "troupe/base/elements.hpp"
#include "troupe/distribute/reduce_op.hpp"
#include "troupe/dtype.hpp"
#include "troupe/tensor.hpp"

namespace troupe::detail {

/// DType and scalar_type list the element types in one order.
constexpr base::scalar_type to_scalar_type(DType dtype) noexcept {
  static_assert(static_cast<int>(DType::f32) == static_cast<int>(base::scalar_type::f32) &&
                static_cast<int>(DType::f64) == static_cast<int>(base::scalar_type::f64) &&
                static_cast<int>(DType::i32) == static_cast<int>(base::scalar_type::i32) &&
                static_cast<int>(DType::i64) == static_cast<int>(base::scalar_type::i64) &&
                static_cast<int>(DType::f16) == static_cast<int>(base::scalar_type::f16) &&
                static_cast<int>(DType::bf16) == static_cast<int>(base::scalar_type::bf16));
  return static_cast<base::scalar_type>(dtype);
}

constexpr base::reduce_kind to_reduce_kind(distribute::ReduceOp op) noexcept {
  return op == distribute::ReduceOp::sum ? base::reduce_kind::sum : base::reduce_kind::mean;
}

/// `t`, sent by `who`, for base::check_agree.
inline base::sent_tensor sent(std::string_view who, const Tensor& t, std::string_view verb = "sent") {
  return base::sent_tensor{who, to_scalar_type(t.dtype()), t.shape(), verb};
}

}  // namespace troupe::detail
