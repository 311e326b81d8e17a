#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe::nn {

class Residual;
class Sequential;

/// How a layer is called (Keras's `training` argument, and what a random layer draws from).
/// A Dropout mask is a function of (the layer's seed, step, replica, layer) and nothing else, so
/// a rerun, a resumed run and the backward pass all see the same mask.
struct CallContext {
  /// Training (Dropout drops) or inference (every layer is deterministic).
  bool training = false;
  /// The training step: Model uses its optimizer's iterations, which checkpoints and
  /// BackupAndRestore save, so a resumed run continues the same random streams.
  std::int64_t step = 0;
  /// The replica (replica_id_in_sync_group): each replica draws its own stream.
  std::int64_t replica = 0;
  /// The layer's position in its model (set by Sequential): two layers with one seed differ.
  std::int64_t layer = 0;
  /// False when a layer's forward runs again only to recompute its activations (a Residual
  /// block's backward): a layer with state keeps it as it is (BatchNormalization's moving
  /// statistics are updated once per training call, not twice).
  bool update_state = true;
};

/// What a layer's backward pass gives.
struct LayerGradients {
  /// The gradient of the input; left empty when not asked for, or when the input has none (ids).
  Tensor input;
  /// The gradients of trainable_variables(), in that order.
  std::vector<Tensor> variables;
};

/// A layer of a model (tf.keras.layers.Layer): a function of one tensor with its own variables,
/// created by its constructor (inside strategy.scope() they are mirrored; copies share them).
///
/// Shapes use -1 for a dimension not known in advance (Keras's None): the batch always, and for
/// instance an image's height and width when the layer does not fix them.
///
/// Every layer computes on the host in float32 or float64 (the dtype of its input, which must be
/// that of its variables). The layers other than Dense, given GPU tensors, copy them to the host,
/// compute there and copy the result back (no GPU kernels of their own yet).
///
/// forward and backward are safe to call from every replica at once inside Strategy::run: each
/// reads its own component of the variables and writes nothing shared.
///
/// Under a GradientTape that follows the input or reads the variables, forward records one node
/// whose gradient is backward's (Dense records its own operations): tape.gradient(loss,
/// model.trainable_variables()) works through any stack of layers. The node refers to the
/// layer, which must live until the tape's gradient call (a model's layers do).
class Layer {
 public:
  virtual ~Layer();

  /// Keras's class name: "Dense", "Conv2D", "MaxPooling2D"...
  virtual const char* class_name() const = 0;
  /// What a Sequential calls an unnamed layer of this kind, with its count after an underscore:
  /// "dense" (dense_0, dense_1...), "conv2d", "max_pooling2d"...
  virtual const char* default_name() const = 0;
  /// The layer's name ("" when none was given and it is in no Sequential).
  const std::string& name() const noexcept { return name_; }

  /// The output at inference (training off).
  Tensor forward(const Tensor& x) const { return forward(x, CallContext{}); }
  /// The output for `ctx` (training on for a training step).
  Tensor forward(const Tensor& x, const CallContext& ctx) const;
  /// The gradients for grad_output (the output's shape), given the x and output of forward with
  /// the same `ctx`. The input gradient is computed only when need_input.
  LayerGradients backward(const Tensor& x, const Tensor& output, const Tensor& grad_output, const CallContext& ctx,
                          bool need_input = true) const {
    return gradients(x, output, grad_output, ctx, need_input);
  }

  /// The trainable variables with their names inside the layer ("kernel", "bias"...), in the
  /// order of backward's gradients (Keras's trainable_weights): a model's checkpoint names them
  /// "<layer name>/<name>" ("conv2d_0/kernel") and its optimizer updates them.
  virtual std::vector<std::pair<std::string, Variable>> weights() const { return {}; }
  /// The variables the layer keeps but does not train (Keras's non_trainable_weights: a
  /// BatchNormalization's moving_mean and moving_variance), named the same way: checkpoints
  /// save them ("batch_normalization_0/moving_mean"); backward gives no gradient for them and
  /// optimizers never see them. The layer writes them itself (in a training call).
  virtual std::vector<std::pair<std::string, Variable>> non_trainable_weights() const { return {}; }
  /// The variables of weights() alone, in that order and that of backward's gradients.
  std::vector<Variable> trainable_variables() const;
  /// The number of elements of every variable, trainable or not (Keras's count_params).
  std::int64_t count_params() const;

  /// The shape of the inputs the layer takes, -1 where any size does; empty when any rank does.
  virtual Shape input_shape() const = 0;
  /// The output shape for an input shape (-1 for unknown sizes, which stay unknown where they
  /// matter). A shape the layer cannot take is std::invalid_argument naming the layer, the shape
  /// and what it expects.
  virtual Shape output_shape(const Shape& input_shape) const = 0;

  /// The layer as JSON, as Keras's serialisation has it:
  /// {"class_name": "Conv2D", "config": {"name": "conv2d_0", "filters": 8, ...}}: everything that
  /// rebuilds it except the values of its variables (those are in checkpoints).
  std::string config() const;

  /// True when forward at training depends on CallContext::step and replica (Dropout).
  virtual bool uses_random_stream() const { return false; }

  /// Creates the variables for inputs of `input_shape` (Keras's build), for a layer that takes
  /// a size from its input (Conv2D's channels, LayerNormalization's width); nothing for the
  /// others, or once built. forward builds an unbuilt layer from its first input; Sequential
  /// builds its layers as soon as their input shape is known (at add, build, or the first batch,
  /// inside the model's strategy scope so that the variables are mirrored). Copies share what
  /// is built. A shape the layer cannot take is std::invalid_argument.
  virtual void build(const Shape& input_shape) const { (void)input_shape; }
  /// False until build() has created the variables; weights() is empty until then.
  virtual bool built() const { return true; }

 protected:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  Layer(const Layer&) = default;
  Layer& operator=(const Layer&) = default;

  /// forward's work.
  virtual Tensor call(const Tensor& x, const CallContext& ctx) const = 0;
  /// backward's work.
  virtual LayerGradients gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output,
                                   const CallContext& ctx, bool need_input) const = 0;
  /// The parameters of config() other than the name, as a JSON object's text.
  virtual std::string config_json() const = 0;
  /// True when call() records its own operations on a GradientTape (Dense's dense_forward), so
  /// that forward does not record the layer as one node.
  virtual bool records_itself() const { return false; }

  /// "Conv2D 'conv2d_0'" (or "Conv2D" when unnamed): how messages start.
  std::string who() const;

 private:
  friend class Sequential;  // names the layers it holds
  friend class Residual;    // names the layers of its block
  std::string name_;
};

/// A height and a width (Keras's kernel_size, strides, pool_size); one number means both.
struct Size2 {
  /// The same size both ways.
  Size2(int both) : height(both), width(both) {}  // NOLINT(google-explicit-constructor): 3 means 3x3, as in Keras
  /// height x width.
  Size2(int h, int w) : height(h), width(w) {}
  int height;
  int width;
};

/// How a window meets the edges (Keras's padding): `valid` uses whole windows only; `same` pads
/// with zeros (ignored by pooling) so that the output has ceil(input / stride) positions, the
/// padding split as TensorFlow does (the extra one at the bottom and right).
enum class Padding { valid, same };

/// "valid" or "same".
const char* padding_name(Padding padding);
/// Padding::valid for "valid", Padding::same for "same" (Keras's spellings); anything else is
/// std::invalid_argument naming `who` and the text.
Padding padding_from_name(const std::string& name, const char* who);

}  // namespace troupe::nn
