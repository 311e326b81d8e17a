#include "troupe/nn/dense.hpp"

#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "nn/layer_checks.hpp"

namespace troupe::nn {

namespace {

int checked_dim(int value, const char* what) {
  if (value <= 0) {
    throw std::invalid_argument(std::string("Dense: ") + what + " is " + std::to_string(value) +
                                " (expected a positive number)");
  }
  return value;
}

std::string variable_name(const std::string& layer, const char* what) {
  return layer.empty() ? std::string(what) : layer + "/" + what;
}

}  // namespace

Dense::Dense(int input_dim, int units, Activation activation, std::uint64_t seed, std::string name)
    : Layer(std::move(name)),
      input_dim_(checked_dim(input_dim, "input_dim")),
      units_(checked_dim(units, "units")),
      activation_(activation),
      seed_(seed),
      kernel_(glorot_uniform(input_dim, units, seed), variable_name(this->name(), "kernel")),
      bias_(Tensor::zeros({units}), variable_name(this->name(), "bias")) {}

Tensor Dense::call(const Tensor& x, const CallContext&) const {
  if (x.rank() != 2 || x.shape()[1] != input_dim_) {
    throw std::invalid_argument(who() + ": input of shape " + shape_to_string(x.shape()) + " (expected [batch, " +
                                std::to_string(input_dim_) + "])");
  }
  return dense_forward(x, kernel_.value(), bias_.value(), activation_);
}

DenseGradients Dense::backward(const Tensor& x, const Tensor& output, const Tensor& grad_output,
                               bool need_input) const {
  return dense_backward(x, kernel_.value(), output, grad_output, activation_, need_input);
}

LayerGradients Dense::gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output, const CallContext&,
                                bool need_input) const {
  DenseGradients d = backward(x, output, grad_output, need_input);
  LayerGradients out;
  out.input = std::move(d.input);
  out.variables.push_back(std::move(d.kernel));
  out.variables.push_back(std::move(d.bias));
  return out;
}

std::vector<std::pair<std::string, Variable>> Dense::weights() const { return {{"kernel", kernel_}, {"bias", bias_}}; }

Shape Dense::output_shape(const Shape& input_shape) const {
  detail::check_input_shape(who(), input_shape, {-1, input_dim_}, "[batch, " + std::to_string(input_dim_) + "]");
  return {input_shape[0], units_};
}

std::string Dense::config_json() const {
  return nlohmann::json{{"input_dim", input_dim_},
                        {"units", units_},
                        {"activation", activation_name(activation_)},
                        {"seed", seed_}}
      .dump();
}

}  // namespace troupe::nn
