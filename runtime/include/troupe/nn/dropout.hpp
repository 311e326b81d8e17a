#pragma once

#include <cstdint>
#include <string>

#include "troupe/nn/layer.hpp"
#include "troupe/tensor.hpp"

namespace troupe::nn {

/// Sets a fraction `rate` of its inputs to zero during training and scales the others by
/// 1 / (1 - rate), so that the expected sum is unchanged (tf.keras.layers.Dropout); at inference
/// it is the identity.
///
/// The mask is drawn from a counter-based stream: element i is kept when a hash of (seed,
/// CallContext::step, replica, layer, i) is at least rate. Nothing is kept between calls, so
/// every replica has its own stream, a rerun with the same seeds draws the same masks, a run
/// resumed by BackupAndRestore (which restores the optimizer's iterations, Model's step) draws
/// the masks the uninterrupted run drew, and backward recomputes the mask of its forward call
/// from the same context. Computed on the host (GPU tensors are copied there and back).
class Dropout : public Layer {
 public:
  /// rate must be in [0, 1) (std::invalid_argument).
  explicit Dropout(double rate, std::uint64_t seed = 0, std::string name = "");

  const char* class_name() const override { return "Dropout"; }
  const char* default_name() const override { return "dropout"; }
  /// Any shape.
  Shape input_shape() const override { return {}; }
  /// The input's shape.
  Shape output_shape(const Shape& input_shape) const override { return input_shape; }
  bool uses_random_stream() const override { return true; }

  /// The fraction dropped.
  double rate() const noexcept { return rate_; }
  /// The mask of a training call on `n` elements with `ctx`: 1 / (1 - rate) where kept, 0 where
  /// dropped, as float64 [n].
  Tensor mask(std::int64_t n, const CallContext& ctx) const;

 protected:
  Tensor call(const Tensor& x, const CallContext& ctx) const override;
  LayerGradients gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output, const CallContext& ctx,
                           bool need_input) const override;
  std::string config_json() const override;

 private:
  // Multiplies `t` by the mask of `ctx`, elementwise.
  Tensor masked(const Tensor& t, const CallContext& ctx) const;

  double rate_;
  std::uint64_t seed_;
};

}  // namespace troupe::nn
