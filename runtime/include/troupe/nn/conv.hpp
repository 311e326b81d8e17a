#pragma once

#include <cstdint>
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
/// (tf.keras.layers.Conv2D): inputs [batch, height, width, input_channels], outputs
/// [batch, out_height, out_width, filters] = activation(conv(x, kernel) + bias). The kernel
/// [kernel_height, kernel_width, input_channels, filters] is Glorot-uniform from `seed` (fan_in
/// kh·kw·in, fan_out kh·kw·filters, as Keras), the bias [filters] zeros, both of `dtype` (float32
/// or float64).
///
/// Computed on the host as im2col followed by the Dense layer's matrix kernels (one product of
/// [batch·positions, kh·kw·in] by [kh·kw·in, filters]); GPU tensors are copied to the host and the
/// output back to their GPU.
class Conv2D : public Layer {
 public:
  /// input_channels, filters, the kernel's and the strides' sizes must be positive
  /// (std::invalid_argument naming the argument). Unlike Keras, the input channels are given, so
  /// the variables exist as soon as the layer does (as Dense's input_dim).
  Conv2D(int input_channels, int filters, Size2 kernel_size, Size2 strides = {1, 1}, Padding padding = Padding::valid,
         Activation activation = Activation::none, std::uint64_t seed = 0, std::string name = "",
         DType dtype = DType::f32);

  const char* class_name() const override { return "Conv2D"; }
  const char* default_name() const override { return "conv2d"; }
  std::vector<std::pair<std::string, Variable>> weights() const override { return {{"kernel", kernel_}, {"bias", bias_}}; }
  /// [-1, -1, -1, input_channels].
  Shape input_shape() const override { return {-1, -1, -1, input_channels_}; }
  Shape output_shape(const Shape& input_shape) const override;

  /// The number of filters (output channels).
  int filters() const noexcept { return filters_; }
  /// The kernel variable, [kh, kw, input_channels, filters].
  const Variable& kernel() const noexcept { return kernel_; }
  /// The bias variable, [filters].
  const Variable& bias() const noexcept { return bias_; }

 protected:
  Tensor call(const Tensor& x, const CallContext& ctx) const override;
  LayerGradients gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output, const CallContext& ctx,
                           bool need_input) const override;
  std::string config_json() const override;

 private:
  void check_input(const Tensor& x) const;

  int input_channels_;
  int filters_;
  Size2 kernel_size_;
  Size2 strides_;
  Padding padding_;
  Activation activation_;
  std::uint64_t seed_;
  DType dtype_;
  Variable kernel_;
  Variable bias_;
};

}  // namespace troupe::nn
