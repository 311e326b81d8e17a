#pragma once

#include <string>

#include "troupe/nn/layer.hpp"
#include "troupe/tensor.hpp"

namespace troupe::nn {

/// [batch, d1, d2, ...] -> [batch, d1·d2·...], in row-major order, so a channels_last image
/// flattens as Keras's does (tf.keras.layers.Flatten). A reshape: no copy, on any device.
class Flatten : public Layer {
 public:
  explicit Flatten(std::string name = "") : Layer(std::move(name)) {}

  const char* class_name() const override { return "Flatten"; }
  const char* default_name() const override { return "flatten"; }
  /// Any rank >= 1.
  Shape input_shape() const override { return {}; }
  Shape output_shape(const Shape& input_shape) const override;

 protected:
  Tensor call(const Tensor& x, const CallContext& ctx) const override;
  LayerGradients gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output, const CallContext& ctx,
                           bool need_input) const override;
  std::string config_json() const override { return "{}"; }
};

}  // namespace troupe::nn
