#pragma once

#include <optional>
#include <string>

#include "troupe/nn/layer.hpp"
#include "troupe/tensor.hpp"

namespace troupe::nn {

/// What the 2-D pooling layers share: a window (pool_size) moved by strides over
/// [batch, height, width, channels] images (channels_last), each channel on its own; with same
/// padding the padded positions take no part. Computed on the host (GPU tensors are copied there
/// and the output back).
class Pooling2D : public Layer {
 public:
  /// [-1, -1, -1, -1].
  Shape input_shape() const override { return {-1, -1, -1, -1}; }
  Shape output_shape(const Shape& input_shape) const override;

  /// The window.
  Size2 pool_size() const noexcept { return pool_size_; }
  /// The step between windows.
  Size2 strides() const noexcept { return strides_; }
  /// valid or same.
  Padding padding() const noexcept { return padding_; }

 protected:
  /// Sizes and strides must be positive (std::invalid_argument naming `kind`); unset strides
  /// are the pool size (Keras's strides=None).
  Pooling2D(const char* kind, Size2 pool_size, std::optional<Size2> strides, Padding padding, std::string name);
  Tensor call(const Tensor& x, const CallContext& ctx) const override;
  LayerGradients gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output, const CallContext& ctx,
                           bool need_input) const override;
  std::string config_json() const override;
  /// Max (true) or mean (false).
  virtual bool is_max() const = 0;

 private:
  void check_input(const Tensor& x) const;

  Size2 pool_size_;
  Size2 strides_;
  Padding padding_;
};

/// The largest value of each window (tf.keras.layers.MaxPooling2D). Its gradient goes to the
/// first largest input of each window (row-major order in the window).
class MaxPooling2D : public Pooling2D {
 public:
  /// Keras's defaults: a 2x2 window, strides = pool_size, valid padding.
  explicit MaxPooling2D(Size2 pool_size = {2, 2}, std::optional<Size2> strides = std::nullopt,
                        Padding padding = Padding::valid, std::string name = "")
      : Pooling2D("MaxPooling2D", pool_size, strides, padding, std::move(name)) {}
  const char* class_name() const override { return "MaxPooling2D"; }
  const char* default_name() const override { return "max_pooling2d"; }

 protected:
  bool is_max() const override { return true; }
};

/// The mean of each window (tf.keras.layers.AveragePooling2D); with same padding a window at the
/// edge averages only the inputs it covers, as TensorFlow does.
class AveragePooling2D : public Pooling2D {
 public:
  /// Keras's defaults: a 2x2 window, strides = pool_size, valid padding.
  explicit AveragePooling2D(Size2 pool_size = {2, 2}, std::optional<Size2> strides = std::nullopt,
                            Padding padding = Padding::valid, std::string name = "")
      : Pooling2D("AveragePooling2D", pool_size, strides, padding, std::move(name)) {}
  const char* class_name() const override { return "AveragePooling2D"; }
  const char* default_name() const override { return "average_pooling2d"; }

 protected:
  bool is_max() const override { return false; }
};

}  // namespace troupe::nn
