#include "troupe/nn/sequential.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace troupe::nn {

Sequential::Sequential(std::vector<Dense> layers) {
  for (Dense& layer : layers) add(std::move(layer));
}

void Sequential::add(Dense layer) {
  if (!layers_.empty() && layers_.back().units() != layer.input_dim()) {
    throw std::invalid_argument("Sequential::add: layer " + std::to_string(layers_.size()) + " takes inputs of width " +
                                std::to_string(layer.input_dim()) + ", the previous layer ('" + names_.back() +
                                "') outputs " + std::to_string(layers_.back().units()));
  }
  std::string name = layer.name().empty() ? "dense_" + std::to_string(layers_.size()) : layer.name();
  if (std::find(names_.begin(), names_.end(), name) != names_.end()) {
    throw std::invalid_argument("Sequential::add: a layer named '" + name + "' is already in the model (names must be "
                                "unique: they name the variables in checkpoints)");
  }
  names_.push_back(std::move(name));
  layers_.push_back(std::move(layer));
}

Tensor Sequential::forward(const Tensor& x) const {
  Tensor h = x;
  for (const Dense& layer : layers_) h = layer.forward(h);
  return h;
}

Tensor Sequential::forward(const Tensor& x, std::vector<Tensor>& activations) const {
  activations.clear();
  activations.reserve(layers_.size() + 1);
  activations.push_back(x);
  for (const Dense& layer : layers_) activations.push_back(layer.forward(activations.back()));
  return activations.back();
}

std::vector<Tensor> Sequential::backward(const std::vector<Tensor>& activations, const Tensor& grad_output) const {
  return backward(activations, grad_output, nullptr);
}

std::vector<Tensor> Sequential::backward(
    const std::vector<Tensor>& activations, const Tensor& grad_output,
    const std::function<void(std::size_t index, const Tensor& gradient)>& on_gradient) const {
  if (activations.size() != layers_.size() + 1) {
    throw std::invalid_argument("Sequential::backward: " + std::to_string(activations.size()) +
                                " activations for " + std::to_string(layers_.size()) +
                                " layers (expected the input and every layer's output, as forward fills them)");
  }
  std::vector<Tensor> grads(2 * layers_.size());
  Tensor g = grad_output;
  for (std::size_t i = layers_.size(); i-- > 0;) {
    // The first layer's input gradient would go nowhere: skip its matrix product.
    DenseGradients d = layers_[i].backward(activations[i], activations[i + 1], g, i > 0);
    grads[2 * i] = std::move(d.kernel);
    grads[2 * i + 1] = std::move(d.bias);
    if (on_gradient) {
      on_gradient(2 * i + 1, grads[2 * i + 1]);
      on_gradient(2 * i, grads[2 * i]);
    }
    g = std::move(d.input);
  }
  return grads;
}

std::vector<Variable> Sequential::trainable_variables() const {
  std::vector<Variable> out;
  out.reserve(2 * layers_.size());
  for (const Dense& layer : layers_) {
    out.push_back(layer.kernel());
    out.push_back(layer.bias());
  }
  return out;
}

std::vector<std::pair<std::string, Variable>> Sequential::named_trainable_variables() const {
  std::vector<std::pair<std::string, Variable>> out;
  out.reserve(2 * layers_.size());
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    out.emplace_back(names_[i] + "/kernel", layers_[i].kernel());
    out.emplace_back(names_[i] + "/bias", layers_[i].bias());
  }
  return out;
}

std::map<std::string, Variable> Sequential::variables() const {
  std::map<std::string, Variable> out;
  for (auto& [name, variable] : named_trainable_variables()) out.emplace(name, variable);
  return out;
}

}  // namespace troupe::nn
