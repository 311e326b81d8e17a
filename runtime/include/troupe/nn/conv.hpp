#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/dtype.hpp"
#include "troupe/nn/layer.hpp"
#include "troupe/nn/ops.hpp"
#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe::nn {

/// A 2-D convolution over images in channels_last layout, Keras's default
/// (tf.keras.layers.Conv2D): inputs [batch, height, width, channels], outputs
/// [batch, out_height, out_width, filters] = activation(conv(x, kernel) + bias). As in Keras the
/// input channels come from the data: the kernel [kernel_height, kernel_width, channels, filters]
/// (Glorot-uniform from `seed`, fan_in kh·kw·channels, fan_out kh·kw·filters) and the bias
/// [filters] (zeros), of `dtype` (float32 or float64), are created by build() when the channels
/// are first known (see Layer::build).
///
/// Computed on the host as im2col followed by the Dense layer's matrix kernels (one product of
/// [batch·positions, kh·kw·channels] by [kh·kw·channels, filters]); GPU tensors are copied to the
/// host and the output back to their GPU.
class Conv2D : public Layer {
 public:
  /// filters, the kernel's and the strides' sizes must be positive (std::invalid_argument
  /// naming the argument).
  explicit Conv2D(int filters, Size2 kernel_size, Size2 strides = {1, 1}, Padding padding = Padding::valid,
                  Activation activation = Activation::none, std::uint64_t seed = 0, std::string name = "",
                  DType dtype = DType::f32);
  /// The same with Keras's padding names, "valid" or "same".
  Conv2D(int filters, Size2 kernel_size, Size2 strides, const std::string& padding,
         Activation activation = Activation::none, std::uint64_t seed = 0, std::string name = "",
         DType dtype = DType::f32);

  const char* class_name() const override { return "Conv2D"; }
  const char* default_name() const override { return "conv2d"; }
  /// {"kernel", kernel}, {"bias", bias} once built; nothing before.
  std::vector<std::pair<std::string, Variable>> weights() const override;
  /// [-1, -1, -1, channels] (channels -1 until built).
  Shape input_shape() const override;
  Shape output_shape(const Shape& input_shape) const override;
  /// Creates the kernel and the bias for input_shape's channels (its last size, which must be
  /// known and positive).
  void build(const Shape& input_shape) const override;
  bool built() const override;

  /// The number of filters (output channels).
  int filters() const noexcept { return filters_; }
  /// The input channels; -1 until built.
  int input_channels() const;
  /// The kernel variable, [kh, kw, channels, filters] (std::logic_error until built).
  const Variable& kernel() const;
  /// The bias variable, [filters] (std::logic_error until built).
  const Variable& bias() const;

 protected:
  Tensor call(const Tensor& x, const CallContext& ctx) const override;
  LayerGradients gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output, const CallContext& ctx,
                           bool need_input) const override;
  std::string config_json() const override;

 private:
  struct State;  // what build() makes, shared by copies
  void check_input(const Tensor& x) const;

  int filters_;
  Size2 kernel_size_;
  Size2 strides_;
  Padding padding_;
  Activation activation_;
  std::uint64_t seed_;
  DType dtype_;
  std::shared_ptr<State> state_;
};

}  // namespace troupe::nn
