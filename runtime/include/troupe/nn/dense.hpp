#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/nn/ops.hpp"
#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe::nn {

/// A fully connected layer, activation(x · kernel + bias) (tf.keras.layers.Dense). Its kernel
/// [input_dim, units] (Glorot-uniform from `seed`) and bias [units] (zeros) are float32 Variables
/// created by the constructor: inside strategy.scope() they are mirrored, one identical component
/// per replica. Copies share the variables.
///
/// forward and backward are safe to call from every replica at once inside Strategy::run: each
/// reads its own component of the variables and nothing else is written.
class Dense {
 public:
  /// input_dim and units must be positive (std::invalid_argument). `name` prefixes the variables'
  /// names ("<name>/kernel"); Sequential names unnamed layers dense_0, dense_1...
  Dense(int input_dim, int units, Activation activation = Activation::none, std::uint64_t seed = 0,
        std::string name = "");

  /// activation(x · kernel + bias) for x [batch, input_dim].
  Tensor forward(const Tensor& x) const;
  /// Gradients for grad_output [batch, units], given the x and output of the forward call.
  DenseGradients backward(const Tensor& x, const Tensor& output, const Tensor& grad_output,
                          bool need_input = true) const;

  /// Width of the inputs.
  int input_dim() const noexcept { return input_dim_; }
  /// Width of the outputs.
  int units() const noexcept { return units_; }
  /// The activation after the affine map.
  Activation activation() const noexcept { return activation_; }
  /// The name given to the constructor ("" when none).
  const std::string& name() const noexcept { return name_; }
  /// The kernel variable, [input_dim, units].
  const Variable& kernel() const noexcept { return kernel_; }
  /// The bias variable, [units].
  const Variable& bias() const noexcept { return bias_; }
  /// {kernel, bias}, the order of backward's gradients.
  std::vector<Variable> trainable_variables() const { return {kernel_, bias_}; }

 private:
  int input_dim_;
  int units_;
  Activation activation_;
  std::string name_;
  Variable kernel_;
  Variable bias_;
};

}  // namespace troupe::nn
