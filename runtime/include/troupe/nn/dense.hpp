#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/nn/layer.hpp"
#include "troupe/nn/mixed_precision.hpp"
#include "troupe/nn/ops.hpp"
#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe::nn {

/// A fully connected layer, activation(x · kernel + bias) (tf.keras.layers.Dense). Its kernel
/// [input_dim, units] (Glorot-uniform from `seed`) and bias [units] (zeros) are float32 Variables
/// created by the constructor: inside strategy.scope() they are mirrored, one identical component
/// per replica. Copies share the variables. An input of higher rank, [batch, ..., input_dim], is
/// mapped on its last axis, every leading position alike, as Keras's Dense maps it.
///
/// forward and backward are safe to call from every replica at once inside Strategy::run: each
/// reads its own component of the variables and nothing else is written. GPU tensors are computed
/// on their GPU.
///
/// The layer takes the global mixed-precision policy current when it is constructed
/// (mixed_precision::global_policy()). Under "mixed_float16" or "mixed_bfloat16" its variables
/// stay float32 and it computes in the 16-bit type, as Keras's Dense does: the input, the kernel
/// and the bias are rounded to that type, the product is accumulated in float32 (on the CPU) and
/// the output rounded to it; the gradients of the variables come back float32 (the 16-bit
/// gradient through the cast). A float input of another dtype is cast to the compute dtype, so a
/// float32 layer after mixed ones computes in float32.
class Dense : public Layer {
 public:
  /// input_dim and units must be positive (std::invalid_argument). `name` prefixes the variables'
  /// names ("<name>/kernel"); Sequential names unnamed layers dense_0, dense_1...
  Dense(int input_dim, int units, Activation activation = Activation::none, std::uint64_t seed = 0,
        std::string name = "");

  using Layer::backward;
  /// Gradients for grad_output [batch, units], given the x and output of the forward call.
  DenseGradients backward(const Tensor& x, const Tensor& output, const Tensor& grad_output,
                          bool need_input = true) const;

  /// Width of the inputs.
  int input_dim() const noexcept { return input_dim_; }
  /// Width of the outputs.
  int units() const noexcept { return units_; }
  /// The policy the layer was made under (its dtype_policy in Keras).
  const mixed_precision::Policy& dtype_policy() const noexcept { return policy_; }
  /// The dtype of its outputs and of its computation: float32, float16 or bfloat16.
  DType compute_dtype() const noexcept { return policy_.compute_dtype(); }
  /// The activation after the affine map.
  Activation activation() const noexcept { return activation_; }
  /// The kernel variable, [input_dim, units].
  const Variable& kernel() const noexcept { return kernel_; }
  /// The bias variable, [units].
  const Variable& bias() const noexcept { return bias_; }
  /// {kernel, bias}, the order of backward's gradients.
  std::vector<Variable> trainable_variables() const { return {kernel_, bias_}; }

  const char* class_name() const override { return "Dense"; }
  const char* default_name() const override { return "dense"; }
  /// {"kernel", kernel}, {"bias", bias}.
  std::vector<std::pair<std::string, Variable>> weights() const override;
  /// [-1, input_dim].
  Shape input_shape() const override { return {-1, input_dim_}; }
  /// [..., units] for [..., input_dim].
  Shape output_shape(const Shape& input_shape) const override;

 protected:
  /// activation(x · kernel + bias) for x [batch, input_dim].
  Tensor call(const Tensor& x, const CallContext& ctx) const override;
  LayerGradients gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output, const CallContext& ctx,
                           bool need_input) const override;
  std::string config_json() const override;
  bool records_itself() const override { return true; }

 private:
  int input_dim_;
  int units_;
  Activation activation_;
  std::uint64_t seed_;
  mixed_precision::Policy policy_;
  Variable kernel_;
  Variable bias_;
};

}  // namespace troupe::nn
