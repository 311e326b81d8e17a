#pragma once

// The CUDA kernels of troupe's GPU path, callable from ordinary C++ (no CUDA syntax here).
//
// Conventions for every launch_* function:
// - pointers are device pointers on the current CUDA device (the caller has called cudaSetDevice);
// - `stream` is a cudaStream_t (nullptr: the legacy default stream); launches are asynchronous;
// - `type` names the element type (base::scalar_type: f32, f64, i32, i64);
// - the return value is the cudaError_t of the launch as an int (0: success); a count of 0
//   launches nothing and returns 0; an unsupported type returns cudaErrorInvalidValue (1);
// - scalars come as double (`f`) and int64 (`i`): floating types use f, integer types use i.
// - the arithmetic is the same as the CPU's (no fused multiply-add: kernels are built with
//   --fmad=false), so a GPU step computes what a CPU step computes, element for element.

#include <cstdint>

#include "troupe/base/elements.hpp"
#include "troupe/kernels/multi_update.hpp"

namespace troupe::kernels::cuda {

using base::reduce_kind;
using base::scalar_type;

/// Elementwise binary operations.
enum class binary_op : int { add = 0, sub = 1, mul = 2, div = 3 };

/// Sets `count` elements at `data` to `value` (converted to the element type).
int launch_fill(void* data, std::int64_t count, int type_code, double value, void* stream);

/// data[i] *= factor for `count` elements.
int launch_scale(void* data, std::int64_t count, int type_code, double factor, void* stream);

/// out[i] = a[i] op b[i]. Integer division truncates toward zero; an integer division by zero
/// writes 0 to that element and sets *div_by_zero (a device int, may be nullptr) to 1.
int launch_binary(binary_op op, const void* a, const void* b, void* out, std::int64_t count, scalar_type type,
                  int* div_by_zero, void* stream);

/// out[i] = a[i] op s, or s op a[i] when scalar_first. The scalar is `f` for floating types and
/// `i` for integer types. Division by zero as in launch_binary.
int launch_binary_scalar(binary_op op, const void* a, double f, std::int64_t i, bool scalar_first, void* out,
                         std::int64_t count, scalar_type type, int* div_by_zero, void* stream);

/// out[i] = static_cast<To>(in[i]) (the C++ conversion; float to int truncates).
int launch_cast(const void* in, scalar_type from, void* out, scalar_type to, std::int64_t count, void* stream);

/// out[k] = ins[0][k] + ins[1][k] + ... + ins[n-1][k], summed left to right in that order, then
/// divided by n (as the element type, `acc /= T(n)`) when op is mean: the same bits as the CPU's
/// kernels::reduce_range. `ins` is a HOST array of n device pointers, 1 <= n <= 64; out may
/// alias ins[0].
int launch_reduce_n(const void* const* ins, int n, void* out, std::int64_t count, scalar_type type, reduce_kind op,
                    void* stream);

/// Sum along the middle axis of an [outer, along, inner] row-major array into [outer, inner]:
/// out[o, k] = sum over a = 0..along-1, in that order, of in[o, a, k]; along = 0 writes zeros.
int launch_reduce_axis(const void* in, void* out, std::int64_t outer, std::int64_t along, std::int64_t inner,
                       scalar_type type, void* stream);

// Optimizer updates, float32 or float64 only. Every coefficient is converted to the element type
// T first (static_cast<T>(x)), then:

/// out_w = w - lr * g
int launch_sgd(const void* w, const void* g, void* out_w, std::int64_t count, scalar_type type, double lr,
               void* stream);

/// out_vel = m * vel - lr * g;
/// out_w = nesterov ? w + (m * out_vel - lr * g) : w + out_vel
int launch_sgd_momentum(const void* w, const void* g, const void* vel, void* out_w, void* out_vel, std::int64_t count,
                        scalar_type type, double lr, double momentum, bool nesterov, void* stream);

/// out_m = b1 * m + one_minus_b1 * g;  out_v = b2 * v + one_minus_b2 * (g * g)  (g squared first, as on the CPU);
/// out_w = w - lr_t * out_m / (sqrt(out_v) + eps)
int launch_adam(const void* w, const void* g, const void* m, const void* v, void* out_w, void* out_m, void* out_v,
                std::int64_t count, scalar_type type, double lr_t, double b1, double one_minus_b1, double b2,
                double one_minus_b2, double eps, void* stream);

using kernels::update_kind;
using kernels::update_tensor;
/// The coefficients of launch_sgd, launch_sgd_momentum and launch_adam (each kind reads its own).
struct update_coefficients {
  double lr;  ///< lr for sgd and momentum, lr_t for adam
  double momentum;
  bool nesterov;
  double b1, one_minus_b1, b2, one_minus_b2, eps;
};
/// Updates n tensors of one type with one launch per group of up to 24 tensors, each element by
/// the same formula as launch_sgd / launch_sgd_momentum / launch_adam (the same bits). `tensors`
/// is a HOST array; tensors of 0 elements are skipped.
int launch_multi_update(update_kind kind, const update_tensor* tensors, int n, scalar_type type,
                        const update_coefficients& c, void* stream);

// The kernels behind troupe::nn on GPU tensors (float32 or float64, row-major). Matrix products
// are cuBLASLt's (runtime/src/gpu/gpu_blas.cpp).

/// out[r, j] = x[r, j] + bias[j] for a [rows, cols] x, then max(., 0) when relu.
int launch_bias_activation(const void* x, const void* bias, void* out, std::int64_t rows, std::int64_t cols, bool relu,
                           scalar_type type, void* stream);

/// out[i] = max(x[i], 0).
int launch_relu(const void* x, void* out, std::int64_t count, scalar_type type, void* stream);

/// out[i] = output[i] > 0 ? grad[i] : 0.
int launch_relu_grad(const void* grad, const void* output, void* out, std::int64_t count, scalar_type type,
                     void* stream);

/// Row-wise softmax of [rows, cols], the row's maximum subtracted first.
int launch_softmax(const void* x, void* out, std::int64_t rows, std::int64_t cols, scalar_type type, void* stream);

/// out[r] (int64) = the first index of the largest value of row r of [rows, cols].
int launch_argmax(const void* x, std::int64_t* out, std::int64_t rows, std::int64_t cols, scalar_type type,
                  void* stream);

/// A training step's table of doubles on the device (`size` of them), completed in place:
/// table[0] += *loss (a float32 or float64 scalar); table[loss_at] += *loss * loss_scale when
/// loss_at >= 0; and, when `predicted` (int64 [rows], argmax's output) is given, table[1] += the
/// number of rows whose predicted class equals their label (labels int32 or int64 [rows]).
int launch_step_table(double* table, std::int64_t size, const void* loss, scalar_type loss_type, std::int64_t loss_at,
                      double loss_scale, const std::int64_t* predicted, const void* labels, scalar_type label_type,
                      std::int64_t rows, void* stream);

/// Sparse softmax cross-entropy of logits [rows, cols] against labels [rows] (int32 or int64):
/// per_example[r] = log-sum-exp(z_r) - z_r[label_r] (the row's maximum subtracted first); when
/// `grad` is given, grad[r, j] = scale * (softmax(z_r)[j] - (j == label_r)); when `total` (one
/// element on the device) is given, *total = scale * the sum of per_example over the rows, added
/// in double in a fixed order. A label outside 0..cols-1 makes its row's loss NaN (its gradient
/// the scaled softmax) and, when `bad_row` is given (a device word the caller set to all ones),
/// leaves the smallest such row there. rows may be 0 (the total is then 0).
int launch_sparse_softmax_xent(const void* logits, const void* labels, scalar_type label_type, void* per_example,
                               void* grad, void* total, std::int64_t rows, std::int64_t cols, double scale,
                               scalar_type type, unsigned long long* bad_row, void* stream);

/// Squared error: per_example[r] = the mean over the row's cols of (p - t)^2; grad (optional) =
/// (p - t) * 2 * scale / cols; *total (optional) = scale * the sum of per_example, as above.
int launch_squared_error(const void* predictions, const void* targets, void* per_example, void* grad, void* total,
                         std::int64_t rows, std::int64_t cols, double scale, scalar_type type, void* stream);

// float16 and bfloat16 (base::scalar_type::f16, bf16).

/// True for f16 and bf16.
bool is_16bit(scalar_type type);

/// launch_cast where `from` or `to` (or both) is f16 or bf16: the bits of the CPU's Tensor::cast
/// (kernels/half_kernels.hpp, in integer arithmetic): into 16 bits rounded once to nearest even
/// (float64 and integers through float32 rounded to odd), out of them exact into float32, then
/// C++'s conversion. launch_cast sends these pairs here.
int launch_cast_16(const void* in, scalar_type from, void* out, scalar_type to, std::int64_t count, void* stream);

/// launch_reduce_n for f16 or bf16: each element summed in float32 in input order 0..n-1,
/// divided by n in float32 for mean, rounded once: the bits of the CPU's kernels::reduce_range.
/// launch_reduce_n sends these types here.
int launch_reduce_n_16(const void* const* ins, int n, void* out, std::int64_t count, scalar_type type,
                       reduce_kind op, void* stream);

}  // namespace troupe::kernels::cuda
