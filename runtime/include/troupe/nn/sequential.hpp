#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "troupe/nn/dense.hpp"
#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe::nn {

/// A stack of Dense layers, each feeding the next (tf.keras.Sequential). Copies share the layers'
/// variables.
class Sequential {
 public:
  /// A model without layers; add them with add().
  Sequential() = default;
  /// Adds the layers in order; see add().
  explicit Sequential(std::vector<Dense> layers);

  /// Appends a layer. Its input_dim must equal the previous layer's units, and its name (an
  /// unnamed layer is called dense_<index>) must be new (std::invalid_argument otherwise).
  void add(Dense layer);

  /// The output for x [batch, input_dim].
  Tensor forward(const Tensor& x) const;
  /// The output, keeping in `activations` what backward needs: x, then every layer's output.
  Tensor forward(const Tensor& x, std::vector<Tensor>& activations) const;
  /// Back-propagates grad_output through the layers; returns the gradients in the order of
  /// trainable_variables(). `activations` is what forward filled in.
  std::vector<Tensor> backward(const std::vector<Tensor>& activations, const Tensor& grad_output) const;
  /// The same, calling on_gradient(index, gradient) as soon as each gradient exists, the last
  /// layer's first (per layer: the bias, then the kernel; `index` in trainable_variables() order):
  /// where a gradient's all-reduce can start while earlier layers are still differentiated.
  std::vector<Tensor> backward(const std::vector<Tensor>& activations, const Tensor& grad_output,
                               const std::function<void(std::size_t index, const Tensor& gradient)>& on_gradient) const;

  /// The layers, input first.
  const std::vector<Dense>& layers() const noexcept { return layers_; }
  /// The layers' names, as the checkpoint names use them ("dense_0" for an unnamed first layer).
  const std::vector<std::string>& layer_names() const noexcept { return names_; }
  /// kernel_0, bias_0, kernel_1, bias_1, ...
  std::vector<Variable> trainable_variables() const;
  /// The same variables with their checkpoint names: "dense_0/kernel", "dense_0/bias", ...
  std::vector<std::pair<std::string, Variable>> named_trainable_variables() const;
  /// named_trainable_variables() as a map, for troupe::Checkpoint.
  std::map<std::string, Variable> variables() const;

 private:
  std::vector<Dense> layers_;
  std::vector<std::string> names_;
};

}  // namespace troupe::nn
