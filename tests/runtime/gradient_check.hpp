#pragma once

// The layer tests' finite-difference checks: deterministic inputs, a weighted sum of a layer's
// output, central differences, and backward checked against them for the input and every
// trainable variable.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "troupe/nn/layer.hpp"
#include "troupe/nn/ops.hpp"
#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe::testing {

// Deterministic values in [-1, 1), shifted by `offset` (a batch whose mean is not 0).
inline Tensor pseudo_random(Shape shape, std::uint64_t seed, DType dtype = DType::f64, double offset = 0.0) {
  Tensor t = nn::glorot_uniform(shape_num_elements(shape), 1, seed, DType::f64);
  const double scale = std::sqrt((static_cast<double>(shape_num_elements(shape)) + 1.0) / 6.0);
  t = (t * scale + offset).reshape(shape);
  return dtype == DType::f64 ? t : t.cast(dtype);
}

// sum(output * weights): a scalar whose gradient with respect to the output is `weights`.
inline double weighted_sum(const Tensor& output, const Tensor& weights) {
  const auto o = output.cast(DType::f64).to_vector<double>();
  const auto w = weights.cast(DType::f64).to_vector<double>();
  REQUIRE(o.size() == w.size());
  double s = 0;
  for (std::size_t i = 0; i < o.size(); ++i) s += o[i] * w[i];
  return s;
}

// Central finite differences of f at x, element by element.
inline Tensor numeric_gradient(const std::function<double(const Tensor&)>& f, const Tensor& x, double eps) {
  std::vector<double> values = x.to_vector<double>();
  std::vector<double> grad(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double keep = values[i];
    values[i] = keep + eps;
    const double plus = f(Tensor::from_vector(values, x.shape()));
    values[i] = keep - eps;
    const double minus = f(Tensor::from_vector(values, x.shape()));
    values[i] = keep;
    grad[i] = (plus - minus) / (2 * eps);
  }
  return Tensor::from_vector(grad, x.shape());
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const auto av = a.cast(DType::f64).to_vector<double>();
  const auto bv = b.cast(DType::f64).to_vector<double>();
  double worst = 0;
  for (std::size_t i = 0; i < av.size(); ++i) worst = std::max(worst, std::abs(av[i] - bv[i]));
  return worst;
}

// Checks a float64 layer's backward against central differences of sum(forward(x) * w), for
// the input (unless it is ids) and every trainable variable.
inline void check_gradients(const nn::Layer& layer, const Tensor& x, const nn::CallContext& ctx,
                            bool input_has_gradient = true) {
  const Tensor out = layer.forward(x, ctx);
  const Tensor w = pseudo_random(out.shape(), 77);
  const nn::LayerGradients g = layer.backward(x, out, w, ctx, true);
  const double eps = 1e-6;
  if (input_has_gradient) {
    const Tensor num = numeric_gradient([&](const Tensor& v) { return weighted_sum(layer.forward(v, ctx), w); }, x, eps);
    REQUIRE(g.input.shape() == x.shape());
    CHECK(max_abs_diff(g.input, num) < 1e-7);
  }
  const auto weights = layer.weights();
  REQUIRE(g.variables.size() == weights.size());
  for (std::size_t k = 0; k < weights.size(); ++k) {
    CAPTURE(weights[k].first);
    Variable variable = weights[k].second;
    const Tensor keep = variable.value();
    REQUIRE(g.variables[k].shape() == keep.shape());
    const Tensor num = numeric_gradient(
        [&](const Tensor& v) {
          variable.assign(v);
          return weighted_sum(layer.forward(x, ctx), w);
        },
        keep, eps);
    variable.assign(keep);
    CHECK(max_abs_diff(g.variables[k], num) < 1e-7);
  }
}

}  // namespace troupe::testing
