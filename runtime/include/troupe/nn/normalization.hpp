#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/dtype.hpp"
#include "troupe/nn/layer.hpp"
#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe::nn {

/// Normalises each example over its last axis (tf.keras.layers.LayerNormalization with
/// axis=-1): y = gamma · (x - mean) / sqrt(variance + epsilon) + beta, the mean and (biased)
/// variance taken over the last axis of each row. gamma [units] (ones) and beta [units] (zeros),
/// of `dtype` (float32 or float64), are created by build() when the last axis's size is first
/// known (see Layer::build). Inputs of any rank >= 2. The statistics are per example, so
/// replicas need no exchange. Computed on the host (GPU tensors are copied there and the output
/// back).
class LayerNormalization : public Layer {
 public:
  /// epsilon must be positive (std::invalid_argument).
  explicit LayerNormalization(double epsilon = 1e-3, std::string name = "", DType dtype = DType::f32);

  const char* class_name() const override { return "LayerNormalization"; }
  const char* default_name() const override { return "layer_normalization"; }
  /// {"gamma", gamma}, {"beta", beta} once built; nothing before.
  std::vector<std::pair<std::string, Variable>> weights() const override;
  /// Any rank >= 2 (output_shape checks the last axis once built).
  Shape input_shape() const override { return {}; }
  /// The input's shape.
  Shape output_shape(const Shape& input_shape) const override;
  /// Creates gamma and beta for input_shape's last size (which must be known and positive).
  void build(const Shape& input_shape) const override;
  bool built() const override;

  /// The width normalised; -1 until built.
  int units() const;
  /// The scale, [units] (std::logic_error until built).
  const Variable& gamma() const;
  /// The offset, [units] (std::logic_error until built).
  const Variable& beta() const;

 protected:
  Tensor call(const Tensor& x, const CallContext& ctx) const override;
  LayerGradients gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output, const CallContext& ctx,
                           bool need_input) const override;
  std::string config_json() const override;

 private:
  struct State;  // what build() makes, shared by copies
  void check_input(const Tensor& x) const;

  double epsilon_;
  DType dtype_;
  std::shared_ptr<State> state_;
};

}  // namespace troupe::nn
