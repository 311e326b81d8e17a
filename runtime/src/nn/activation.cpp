#include "troupe/nn/activation.hpp"

#include <cmath>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "nn/eigen_maps.hpp"
#include "nn/layer_checks.hpp"

namespace troupe::nn {

namespace {

constexpr double inv_sqrt2 = 0.70710678118654752440;
constexpr double inv_sqrt_2pi = 0.39894228040143267794;

// Applies f(x, out) to each element of x (host, float32 or float64) into a new tensor.
template <class F>
Tensor elementwise(const Tensor& x, F&& f) {
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  eigen::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = x.data<T>();
    T* o = out.mutable_data<T>();
    for (std::int64_t i = 0; i < x.num_elements(); ++i) o[i] = static_cast<T>(f(static_cast<double>(in[i])));
  });
  return out;
}

// grad · f'(a) elementwise, where `a` is the input or the output as f' needs.
template <class F>
Tensor elementwise_grad(const Tensor& grad, const Tensor& a, F&& derivative) {
  Tensor out = Tensor::empty(grad.shape(), grad.dtype());
  eigen::dispatch_float(grad.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* g = grad.data<T>();
    const T* in = a.data<T>();
    T* o = out.mutable_data<T>();
    for (std::int64_t i = 0; i < grad.num_elements(); ++i) {
      o[i] = static_cast<T>(static_cast<double>(g[i]) * derivative(static_cast<double>(in[i])));
    }
  });
  return out;
}

double gelu_of(double v) { return 0.5 * v * (1.0 + std::erf(v * inv_sqrt2)); }
double gelu_derivative(double v) {
  return 0.5 * (1.0 + std::erf(v * inv_sqrt2)) + v * inv_sqrt_2pi * std::exp(-0.5 * v * v);
}

// The softmax of each row of the last axis.
Tensor softmax_last(const Tensor& x) {
  const std::int64_t width = x.shape().back();
  const std::int64_t rows = width > 0 ? x.num_elements() / width : 0;
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  eigen::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* in = x.data<T>() + r * width;
      T* o = out.mutable_data<T>() + r * width;
      T max = in[0];
      for (std::int64_t k = 1; k < width; ++k) max = std::max(max, in[k]);
      double sum = 0;
      for (std::int64_t k = 0; k < width; ++k) sum += static_cast<double>(o[k] = std::exp(in[k] - max));
      for (std::int64_t k = 0; k < width; ++k) o[k] = static_cast<T>(static_cast<double>(o[k]) / sum);
    }
  });
  return out;
}

// y · (g - Σ g·y) along the last axis: softmax's backward from its output.
Tensor softmax_last_grad(const Tensor& grad, const Tensor& y) {
  const std::int64_t width = y.shape().back();
  const std::int64_t rows = width > 0 ? y.num_elements() / width : 0;
  Tensor out = Tensor::empty(y.shape(), y.dtype());
  eigen::dispatch_float(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* g = grad.data<T>() + r * width;
      const T* p = y.data<T>() + r * width;
      T* o = out.mutable_data<T>() + r * width;
      double dot = 0;
      for (std::int64_t k = 0; k < width; ++k) dot += static_cast<double>(g[k]) * static_cast<double>(p[k]);
      for (std::int64_t k = 0; k < width; ++k) {
        o[k] = static_cast<T>(static_cast<double>(p[k]) * (static_cast<double>(g[k]) - dot));
      }
    }
  });
  return out;
}

}  // namespace

Tensor gelu(const Tensor& x_in) {
  detail::check_float_input("gelu", x_in);
  return detail::like_device(elementwise(detail::on_host(x_in), gelu_of), x_in);
}

Tensor gelu_grad(const Tensor& grad, const Tensor& x) {
  detail::check_float_input("gelu_grad", x);
  detail::check_grad_output("gelu_grad", grad, x);
  return detail::like_device(elementwise_grad(detail::on_host(grad), detail::on_host(x), gelu_derivative), grad);
}

ActivationLayer::ActivationLayer(std::string activation, std::string name)
    : Layer(std::move(name)), activation_(std::move(activation)) {
  if (activation_ == "linear") {
    kind_ = Kind::linear;
  } else if (activation_ == "relu") {
    kind_ = Kind::relu;
  } else if (activation_ == "gelu") {
    kind_ = Kind::gelu;
  } else if (activation_ == "tanh") {
    kind_ = Kind::tanh;
  } else if (activation_ == "sigmoid") {
    kind_ = Kind::sigmoid;
  } else if (activation_ == "softmax") {
    kind_ = Kind::softmax;
  } else {
    throw std::invalid_argument("Activation: activation \"" + activation_ +
                                "\" (expected \"linear\", \"relu\", \"gelu\", \"tanh\", \"sigmoid\" or \"softmax\")");
  }
}

Shape ActivationLayer::output_shape(const Shape& input_shape) const {
  if (kind_ == Kind::softmax && input_shape.empty()) {
    throw std::invalid_argument(who() + ": softmax of a scalar (expected an input of rank 1 or more)");
  }
  return input_shape;
}

Tensor ActivationLayer::call(const Tensor& x_in, const CallContext&) const {
  detail::check_float_input(who(), x_in);
  output_shape(x_in.shape());
  const Tensor x = detail::on_host(x_in);
  Tensor out;
  switch (kind_) {
    case Kind::linear: return x_in;
    case Kind::relu: out = elementwise(x, [](double v) { return v > 0 ? v : 0.0; }); break;
    case Kind::gelu: out = elementwise(x, gelu_of); break;
    case Kind::tanh: out = elementwise(x, [](double v) { return std::tanh(v); }); break;
    case Kind::sigmoid: out = elementwise(x, [](double v) { return 1.0 / (1.0 + std::exp(-v)); }); break;
    case Kind::softmax: out = softmax_last(x); break;
  }
  return detail::like_device(out, x_in);
}

LayerGradients ActivationLayer::gradients(const Tensor& x_in, const Tensor& output, const Tensor& grad_output,
                                          const CallContext&, bool need_input) const {
  detail::check_float_input(who(), x_in);
  detail::check_grad_output(who(), grad_output, output);
  if (output.shape() != x_in.shape()) {
    throw std::invalid_argument(who() + ": output of shape " + shape_to_string(output.shape()) + " for input " +
                                shape_to_string(x_in.shape()) + " (expected the input's shape)");
  }
  LayerGradients out;
  if (!need_input) return out;
  const Tensor g = detail::on_host(grad_output);
  Tensor d;
  switch (kind_) {
    case Kind::linear: out.input = grad_output; return out;
    case Kind::relu:
      // TensorFlow's convention: no gradient at 0.
      d = elementwise_grad(g, detail::on_host(output), [](double y) { return y > 0 ? 1.0 : 0.0; });
      break;
    case Kind::gelu: d = elementwise_grad(g, detail::on_host(x_in), gelu_derivative); break;
    case Kind::tanh: d = elementwise_grad(g, detail::on_host(output), [](double y) { return 1.0 - y * y; }); break;
    case Kind::sigmoid: d = elementwise_grad(g, detail::on_host(output), [](double y) { return y * (1.0 - y); }); break;
    case Kind::softmax: d = softmax_last_grad(g, detail::on_host(output)); break;
  }
  out.input = detail::like_device(d, x_in);
  return out;
}

std::string ActivationLayer::config_json() const { return nlohmann::json{{"activation", activation_}}.dump(); }

}  // namespace troupe::nn
