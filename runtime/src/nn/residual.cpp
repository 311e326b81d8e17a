#include "troupe/nn/residual.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "nn/layer_checks.hpp"
#include "tape.hpp"

namespace troupe::nn {

namespace {

// Equal where both sizes are known.
bool compatible(const Shape& a, const Shape& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t d = 0; d < a.size(); ++d) {
    if (a[d] >= 0 && b[d] >= 0 && a[d] != b[d]) return false;
  }
  return true;
}

}  // namespace

Residual::Residual(std::initializer_list<AnyLayer> layers, std::string name) : Layer(std::move(name)) {
  std::vector<std::shared_ptr<Layer>> held;
  for (const AnyLayer& any : layers) held.push_back(any.layer_);
  add_layers(std::move(held));
}

Residual::Residual(std::vector<std::shared_ptr<Layer>> layers, std::string name) : Layer(std::move(name)) {
  add_layers(std::move(layers));
}

void Residual::add_layers(std::vector<std::shared_ptr<Layer>> layers) {
  if (layers.empty()) {
    throw std::invalid_argument("Residual: no layers (expected at least one: the block computes x + f(x))");
  }
  for (const std::shared_ptr<Layer>& layer : layers) {
    if (!layer) throw std::invalid_argument("Residual: a layer is null");
    std::string layer_name = layer->name();
    if (layer_name.empty()) {
      const auto same_kind = std::count_if(layers_.begin(), layers_.end(), [&](const auto& l) {
        return std::string(l->class_name()) == layer->class_name();
      });
      layer_name = std::string(layer->default_name()) + "_" + std::to_string(same_kind);
    }
    if (std::find(names_.begin(), names_.end(), layer_name) != names_.end()) {
      throw std::invalid_argument("Residual: two layers named '" + layer_name +
                                  "' (names must be unique in a block: they name the variables in checkpoints)");
    }
    layer->name_ = layer_name;
    names_.push_back(std::move(layer_name));
    layers_.push_back(layer);
  }
}

CallContext Residual::inner(const CallContext& ctx, std::size_t i) {
  CallContext at = ctx;
  at.layer = (ctx.layer + 1) * 4096 + static_cast<std::int64_t>(i);
  return at;
}

std::vector<std::pair<std::string, Variable>> Residual::weights() const {
  std::vector<std::pair<std::string, Variable>> out;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    for (auto& [name, variable] : layers_[i]->weights()) out.emplace_back(names_[i] + "/" + name, variable);
  }
  return out;
}

std::vector<std::pair<std::string, Variable>> Residual::non_trainable_weights() const {
  std::vector<std::pair<std::string, Variable>> out;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    for (auto& [name, variable] : layers_[i]->non_trainable_weights()) out.emplace_back(names_[i] + "/" + name, variable);
  }
  return out;
}

Shape Residual::input_shape() const { return layers_.front()->input_shape(); }

Shape Residual::chain(const Shape& input_shape, bool build) const {
  Shape shape = input_shape;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const Shape expected = layers_[i]->input_shape();
    const bool fits = expected.empty() || compatible(shape, expected) ||
                      (expected.size() == 2 && shape.size() > 2 && compatible({shape.back()}, {expected.back()}));
    try {
      if (!fits) {
        throw std::invalid_argument(std::string(layers_[i]->class_name()) + " '" + names_[i] + "' takes inputs of shape " +
                                    shape_to_string(expected) + ", given " + shape_to_string(shape));
      }
      if (build && !layers_[i]->built() && !shape.empty() && shape.back() > 0) layers_[i]->build(shape);
      shape = layers_[i]->output_shape(shape);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(who() + ": layer " + std::to_string(i) + ": " + e.what());
    }
  }
  if (!compatible(shape, input_shape)) {
    throw std::invalid_argument(who() + ": its layers map " + shape_to_string(input_shape) + " to " +
                                shape_to_string(shape) +
                                " (expected the input's shape: the block adds its input to its layers' output)");
  }
  return input_shape;
}

Shape Residual::output_shape(const Shape& input_shape) const { return chain(input_shape, false); }

void Residual::build(const Shape& input_shape) const { chain(input_shape, true); }

bool Residual::built() const {
  return std::all_of(layers_.begin(), layers_.end(), [](const auto& l) { return l->built(); });
}

bool Residual::uses_random_stream() const {
  return std::any_of(layers_.begin(), layers_.end(), [](const auto& l) { return l->uses_random_stream(); });
}

Tensor Residual::call(const Tensor& x, const CallContext& ctx) const {
  Tensor h = x;
  for (std::size_t i = 0; i < layers_.size(); ++i) h = layers_[i]->forward(h, inner(ctx, i));
  if (h.shape() != x.shape() || h.dtype() != x.dtype()) {
    throw std::invalid_argument(who() + ": its layers map " + std::string(dtype_name(x.dtype())) + " " +
                                shape_to_string(x.shape()) + " to " + std::string(dtype_name(h.dtype())) + " " +
                                shape_to_string(h.shape()) + " (expected the input's shape and dtype)");
  }
  return x + h;
}

LayerGradients Residual::gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output,
                                   const CallContext& ctx, bool need_input) const {
  detail::check_grad_output(who(), grad_output, output);
  // The layers' activations again, from the block's input (not recorded on any tape, and
  // changing no layer's state: the forward pass did).
  troupe::detail::PauseRecording pause;
  std::vector<Tensor> activations{x};
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    CallContext again = inner(ctx, i);
    again.update_state = false;
    activations.push_back(layers_[i]->forward(activations.back(), again));
  }
  if (activations.back().shape() != output.shape()) {
    throw std::invalid_argument(who() + ": output of shape " + shape_to_string(output.shape()) + " for input " +
                                shape_to_string(x.shape()) + " (expected the input's shape)");
  }
  std::vector<std::vector<Tensor>> per_layer(layers_.size());
  Tensor g = grad_output;
  for (std::size_t i = layers_.size(); i-- > 0;) {
    // The first layer's input gradient is needed only for the block's own input gradient.
    LayerGradients d = layers_[i]->backward(activations[i], activations[i + 1], g, inner(ctx, i), i > 0 || need_input);
    per_layer[i] = std::move(d.variables);
    g = std::move(d.input);
  }
  LayerGradients out;
  for (auto& grads : per_layer) {
    for (Tensor& t : grads) out.variables.push_back(std::move(t));
  }
  if (need_input) out.input = grad_output + g;
  return out;
}

std::string Residual::config_json() const {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& layer : layers_) layers.push_back(nlohmann::json::parse(layer->config()));
  return nlohmann::json{{"layers", std::move(layers)}}.dump();
}

}  // namespace troupe::nn
