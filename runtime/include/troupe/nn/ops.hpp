#pragma once

#include <cstdint>

#include "troupe/dtype.hpp"
#include "troupe/tensor.hpp"

/// The CPU kernels behind troupe::nn, on Eigen (matrix products through Eigen::Map over the
/// tensors' storage). They take row-major tensors of float32 or float64 (float64 exists so
/// gradients can be checked tightly against finite differences), rank 2 except for the
/// elementwise relu; a wrong rank, shape or dtype throws std::invalid_argument naming the
/// operation, the shapes and what was expected. Every kernel returns a new tensor.
namespace troupe::nn {

/// The activation applied after a Dense layer's affine map.
enum class Activation { none, relu };

/// "none" or "relu".
const char* activation_name(Activation activation);

/// op(a) · op(b), where op transposes when asked: [m, k] · [k, n] -> [m, n].
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);

/// max(x, 0), elementwise.
Tensor relu(const Tensor& x);
/// The gradient of relu: grad where output > 0, else 0 (TensorFlow's convention at 0).
Tensor relu_grad(const Tensor& grad, const Tensor& output);

/// Softmax of each row, computed stably (the row's maximum is subtracted first).
Tensor softmax(const Tensor& logits);
/// The index of the largest value of each row of a [batch, n] tensor (the first of equal ones,
/// as in TensorFlow), as int64 [batch].
Tensor argmax(const Tensor& x);

/// activation(x · kernel + bias): x [batch, in], kernel [in, units], bias [units] -> [batch, units].
Tensor dense_forward(const Tensor& x, const Tensor& kernel, const Tensor& bias, Activation activation);

/// The gradients of a Dense layer's output with respect to its input and parameters.
struct DenseGradients {
  Tensor input;   ///< [batch, in]; left empty when not asked for
  Tensor kernel;  ///< [in, units]
  Tensor bias;    ///< [units]
};
/// Back-propagates grad_output [batch, units] through dense_forward, given its input x and its
/// output (relu's mask is output > 0). The input gradient is computed only when need_input.
DenseGradients dense_backward(const Tensor& x, const Tensor& kernel, const Tensor& output, const Tensor& grad_output,
                              Activation activation, bool need_input = true);

/// A [fan_in, fan_out] tensor drawn uniformly from ±sqrt(6 / (fan_in + fan_out)) (Glorot/Xavier
/// uniform), from a std::mt19937_64 seeded with `seed`: the same seed gives the same bits on
/// every replica, every run and every platform.
Tensor glorot_uniform(std::int64_t fan_in, std::int64_t fan_out, std::uint64_t seed, DType dtype = DType::f32);

/// Fraction of rows whose largest logit is at the label; labels int32 or int64, [batch] or
/// [batch, 1], or one-hot float rows of the logits' shape (the label is the row's largest). An
/// empty batch gives 0. Logits [batch, ..., classes] with integer labels [batch, ...] (a label per
/// position of a sequence) give the fraction of positions.
double accuracy(const Tensor& logits, const Tensor& labels);

}  // namespace troupe::nn
