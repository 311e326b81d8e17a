#include "troupe/nn/dense.hpp"

#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "nn/layer_checks.hpp"

namespace troupe::nn {

namespace {

bool is_16bit(DType d) { return d == DType::f16 || d == DType::bf16; }

Tensor as(const Tensor& t, DType d) { return t.dtype() == d ? t : t.cast(d); }

// `t` as the layer computes with it: rounded to the compute dtype, then held in float32 for the
// products (which accumulate in float32). A float32 layer takes 16-bit inputs in float32.
Tensor computed(const Tensor& t, DType compute) {
  if (compute == DType::f32) return is_16bit(t.dtype()) ? t.cast(DType::f32) : t;
  return as(as(t, compute), DType::f32);
}

}  // namespace

Dense::Dense(int input_dim, int units, Activation activation, std::uint64_t seed, std::string name)
    : Layer(std::move(name)),
      input_dim_(detail::positive("Dense", input_dim, "input_dim")),
      units_(detail::positive("Dense", units, "units")),
      activation_(activation),
      seed_(seed),
      policy_(mixed_precision::global_policy()),
      kernel_(glorot_uniform(input_dim, units, seed), detail::variable_name(this->name(), "kernel")),
      bias_(Tensor::zeros({units}), detail::variable_name(this->name(), "bias")) {}

Tensor Dense::call(const Tensor& x, const CallContext& ctx) const {
  if (x.rank() > 2) {
    // Keras's Dense on [batch, ..., input_dim]: the last axis, every leading position alike.
    output_shape(x.shape());
    Shape out_shape = x.shape();
    out_shape.back() = units_;
    return call(x.reshape({-1, input_dim_}), ctx).reshape(out_shape);
  }
  if (x.rank() != 2 || x.shape()[1] != input_dim_) {
    throw std::invalid_argument(who() + ": input of shape " + shape_to_string(x.shape()) + " (expected [batch, " +
                                std::to_string(input_dim_) + "])");
  }
  const DType c = compute_dtype();
  if (c == DType::f32 && !is_16bit(x.dtype())) return dense_forward(x, kernel_.value(), bias_.value(), activation_);
  const Tensor out = dense_forward(computed(x, c), computed(kernel_.value(), c), computed(bias_.value(), c), activation_);
  return as(out, c);
}

DenseGradients Dense::backward(const Tensor& x, const Tensor& output, const Tensor& grad_output,
                               bool need_input) const {
  const DType c = compute_dtype();
  if (c == DType::f32 && !is_16bit(x.dtype()) && !is_16bit(grad_output.dtype())) {
    return dense_backward(x, kernel_.value(), output, grad_output, activation_, need_input);
  }
  // The forward's operands again, and the gradient arriving at the 16-bit output, 16-bit too.
  DenseGradients d = dense_backward(computed(x, c), computed(kernel_.value(), c), as(output, DType::f32),
                                    computed(grad_output, c), activation_, need_input);
  if (c != DType::f32) {
    // The gradients of the 16-bit copies of the variables, passed back through the casts.
    d.kernel = computed(d.kernel, c);
    d.bias = computed(d.bias, c);
  }
  if (need_input) d.input = as(as(d.input, c), x.dtype());
  return d;
}

LayerGradients Dense::gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output, const CallContext&,
                                bool need_input) const {
  const bool leading = x.rank() > 2;  // [batch, ..., input_dim]: as rows of [-1, input_dim]
  if (leading) output_shape(x.shape());
  const auto rows = [&](const Tensor& t, std::int64_t width) { return leading ? t.reshape({-1, width}) : t; };
  DenseGradients d = backward(rows(x, input_dim_), rows(output, units_), rows(grad_output, units_), need_input);
  LayerGradients out;
  out.input = leading && need_input ? d.input.reshape(x.shape()) : std::move(d.input);
  out.variables.push_back(std::move(d.kernel));
  out.variables.push_back(std::move(d.bias));
  return out;
}

std::vector<std::pair<std::string, Variable>> Dense::weights() const { return {{"kernel", kernel_}, {"bias", bias_}}; }

Shape Dense::output_shape(const Shape& input_shape) const {
  if (input_shape.size() > 2) {
    if (input_shape.back() >= 0 && input_shape.back() != input_dim_) {
      throw std::invalid_argument(who() + ": input of shape " + shape_to_string(input_shape) + " (expected [batch, ..., " +
                                  std::to_string(input_dim_) + "])");
    }
    Shape out = input_shape;
    out.back() = units_;
    return out;
  }
  detail::check_input_shape(who(), input_shape, {-1, input_dim_}, "[batch, " + std::to_string(input_dim_) + "]");
  return {input_shape[0], units_};
}

std::string Dense::config_json() const {
  return nlohmann::json{{"input_dim", input_dim_},
                        {"units", units_},
                        {"activation", activation_name(activation_)},
                        {"seed", seed_},
                        {"dtype", policy_.name()}}
      .dump();
}

}  // namespace troupe::nn
