#include "troupe/nn/normalization.hpp"

#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "nn/eigen_maps.hpp"
#include "nn/layer_checks.hpp"

namespace troupe::nn {

namespace {

DType checked_dtype(DType dtype, double epsilon) {
  detail::float_dtype("LayerNormalization", dtype);
  if (!(epsilon > 0.0) || !std::isfinite(epsilon)) {
    throw std::invalid_argument("LayerNormalization: epsilon is " + std::to_string(epsilon) +
                                " (expected a positive number)");
  }
  return dtype;
}

// Each row's mean and 1 / sqrt(variance + epsilon), summed in double in the row's order.
template <class T>
void row_statistics(const T* x, std::int64_t rows, std::int64_t units, double epsilon, std::vector<double>& mean,
                    std::vector<double>& inv_std) {
  mean.resize(static_cast<std::size_t>(rows));
  inv_std.resize(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * units;
    double sum = 0;
    for (std::int64_t k = 0; k < units; ++k) sum += static_cast<double>(row[k]);
    const double m = sum / static_cast<double>(units);
    double squares = 0;
    for (std::int64_t k = 0; k < units; ++k) squares += (static_cast<double>(row[k]) - m) * (static_cast<double>(row[k]) - m);
    mean[static_cast<std::size_t>(r)] = m;
    inv_std[static_cast<std::size_t>(r)] = 1.0 / std::sqrt(squares / static_cast<double>(units) + epsilon);
  }
}

}  // namespace

struct LayerNormalization::State {
  mutable std::mutex mutex;
  int units = -1;
  std::optional<Variable> gamma;
  std::optional<Variable> beta;
};

LayerNormalization::LayerNormalization(double epsilon, std::string name, DType dtype)
    : Layer(std::move(name)),
      epsilon_(epsilon),
      dtype_(checked_dtype(dtype, epsilon)),
      state_(std::make_shared<State>()) {}

void LayerNormalization::build(const Shape& input_shape) const {
  if (input_shape.size() < 2 || input_shape.back() <= 0 || input_shape.back() > std::numeric_limits<int>::max()) {
    throw std::invalid_argument(who() + ": input of shape " + shape_to_string(input_shape) +
                                " (expected [batch, ..., units] with the units known)");
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->gamma) return;
  const int units = static_cast<int>(input_shape.back());
  state_->gamma.emplace(Tensor::full({units}, 1.0, dtype_), detail::variable_name(name(), "gamma"));
  state_->beta.emplace(Tensor::zeros({units}, dtype_), detail::variable_name(name(), "beta"));
  state_->units = units;
}

bool LayerNormalization::built() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->gamma.has_value();
}

int LayerNormalization::units() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->units;
}

const Variable& LayerNormalization::gamma() const {
  if (!built()) throw std::logic_error(who() + ".gamma: the layer is not built yet (its width comes from its first input, or build())");
  return *state_->gamma;
}

const Variable& LayerNormalization::beta() const {
  if (!built()) throw std::logic_error(who() + ".beta: the layer is not built yet (its width comes from its first input, or build())");
  return *state_->beta;
}

std::vector<std::pair<std::string, Variable>> LayerNormalization::weights() const {
  if (!built()) return {};
  return {{"gamma", *state_->gamma}, {"beta", *state_->beta}};
}

Shape LayerNormalization::output_shape(const Shape& input_shape) const {
  const int units = this->units();
  if (input_shape.size() < 2 || (units >= 0 && input_shape.back() >= 0 && input_shape.back() != units)) {
    throw std::invalid_argument(who() + ": input of shape " + shape_to_string(input_shape) + " (expected [batch, ..., " +
                                (units >= 0 ? std::to_string(units) : std::string("units")) + "])");
  }
  return input_shape;
}

void LayerNormalization::check_input(const Tensor& x) const {
  detail::check_float_input(who(), x, &dtype_);
  output_shape(x.shape());
}

Tensor LayerNormalization::call(const Tensor& x_in, const CallContext&) const {
  check_input(x_in);
  const std::int64_t units = this->units();
  const Tensor x = detail::on_host(x_in);
  const Tensor gamma = detail::on_host(this->gamma().value());
  const Tensor beta = detail::on_host(this->beta().value());
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  const std::int64_t rows = x.num_elements() / units;
  eigen::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    std::vector<double> mean, inv_std;
    row_statistics(x.data<T>(), rows, units, epsilon_, mean, inv_std);
    const T* in = x.data<T>();
    const T* g = gamma.data<T>();
    const T* b = beta.data<T>();
    T* o = out.mutable_data<T>();
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto m = static_cast<T>(mean[static_cast<std::size_t>(r)]);
      const auto s = static_cast<T>(inv_std[static_cast<std::size_t>(r)]);
      for (std::int64_t k = 0; k < units; ++k) o[r * units + k] = g[k] * ((in[r * units + k] - m) * s) + b[k];
    }
  });
  return detail::like_device(out, x_in);
}

LayerGradients LayerNormalization::gradients(const Tensor& x_in, const Tensor& output, const Tensor& grad_output,
                                             const CallContext&, bool need_input) const {
  check_input(x_in);
  detail::check_grad_output(who(), grad_output, output);
  if (output.shape() != x_in.shape()) {
    throw std::invalid_argument(who() + ": output of shape " + shape_to_string(output.shape()) + " for input " +
                                shape_to_string(x_in.shape()) + " (expected the input's shape)");
  }
  const std::int64_t units = this->units();
  const Tensor x = detail::on_host(x_in);
  const Tensor gy = detail::on_host(grad_output);
  const Tensor gamma = detail::on_host(this->gamma().value());
  const std::int64_t rows = x.num_elements() / units;
  Tensor dgamma = Tensor::empty({units}, x.dtype());
  Tensor dbeta = Tensor::empty({units}, x.dtype());
  Tensor dx = need_input ? Tensor::empty(x.shape(), x.dtype()) : Tensor();
  eigen::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    std::vector<double> mean, inv_std;
    row_statistics(x.data<T>(), rows, units, epsilon_, mean, inv_std);
    const T* in = x.data<T>();
    const T* g = gy.data<T>();
    const T* gam = gamma.data<T>();
    std::vector<double> sum_gamma(static_cast<std::size_t>(units), 0.0), sum_beta(static_cast<std::size_t>(units), 0.0);
    std::vector<double> xhat(static_cast<std::size_t>(units)), dxhat(static_cast<std::size_t>(units));
    const double n = static_cast<double>(units);
    for (std::int64_t r = 0; r < rows; ++r) {
      const double m = mean[static_cast<std::size_t>(r)], s = inv_std[static_cast<std::size_t>(r)];
      double sum_dxhat = 0, sum_dxhat_xhat = 0;
      for (std::int64_t k = 0; k < units; ++k) {
        const auto kk = static_cast<std::size_t>(k);
        const double gk = static_cast<double>(g[r * units + k]);
        xhat[kk] = (static_cast<double>(in[r * units + k]) - m) * s;
        sum_gamma[kk] += gk * xhat[kk];
        sum_beta[kk] += gk;
        dxhat[kk] = gk * static_cast<double>(gam[k]);
        sum_dxhat += dxhat[kk];
        sum_dxhat_xhat += dxhat[kk] * xhat[kk];
      }
      if (!need_input) continue;
      // dx = (1 / std) · (dxhat - mean(dxhat) - xhat · mean(dxhat · xhat))
      T* d = dx.mutable_data<T>() + r * units;
      for (std::int64_t k = 0; k < units; ++k) {
        const auto kk = static_cast<std::size_t>(k);
        d[k] = static_cast<T>(s * (dxhat[kk] - sum_dxhat / n - xhat[kk] * sum_dxhat_xhat / n));
      }
    }
    for (std::int64_t k = 0; k < units; ++k) {
      dgamma.mutable_data<T>()[k] = static_cast<T>(sum_gamma[static_cast<std::size_t>(k)]);
      dbeta.mutable_data<T>()[k] = static_cast<T>(sum_beta[static_cast<std::size_t>(k)]);
    }
  });
  LayerGradients out;
  if (need_input) out.input = detail::like_device(dx, x_in);
  out.variables.push_back(detail::like_device(dgamma, grad_output));
  out.variables.push_back(detail::like_device(dbeta, grad_output));
  return out;
}

std::string LayerNormalization::config_json() const {
  return nlohmann::json{ {"epsilon", epsilon_}, {"axis", -1}, {"dtype", std::string(dtype_name(dtype_))}}
      .dump();
}

}  // namespace troupe::nn
