#pragma once

#include <string>

#include "troupe/nn/layer.hpp"
#include "troupe/tensor.hpp"

namespace troupe::nn {

/// Applies an activation function elementwise (tf.keras.layers.Activation, class name
/// "Activation"): "linear" (the identity), "relu", "gelu" (Keras's default, approximate=False:
/// x · Φ(x) = 0.5 · x · (1 + erf(x / √2))), "tanh", "sigmoid", and "softmax" over the last axis.
///
/// The C++ class is ActivationLayer because nn::Activation already names the enum of Dense's
/// fused activation (none or relu). Inputs of any shape, float32 or float64; no variables.
/// Computed on the host (GPU tensors are copied there and the output back).
class ActivationLayer : public Layer {
 public:
  /// `activation` is one of the names above (std::invalid_argument naming the others otherwise).
  explicit ActivationLayer(std::string activation, std::string name = "");

  const char* class_name() const override { return "Activation"; }
  const char* default_name() const override { return "activation"; }
  /// Any shape.
  Shape input_shape() const override { return {}; }
  /// The input's shape (softmax needs a rank of at least 1).
  Shape output_shape(const Shape& input_shape) const override;

  /// The activation's name, as given.
  const std::string& activation() const noexcept { return activation_; }

 protected:
  Tensor call(const Tensor& x, const CallContext& ctx) const override;
  LayerGradients gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output, const CallContext& ctx,
                           bool need_input) const override;
  std::string config_json() const override;

 private:
  enum class Kind { linear, relu, gelu, tanh, sigmoid, softmax };
  Kind kind_;
  std::string activation_;
};

/// GELU, elementwise: x · Φ(x) with Φ the standard normal distribution function (erf form).
/// float32 or float64.
Tensor gelu(const Tensor& x);
/// The gradient of gelu at x: grad · (Φ(x) + x · φ(x)).
Tensor gelu_grad(const Tensor& grad, const Tensor& x);

}  // namespace troupe::nn
