#pragma once

// The element vocabulary every layer shares: the element types the kernels, the collectives and
// the checkpoint format understand, the reductions, their names and sizes, and the one message
// for participants of a collective that disagree. The runtime maps its DType and ReduceOp onto
// these in one place (runtime/src/elements.hpp).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::base {

/// Element types, in troupe::DType's order. f16 (IEEE binary16) and bf16 (bfloat16) are tensors'
/// element types (mixed precision) and also the wire formats of compressed float32 gradients on
/// the cross-worker ring (CommunicationOptions::compression).
enum class scalar_type : std::uint8_t { f32, f64, i32, i64, f16, bf16 };
/// Reductions of a collective.
enum class reduce_kind : std::uint8_t { sum, mean };

/// Bytes of one element.
constexpr std::size_t scalar_size(scalar_type t) noexcept {
  switch (t) {
    case scalar_type::f32: return 4;
    case scalar_type::f64: return 8;
    case scalar_type::i32: return 4;
    case scalar_type::i64: return 8;
    case scalar_type::f16: return 2;
    case scalar_type::bf16: return 2;
  }
  return 0;
}

/// "float32", "float64", "int32", "int64", "float16", "bfloat16" (TensorFlow's names).
constexpr const char* scalar_name(scalar_type t) noexcept {
  switch (t) {
    case scalar_type::f32: return "float32";
    case scalar_type::f64: return "float64";
    case scalar_type::i32: return "int32";
    case scalar_type::i64: return "int64";
    case scalar_type::f16: return "float16";
    case scalar_type::bf16: return "bfloat16";
  }
  return "?";
}

/// "SUM", "MEAN" (tf.distribute.ReduceOp's names).
constexpr const char* reduce_name(reduce_kind k) noexcept { return k == reduce_kind::sum ? "SUM" : "MEAN"; }

/// "[4, 2]".
std::string shape_string(const std::vector<std::int64_t>& shape);

/// One participant's tensor in a comparison: who sent it, its element type and shape, and the
/// verb of the message ("sent" by a replica or a worker, "is" for a part of a concat).
struct sent_tensor {
  std::string_view who;  ///< "replica 3", "/job:worker/replica:0/task:1", "part 2"
  scalar_type type;
  const std::vector<std::int64_t>& shape;
  std::string_view verb = "sent";
};

/// Checks that `other` agrees with `first` on element type, rank and every dimension but
/// `free_axis` (-1: every dimension). When not, throws std::invalid_argument with the message
/// "<op>: <first.who> sent <type> tensor of shape <shape>, <other.who> sent <type> tensor of shape
/// <shape>" followed by `hint` (what may differ, or how to fix it). Every comparison of
/// participants' tensors in troupe goes through it, so they all speak alike.
void check_agree(std::string_view op, const sent_tensor& first, const sent_tensor& other, int free_axis,
                 std::string_view hint);

}  // namespace troupe::base
