#include "troupe/nn/dense.hpp"

#include <stdexcept>
#include <utility>

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
    : input_dim_(checked_dim(input_dim, "input_dim")),
      units_(checked_dim(units, "units")),
      activation_(activation),
      name_(std::move(name)),
      kernel_(glorot_uniform(input_dim, units, seed), variable_name(name_, "kernel")),
      bias_(Tensor::zeros({units}), variable_name(name_, "bias")) {}

Tensor Dense::forward(const Tensor& x) const {
  if (x.rank() != 2 || x.shape()[1] != input_dim_) {
    throw std::invalid_argument("Dense" + (name_.empty() ? std::string() : " '" + name_ + "'") + ": input of shape " +
                                shape_to_string(x.shape()) + " (expected [batch, " + std::to_string(input_dim_) + "])");
  }
  return dense_forward(x, kernel_.value(), bias_.value(), activation_);
}

DenseGradients Dense::backward(const Tensor& x, const Tensor& output, const Tensor& grad_output,
                               bool need_input) const {
  return dense_backward(x, kernel_.value(), output, grad_output, activation_, need_input);
}

}  // namespace troupe::nn
