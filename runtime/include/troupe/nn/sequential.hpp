#pragma once

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/nn/dense.hpp"
#include "troupe/nn/layer.hpp"
#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe::nn {

/// Any layer, as an element of a braced list of layers of different kinds (a copy sharing the
/// layer's variables).
class AnyLayer {
 public:
  /// Holds a copy of `layer`.
  template <class L, class = std::enable_if_t<std::is_base_of_v<Layer, std::decay_t<L>>>>
  AnyLayer(L layer)  // NOLINT(google-explicit-constructor): {Conv2D(...), Flatten(), Dense(...)}
      : layer_(std::make_shared<std::decay_t<L>>(std::move(layer))) {}

 private:
  friend class Sequential;
  friend class Residual;
  std::shared_ptr<Layer> layer_;
};

/// A stack of layers, each feeding the next (tf.keras.Sequential). Copies share the layers'
/// variables.
class Sequential {
 public:
  /// A model without layers; add them with add().
  Sequential() = default;
  /// Adds the layers in order; see add().
  explicit Sequential(std::vector<Dense> layers);
  /// Adds the layers in order, of any kinds:
  /// Sequential({Conv2D(16, 3, 1, "same", Activation::relu), MaxPooling2D(2), Flatten(), Dense(...)}).
  Sequential(std::initializer_list<AnyLayer> layers);

  /// Appends (a copy of) a layer, which shares the layer's variables. An unnamed layer is named
  /// by its kind and the count of that kind before it (dense_0, dense_1, conv2d_0,
  /// max_pooling2d_0...); names must be unique (they name the variables in checkpoints). Where
  /// the previous layer's output shape is known, the layer must take it (std::invalid_argument
  /// naming both layers otherwise).
  template <class L, class = std::enable_if_t<std::is_base_of_v<Layer, std::decay_t<L>>>>
  void add(L layer) {
    add_layer(std::make_shared<std::decay_t<L>>(std::move(layer)));
  }
  /// Appends a layer the model then holds (load_model's layers, made by their factories), as
  /// add() does.
  void add(std::shared_ptr<Layer> layer) { add_layer(std::move(layer)); }

  /// Sets the input shape (Keras's build(input_shape), the batch -1 or any size), so that every
  /// layer's output shape is known and checked from the start ([-1, 28, 28, 1] for images), and
  /// builds the layers that take a size from their input (their variables are created in the
  /// current strategy scope). A layer that cannot take its input is std::invalid_argument naming
  /// it; the shapes are then unchanged (layers before it stay built).
  void build(Shape input_shape);
  /// True when every layer is built (has its variables).
  bool built() const;
  /// Builds the unbuilt layers from the shape of a batch: directly, or inside a replica function
  /// through merge_call, so that each variable is created once, mirrored
  /// (every replica must call it, as every replica runs the step). forward calls it.
  void build_from(const Shape& batch_shape) const;
  /// The input shape given to build(), or the one the first layer declares.
  const Shape& input_shape() const noexcept { return input_shape_; }

  /// The output for x at inference (training off).
  Tensor forward(const Tensor& x) const;
  /// The output for a training step (CallContext{true}), keeping in `activations` what backward
  /// needs: x, then every layer's output. A model with Dropout draws the same mask at every call
  /// of this form: give the step with the next one.
  Tensor forward(const Tensor& x, std::vector<Tensor>& activations) const;
  /// The same with a context (training, step and replica for Dropout's random stream); each
  /// layer gets it with its position in CallContext::layer.
  Tensor forward(const Tensor& x, std::vector<Tensor>& activations, const CallContext& ctx) const;
  /// Back-propagates grad_output through the layers; returns the gradients in the order of
  /// trainable_variables(). `activations` is what the training forward filled in.
  std::vector<Tensor> backward(const std::vector<Tensor>& activations, const Tensor& grad_output) const;
  /// The same, calling on_gradient(index, gradient) as soon as each gradient exists, the last
  /// layer's first (per layer in reverse order of its weights: the bias, then the kernel; `index`
  /// in trainable_variables() order): where a gradient's all-reduce can start while earlier
  /// layers are still differentiated.
  std::vector<Tensor> backward(const std::vector<Tensor>& activations, const Tensor& grad_output,
                               const std::function<void(std::size_t index, const Tensor& gradient)>& on_gradient) const;
  /// The same for a forward pass made with `ctx`.
  std::vector<Tensor> backward(const std::vector<Tensor>& activations, const Tensor& grad_output,
                               const std::function<void(std::size_t index, const Tensor& gradient)>& on_gradient,
                               const CallContext& ctx) const;

  /// The layers, input first (each named as layer_names() says).
  const std::vector<std::shared_ptr<const Layer>>& layers() const noexcept { return layers_; }
  /// Layer i as its own type (std::out_of_range or std::invalid_argument when it is not one).
  template <class L>
  const L& layer(std::size_t i) const {
    const auto* typed = dynamic_cast<const L*>(layers_.at(i).get());
    if (typed == nullptr) {
      throw std::invalid_argument("Sequential::layer: layer " + std::to_string(i) + " ('" + names_.at(i) + "') is a " +
                                  layers_[i]->class_name() + ", not the type asked for");
    }
    return *typed;
  }
  /// The layers' names, as the checkpoint names use them ("dense_0" for an unnamed first layer).
  const std::vector<std::string>& layer_names() const noexcept { return names_; }
  /// Each layer's output shape as far as the layers tell (-1 where unknown: the batch, and the
  /// sizes that depend on an input the first layers do not fix).
  const std::vector<Shape>& output_shapes() const noexcept { return shapes_; }
  /// Index of layer i's first variable in trainable_variables().
  std::size_t first_variable(std::size_t i) const;
  /// Every layer's variables, in order: kernel_0, bias_0, kernel_1, bias_1, ...
  std::vector<Variable> trainable_variables() const;
  /// The same variables with their checkpoint names: "dense_0/kernel", "dense_0/bias", ...
  std::vector<std::pair<std::string, Variable>> named_trainable_variables() const;
  /// Every layer's non-trainable variables (Layer::non_trainable_weights: BatchNormalization's
  /// moving statistics), in layer order.
  std::vector<Variable> non_trainable_variables() const;
  /// The same with their checkpoint names: "batch_normalization_0/moving_mean", ...
  std::vector<std::pair<std::string, Variable>> named_non_trainable_variables() const;
  /// Every variable by checkpoint name, trainable or not, for troupe::Checkpoint.
  std::map<std::string, Variable> variables() const;
  /// True when a layer draws from CallContext's random stream (Dropout).
  bool uses_random_stream() const;

  /// The model as JSON, as Keras serialises a Sequential:
  /// {"class_name": "Sequential", "config": {"name": "sequential", "layers": [<Layer::config()>...]}},
  /// each layer under the name the model gives it.
  std::string config() const;

 private:
  void add_layer(std::shared_ptr<Layer> layer);
  void build_shapes(Shape input_shape) const;
  // The output shape of `layer` (the index-th) for `given`, the previous output shape ({}:
  // unknown); std::invalid_argument naming the layers when it does not fit.
  Shape next_shape(const char* op, std::size_t index, const Layer& layer, const std::string& name, const Shape& given) const;

  std::vector<std::shared_ptr<const Layer>> layers_;
  std::vector<std::string> names_;
  // Known shapes; a build from the first batch (const, in one thread: merge_call's) fills them in.
  mutable std::vector<Shape> shapes_;
  mutable Shape input_shape_;
};

}  // namespace troupe::nn
