#include "troupe/nn/sequential.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "distribute/strategies/context_state.hpp"
#include "nn/layer_checks.hpp"
#include "troupe/distribute/context.hpp"

namespace troupe::nn {

namespace {

// Whether a layer that takes `expected` (-1: any size) can take `given` (-1: unknown). A layer
// that takes [batch, n] takes [batch, ..., n] too: Dense, as Keras's, maps the last axis.
bool fits(const Shape& given, const Shape& expected) {
  if (expected.size() == 2 && given.size() > 2) return fits({given.front(), given.back()}, expected);
  if (given.size() != expected.size()) return false;
  for (std::size_t d = 0; d < given.size(); ++d) {
    if (given[d] >= 0 && expected[d] >= 0 && given[d] != expected[d]) return false;
  }
  return true;
}

}  // namespace

Sequential::Sequential(std::vector<Dense> layers) {
  for (Dense& layer : layers) add(std::move(layer));
}

Sequential::Sequential(std::initializer_list<AnyLayer> layers) {
  // Each element holds its own copy of the layer, made for this list: the model takes it.
  for (const AnyLayer& layer : layers) add_layer(layer.layer_);
}

void Sequential::add_layer(std::shared_ptr<Layer> layer) {
  std::string name = layer->name();
  if (name.empty()) {
    const auto same_kind = std::count_if(layers_.begin(), layers_.end(), [&](const auto& l) {
      return std::string(l->class_name()) == layer->class_name();
    });
    name = std::string(layer->default_name()) + "_" + std::to_string(same_kind);
  }
  if (std::find(names_.begin(), names_.end(), name) != names_.end()) {
    throw std::invalid_argument("Sequential::add: a layer named '" + name + "' is already in the model (names must be "
                                "unique: they name the variables in checkpoints)");
  }
  layer->name_ = name;  // the model's copy carries the model's name, for its messages
  Shape out = next_shape("Sequential::add", layers_.size(), *layer, name, layers_.empty() ? input_shape_ : shapes_.back());
  if (layers_.empty() && input_shape_.empty()) input_shape_ = layer->input_shape();
  names_.push_back(std::move(name));
  shapes_.push_back(std::move(out));
  layers_.push_back(std::move(layer));
}

Shape Sequential::next_shape(const char* op, std::size_t index_in, const Layer& layer, const std::string& name,
                             const Shape& previous) const {
  const std::string index = std::to_string(index_in);
  const Shape expected = layer.input_shape();
  const bool first = index_in == 0;
  const std::string before = first ? std::string("the input") : "the previous layer ('" + names_[index_in - 1] + "')";
  const Shape given = first && previous.empty() ? expected : previous;
  if (!previous.empty() && !expected.empty() && !fits(given, expected)) {
    if (given.size() == 2 && expected.size() == 2) {
      throw std::invalid_argument(std::string(op) + ": layer " + index + " takes inputs of width " +
                                  std::to_string(expected[1]) + ", " + before + " outputs " + std::to_string(given[1]));
    }
    throw std::invalid_argument(std::string(op) + ": layer " + index + " ('" + name + "', " + layer.class_name() +
                                ") takes inputs of shape " + detail::keras_shape(expected) + ", " + before +
                                (first ? " is " : " outputs ") + detail::keras_shape(given));
  }
  if (given.empty()) return {};
  try {
    // A layer that takes a size from its input is built as soon as that size is known.
    if (!layer.built() && given.back() > 0) layer.build(given);
    return layer.output_shape(given);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string(op) + ": layer " + index + ": " + e.what() +
                                (first && previous.empty() ? std::string() : ", the output of " + before));
  }
}

void Sequential::build(Shape input_shape) { build_shapes(std::move(input_shape)); }

void Sequential::build_shapes(Shape input_shape) const {
  if (input_shape.empty()) {
    throw std::invalid_argument("Sequential::build: input shape [] (expected a batch: [batch, ...], -1 for any size)");
  }
  std::vector<Shape> shapes;
  Shape given = input_shape;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    given = next_shape("Sequential::build", i, *layers_[i], names_[i], given);
    shapes.push_back(given);
  }
  input_shape_ = std::move(input_shape);
  shapes_ = std::move(shapes);
}

bool Sequential::built() const {
  return std::all_of(layers_.begin(), layers_.end(), [](const auto& l) { return l->built(); });
}

void Sequential::build_from(const Shape& batch_shape) const {
  // Every replica reads built() before the merge below changes it (merge_call starts once all
  // have arrived), so all take the same branch.
  if (built()) return;
  Shape shape = batch_shape;
  if (!shape.empty()) shape[0] = -1;
  distribute::ReplicaContext* ctx = distribute::detail::installed_replica_context();
  if (ctx != nullptr) {  // inside a replica function: variables are made in cross-replica context
    ctx->merge_call(
        [&](distribute::Strategy&, const distribute::PerReplica<int>&) {
          build_shapes(shape);
          return 0;
        },
        0);
  } else {
    build_shapes(shape);
  }
}

std::size_t Sequential::first_variable(std::size_t i) const {
  std::size_t n = 0;
  for (std::size_t k = 0; k < i && k < layers_.size(); ++k) n += layers_[k]->weights().size();
  if (i >= layers_.size()) throw std::out_of_range("Sequential::first_variable: layer " + std::to_string(i) + " of " + std::to_string(layers_.size()));
  return n;
}

Tensor Sequential::forward(const Tensor& x) const {
  build_from(x.shape());
  Tensor h = x;
  CallContext ctx;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    ctx.layer = static_cast<std::int64_t>(i);
    h = layers_[i]->forward(h, ctx);
  }
  return h;
}

Tensor Sequential::forward(const Tensor& x, std::vector<Tensor>& activations) const {
  CallContext ctx;
  ctx.training = true;
  return forward(x, activations, ctx);
}

Tensor Sequential::forward(const Tensor& x, std::vector<Tensor>& activations, const CallContext& ctx) const {
  build_from(x.shape());
  activations.clear();
  activations.reserve(layers_.size() + 1);
  activations.push_back(x);
  CallContext at = ctx;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    at.layer = static_cast<std::int64_t>(i);
    activations.push_back(layers_[i]->forward(activations.back(), at));
  }
  return activations.back();
}

std::vector<Tensor> Sequential::backward(const std::vector<Tensor>& activations, const Tensor& grad_output) const {
  return backward(activations, grad_output, nullptr);
}

std::vector<Tensor> Sequential::backward(
    const std::vector<Tensor>& activations, const Tensor& grad_output,
    const std::function<void(std::size_t index, const Tensor& gradient)>& on_gradient) const {
  CallContext ctx;
  ctx.training = true;
  return backward(activations, grad_output, on_gradient, ctx);
}

std::vector<Tensor> Sequential::backward(
    const std::vector<Tensor>& activations, const Tensor& grad_output,
    const std::function<void(std::size_t index, const Tensor& gradient)>& on_gradient, const CallContext& ctx) const {
  if (activations.size() != layers_.size() + 1) {
    throw std::invalid_argument("Sequential::backward: " + std::to_string(activations.size()) +
                                " activations for " + std::to_string(layers_.size()) +
                                " layers (expected the input and every layer's output, as forward fills them)");
  }
  std::vector<Tensor> grads(trainable_variables().size());
  Tensor g = grad_output;
  CallContext at = ctx;
  for (std::size_t i = layers_.size(); i-- > 0;) {
    at.layer = static_cast<std::int64_t>(i);
    // The first layer's input gradient would go nowhere: skip its computation.
    LayerGradients d = layers_[i]->backward(activations[i], activations[i + 1], g, at, i > 0);
    const std::size_t first = first_variable(i);
    for (std::size_t k = d.variables.size(); k-- > 0;) {
      grads[first + k] = std::move(d.variables[k]);
      if (on_gradient) on_gradient(first + k, grads[first + k]);
    }
    g = std::move(d.input);
  }
  return grads;
}

std::vector<Variable> Sequential::trainable_variables() const {
  std::vector<Variable> out;
  for (const auto& layer : layers_) {
    for (auto& [name, variable] : layer->weights()) out.push_back(variable);
  }
  return out;
}

std::vector<std::pair<std::string, Variable>> Sequential::named_trainable_variables() const {
  std::vector<std::pair<std::string, Variable>> out;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    for (auto& [name, variable] : layers_[i]->weights()) out.emplace_back(names_[i] + "/" + name, variable);
  }
  return out;
}

std::vector<Variable> Sequential::non_trainable_variables() const {
  std::vector<Variable> out;
  for (const auto& layer : layers_) {
    for (auto& [name, variable] : layer->non_trainable_weights()) out.push_back(variable);
  }
  return out;
}

std::vector<std::pair<std::string, Variable>> Sequential::named_non_trainable_variables() const {
  std::vector<std::pair<std::string, Variable>> out;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    for (auto& [name, variable] : layers_[i]->non_trainable_weights()) out.emplace_back(names_[i] + "/" + name, variable);
  }
  return out;
}

std::map<std::string, Variable> Sequential::variables() const {
  std::map<std::string, Variable> out;
  for (auto& [name, variable] : named_trainable_variables()) out.emplace(name, variable);
  for (auto& [name, variable] : named_non_trainable_variables()) out.emplace(name, variable);
  return out;
}

bool Sequential::uses_random_stream() const {
  return std::any_of(layers_.begin(), layers_.end(), [](const auto& l) { return l->uses_random_stream(); });
}

std::string Sequential::config() const {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& layer : layers_) layers.push_back(nlohmann::json::parse(layer->config()));
  return nlohmann::json{{"class_name", "Sequential"}, {"config", {{"name", "sequential"}, {"layers", std::move(layers)}}}}
      .dump();
}

}  // namespace troupe::nn
