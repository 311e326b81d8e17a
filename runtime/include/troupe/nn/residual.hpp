#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/nn/layer.hpp"
#include "troupe/nn/sequential.hpp"
#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe::nn {

/// A residual block: x + f(x), where f is a stack of layers (what a Keras model writes with the
/// functional API as `y = x; for l in layers: y = l(y); out = layers.Add()([x, y])`). It is
/// itself a Layer, so it goes into a Sequential, is trained by Model::fit, followed by a
/// GradientTape, and mirrored under a strategy like any other layer. A pre-norm transformer
/// block is two of them:
///
///     Residual({LayerNormalization(), MultiHeadAttention(4, 16, true)})
///     Residual({LayerNormalization(), Dense(64, 256), ActivationLayer("gelu"), Dense(256, 64)})
///
/// The layers are named inside the block as a Sequential names its layers (dense_0, dense_1...;
/// unique names), and the block's variables are "<layer>/<variable>", so that a model's
/// checkpoint names them "residual_0/multi_head_attention_0/query/kernel" (or, with names
/// given, "block_0/attention/query/kernel").
///
/// The layers' output must have the block's input shape (std::invalid_argument naming the block
/// and the shapes otherwise). Inside the block, layer i of a block at position p of its model is
/// called with CallContext::layer (p + 1)·4096 + i, so that random layers (Dropout) in
/// different blocks draw different masks. backward recomputes the layers' forward pass from the
/// block's input (activation recomputation): a model keeps only each block's input and output
/// between its forward and backward passes, at the cost of one more forward pass of the block.
/// Copies share the layers.
class Residual : public Layer {
 public:
  /// The layers of f, in order; at least one (std::invalid_argument).
  explicit Residual(std::initializer_list<AnyLayer> layers, std::string name = "");
  /// The same from layers already made (nn::load_model rebuilds a block so); the block holds, and
  /// names, these very layers.
  explicit Residual(std::vector<std::shared_ptr<Layer>> layers, std::string name = "");

  const char* class_name() const override { return "Residual"; }
  const char* default_name() const override { return "residual"; }
  /// Every layer's variables, as "<layer name>/<variable name>", in layer order.
  std::vector<std::pair<std::string, Variable>> weights() const override;
  /// The layers' non-trainable variables (BatchNormalization's moving statistics), named likewise.
  std::vector<std::pair<std::string, Variable>> non_trainable_weights() const override;
  /// The first layer's input shape.
  Shape input_shape() const override;
  /// The input's shape, once the layers are checked to map it to itself.
  Shape output_shape(const Shape& input_shape) const override;
  /// Builds the layers in order, each from the shape the previous one gives.
  void build(const Shape& input_shape) const override;
  bool built() const override;
  bool uses_random_stream() const override;

  /// The layers of f, in order.
  const std::vector<std::shared_ptr<const Layer>>& layers() const noexcept { return layers_; }
  /// Their names inside the block.
  const std::vector<std::string>& layer_names() const noexcept { return names_; }

 protected:
  Tensor call(const Tensor& x, const CallContext& ctx) const override;
  LayerGradients gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output, const CallContext& ctx,
                           bool need_input) const override;
  std::string config_json() const override;

 private:
  void add_layers(std::vector<std::shared_ptr<Layer>> layers);
  // The context layer i is called with.
  static CallContext inner(const CallContext& ctx, std::size_t i);
  // The shape after layers 0..count-1 for `shape`, building the unbuilt ones when `build`.
  Shape chain(const Shape& shape, bool build) const;

  std::vector<std::shared_ptr<const Layer>> layers_;
  std::vector<std::string> names_;
};

}  // namespace troupe::nn
