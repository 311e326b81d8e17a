#pragma once

#include <cstdint>
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
/// variance taken over the last axis of each row. gamma [units] starts at ones and beta [units]
/// at zeros, of `dtype` (float32 or float64). Inputs of any rank >= 2 whose last axis is `units`.
/// The statistics are per example, so replicas need no exchange. Computed on the host (GPU
/// tensors are copied there and the output back).
class LayerNormalization : public Layer {
 public:
  /// units must be positive and epsilon positive (std::invalid_argument).
  explicit LayerNormalization(int units, double epsilon = 1e-3, std::string name = "", DType dtype = DType::f32);

  const char* class_name() const override { return "LayerNormalization"; }
  const char* default_name() const override { return "layer_normalization"; }
  std::vector<std::pair<std::string, Variable>> weights() const override { return {{"gamma", gamma_}, {"beta", beta_}}; }
  /// Any rank >= 2 (output_shape checks the last axis).
  Shape input_shape() const override { return {}; }
  /// The input's shape, whose last axis must be units.
  Shape output_shape(const Shape& input_shape) const override;

  /// The scale, [units].
  const Variable& gamma() const noexcept { return gamma_; }
  /// The offset, [units].
  const Variable& beta() const noexcept { return beta_; }

 protected:
  Tensor call(const Tensor& x, const CallContext& ctx) const override;
  LayerGradients gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output, const CallContext& ctx,
                           bool need_input) const override;
  std::string config_json() const override;

 private:
  void check_input(const Tensor& x) const;

  int units_;
  double epsilon_;
  DType dtype_;
  Variable gamma_;
  Variable beta_;
};

}  // namespace troupe::nn
