#include "troupe/nn/batch_normalization.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "distribute/strategies/context_state.hpp"
#include "nn/eigen_maps.hpp"
#include "nn/layer_checks.hpp"
#include "troupe/distribute/context.hpp"

namespace troupe::nn {

namespace {

const char* layer_kind(bool synchronized) { return synchronized ? "SyncBatchNormalization" : "BatchNormalization"; }

DType checked_dtype(DType dtype, double momentum, double epsilon, bool synchronized) {
  const std::string kind = layer_kind(synchronized);
  if (dtype != DType::f32 && dtype != DType::f64) {
    throw std::invalid_argument(kind + ": dtype " + std::string(dtype_name(dtype)) + " (expected float32 or float64)");
  }
  if (!(momentum >= 0.0 && momentum <= 1.0)) {
    throw std::invalid_argument(kind + ": momentum is " + std::to_string(momentum) + " (expected 0 <= momentum <= 1)");
  }
  if (!(epsilon > 0.0) || !std::isfinite(epsilon)) {
    throw std::invalid_argument(kind + ": epsilon is " + std::to_string(epsilon) + " (expected a positive number)");
  }
  return dtype;
}

// The replica context when the statistics must span the replicas: inside a replica function of
// a strategy with more than one replica in sync; nullptr elsewhere.
distribute::ReplicaContext* spanning_context() {
  distribute::ReplicaContext* ctx = distribute::detail::installed_replica_context();
  return ctx != nullptr && ctx->num_replicas_in_sync() > 1 ? ctx : nullptr;
}

// Per channel: the mean and 1 / sqrt(variance + epsilon) the layer normalises with, the
// variance, and the number of rows they were taken over (the global batch for a synchronised
// layer).
struct Statistics {
  std::vector<double> mean;
  std::vector<double> variance;
  std::vector<double> inv_std;
  double count = 0;
};

// The batch's statistics of x [rows, units] (row-major, channels last), summed in double:
// two passes for BatchNormalization; for SyncBatchNormalization the sums (sum, sum of squares,
// count) all-reduced over `ctx`'s replicas when given, as TensorFlow's SyncBatchNormalization.
template <class T>
Statistics batch_statistics(const T* x, std::int64_t rows, std::int64_t units, double epsilon, bool synchronized,
                            distribute::ReplicaContext* ctx) {
  const auto u = static_cast<std::size_t>(units);
  Statistics s;
  s.mean.assign(u, 0.0);
  s.variance.assign(u, 0.0);
  s.inv_std.assign(u, 0.0);
  if (synchronized) {
    Tensor sums = Tensor::zeros({2 * units + 1}, DType::f64);
    double* p = sums.mutable_data<double>();
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t k = 0; k < units; ++k) {
        const double v = static_cast<double>(x[r * units + k]);
        p[k] += v;
        p[units + k] += v * v;
      }
    }
    p[2 * units] = static_cast<double>(rows);
    if (ctx != nullptr) sums = ctx->all_reduce(distribute::ReduceOp::sum, sums);
    const double* q = sums.data<double>();
    s.count = q[2 * units];
    for (std::size_t k = 0; k < u; ++k) {
      s.mean[k] = q[k] / s.count;
      s.variance[k] = std::max(0.0, q[u + k] / s.count - s.mean[k] * s.mean[k]);
    }
  } else {
    s.count = static_cast<double>(rows);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t k = 0; k < units; ++k) s.mean[static_cast<std::size_t>(k)] += static_cast<double>(x[r * units + k]);
    }
    for (double& m : s.mean) m /= s.count;
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t k = 0; k < units; ++k) {
        const double d = static_cast<double>(x[r * units + k]) - s.mean[static_cast<std::size_t>(k)];
        s.variance[static_cast<std::size_t>(k)] += d * d;
      }
    }
    for (double& v : s.variance) v /= s.count;
  }
  for (std::size_t k = 0; k < u; ++k) s.inv_std[k] = 1.0 / std::sqrt(s.variance[k] + epsilon);
  return s;
}

// The statistics of inference: the moving ones.
template <class T>
Statistics moving_statistics(const Tensor& mean, const Tensor& variance, double epsilon) {
  const auto u = static_cast<std::size_t>(mean.num_elements());
  Statistics s;
  s.mean.resize(u);
  s.variance.resize(u);
  s.inv_std.resize(u);
  for (std::size_t k = 0; k < u; ++k) {
    s.mean[k] = static_cast<double>(mean.data<T>()[k]);
    s.variance[k] = static_cast<double>(variance.data<T>()[k]);
    s.inv_std[k] = 1.0 / std::sqrt(s.variance[k] + epsilon);
  }
  return s;
}

}  // namespace

struct BatchNormalization::State {
  mutable std::mutex mutex;
  int units = -1;
  std::optional<Variable> gamma;
  std::optional<Variable> beta;
  std::optional<Variable> moving_mean;
  std::optional<Variable> moving_variance;
};

BatchNormalization::BatchNormalization(double momentum, double epsilon, bool center, bool scale, std::string name,
                                       DType dtype)
    : BatchNormalization(momentum, epsilon, center, scale, std::move(name), dtype, false) {}

BatchNormalization::BatchNormalization(double momentum, double epsilon, bool center, bool scale, std::string name,
                                       DType dtype, bool synchronized)
    : Layer(std::move(name)),
      momentum_(momentum),
      epsilon_(epsilon),
      center_(center),
      scale_(scale),
      dtype_(checked_dtype(dtype, momentum, epsilon, synchronized)),
      synchronized_(synchronized),
      state_(std::make_shared<State>()) {}

SyncBatchNormalization::SyncBatchNormalization(double momentum, double epsilon, bool center, bool scale,
                                               std::string name, DType dtype)
    : BatchNormalization(momentum, epsilon, center, scale, std::move(name), dtype, true) {}

void BatchNormalization::build(const Shape& input_shape) const {
  if (input_shape.size() < 2 || input_shape.back() <= 0 || input_shape.back() > std::numeric_limits<int>::max()) {
    throw std::invalid_argument(who() + ": input of shape " + shape_to_string(input_shape) +
                                " (expected [batch, ..., channels] with the channels known)");
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->moving_mean) return;
  const int units = static_cast<int>(input_shape.back());
  if (scale_) state_->gamma.emplace(Tensor::full({units}, 1.0, dtype_), detail::variable_name(name(), "gamma"));
  if (center_) state_->beta.emplace(Tensor::zeros({units}, dtype_), detail::variable_name(name(), "beta"));
  // Mirrored, aggregated by MEAN: a write in replica context averages the replicas' values.
  state_->moving_mean.emplace(Tensor::zeros({units}, dtype_), detail::variable_name(name(), "moving_mean"),
                              VariableSynchronization::on_write, VariableAggregation::mean);
  state_->moving_variance.emplace(Tensor::full({units}, 1.0, dtype_), detail::variable_name(name(), "moving_variance"),
                                  VariableSynchronization::on_write, VariableAggregation::mean);
  state_->units = units;
}

bool BatchNormalization::built() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->moving_mean.has_value();
}

int BatchNormalization::units() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->units;
}

const Variable& BatchNormalization::built_variable(const char* what) const {
  if (!built()) {
    throw std::logic_error(who() + "." + what + ": the layer is not built yet (its channels come from its first input, or build())");
  }
  const std::string w = what;
  const std::optional<Variable>& v = w == "gamma"  ? state_->gamma
                                     : w == "beta" ? state_->beta
                                     : w == "moving_mean" ? state_->moving_mean
                                                          : state_->moving_variance;
  if (!v) {
    throw std::logic_error(who() + "." + what + ": the layer has no " + what + " (it was made with " +
                           (w == "gamma" ? "scale" : "center") + "=false)");
  }
  return *v;
}

const Variable& BatchNormalization::gamma() const { return built_variable("gamma"); }
const Variable& BatchNormalization::beta() const { return built_variable("beta"); }
const Variable& BatchNormalization::moving_mean() const { return built_variable("moving_mean"); }
const Variable& BatchNormalization::moving_variance() const { return built_variable("moving_variance"); }

std::vector<std::pair<std::string, Variable>> BatchNormalization::weights() const {
  if (!built()) return {};
  std::vector<std::pair<std::string, Variable>> out;
  if (state_->gamma) out.emplace_back("gamma", *state_->gamma);
  if (state_->beta) out.emplace_back("beta", *state_->beta);
  return out;
}

std::vector<std::pair<std::string, Variable>> BatchNormalization::non_trainable_weights() const {
  if (!built()) return {};
  return {{"moving_mean", *state_->moving_mean}, {"moving_variance", *state_->moving_variance}};
}

Shape BatchNormalization::output_shape(const Shape& input_shape) const {
  const int units = this->units();
  if (input_shape.size() < 2 || (units >= 0 && input_shape.back() >= 0 && input_shape.back() != units)) {
    throw std::invalid_argument(who() + ": input of shape " + shape_to_string(input_shape) + " (expected [batch, ..., " +
                                (units >= 0 ? std::to_string(units) : std::string("channels")) + "])");
  }
  return input_shape;
}

void BatchNormalization::check_input(const Tensor& x) const {
  detail::check_float_input(who(), x, &dtype_);
  output_shape(x.shape());
}

Tensor BatchNormalization::call(const Tensor& x_in, const CallContext& ctx) const {
  check_input(x_in);
  const std::int64_t units = this->units();
  const Tensor x = detail::on_host(x_in);
  const Tensor gamma = scale_ ? detail::on_host(this->gamma().value()) : Tensor();
  const Tensor beta = center_ ? detail::on_host(this->beta().value()) : Tensor();
  const Tensor moving_mean = detail::on_host(this->moving_mean().value());
  const Tensor moving_variance = detail::on_host(this->moving_variance().value());
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  const auto u = static_cast<std::size_t>(units);
  const std::int64_t rows = x.num_elements() / units;
  distribute::ReplicaContext* replicas = ctx.training ? spanning_context() : nullptr;
  Tensor next_mean, next_variance;
  eigen::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = x.data<T>();
    const Statistics s = ctx.training ? batch_statistics(in, rows, units, epsilon_, synchronized_, replicas)
                                      : moving_statistics<T>(moving_mean, moving_variance, epsilon_);
    T* o = out.mutable_data<T>();
    // Per channel, then row by row in memory order (channels last).
    std::vector<T> m(u), inv(u), g(u), b(u);
    for (std::size_t k = 0; k < u; ++k) {
      m[k] = static_cast<T>(s.mean[k]);
      inv[k] = static_cast<T>(s.inv_std[k]);
      g[k] = scale_ ? gamma.data<T>()[k] : T(1);
      b[k] = center_ ? beta.data<T>()[k] : T(0);
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* row = in + r * units;
      T* y = o + r * units;
      for (std::size_t k = 0; k < u; ++k) y[k] = g[k] * ((row[k] - m[k]) * inv[k]) + b[k];
    }
    if (!ctx.training || !ctx.update_state) return;
    // Keras's update: moving * momentum + batch * (1 - momentum). A batch of no rows (a
    // replica's share of a short last batch) leaves its replica's moving statistics as they are.
    next_mean = Tensor::empty({units}, x.dtype());
    next_variance = Tensor::empty({units}, x.dtype());
    const auto keep = static_cast<T>(momentum_);
    const auto take = static_cast<T>(1.0 - momentum_);
    for (std::int64_t k = 0; k < units; ++k) {
      const auto kk = static_cast<std::size_t>(k);
      const T mm = moving_mean.data<T>()[k];
      const T mv = moving_variance.data<T>()[k];
      const bool empty = s.count == 0;
      next_mean.mutable_data<T>()[k] = empty ? mm : mm * keep + static_cast<T>(s.mean[kk]) * take;
      next_variance.mutable_data<T>()[k] = empty ? mv : mv * keep + static_cast<T>(s.variance[kk]) * take;
    }
  });
  if (ctx.training && ctx.update_state) {
    // BatchNormalization: each replica's update from its own batch, averaged over the replicas
    // (the variables' MEAN aggregation) in one all-reduce. SyncBatchNormalization's replicas all
    // computed the same global statistics, so the same bits: each writes its own.
    if (replicas != nullptr && !synchronized_) {
      std::vector<Tensor> averaged = replicas->all_reduce(distribute::ReduceOp::mean, {next_mean, next_variance});
      next_mean = std::move(averaged[0]);
      next_variance = std::move(averaged[1]);
    }
    Variable mean_variable = this->moving_mean();
    Variable variance_variable = this->moving_variance();
    mean_variable.assign_local(detail::like_device(next_mean, mean_variable.value()));
    variance_variable.assign_local(detail::like_device(next_variance, variance_variable.value()));
  }
  return detail::like_device(out, x_in);
}

LayerGradients BatchNormalization::gradients(const Tensor& x_in, const Tensor& output, const Tensor& grad_output,
                                             const CallContext& ctx, bool need_input) const {
  check_input(x_in);
  detail::check_grad_output(who(), grad_output, output);
  if (output.shape() != x_in.shape()) {
    throw std::invalid_argument(who() + ": output of shape " + shape_to_string(output.shape()) + " for input " +
                                shape_to_string(x_in.shape()) + " (expected the input's shape)");
  }
  const std::int64_t units = this->units();
  const auto u = static_cast<std::size_t>(units);
  const Tensor x = detail::on_host(x_in);
  const Tensor gy = detail::on_host(grad_output);
  const Tensor gamma = scale_ ? detail::on_host(this->gamma().value()) : Tensor();
  const std::int64_t rows = x.num_elements() / units;
  distribute::ReplicaContext* replicas = ctx.training && synchronized_ ? spanning_context() : nullptr;
  Tensor dgamma = Tensor::empty({units}, x.dtype());
  Tensor dbeta = Tensor::empty({units}, x.dtype());
  Tensor dx = need_input ? Tensor::empty(x.shape(), x.dtype()) : Tensor();
  eigen::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = x.data<T>();
    const T* g = gy.data<T>();
    const Statistics s =
        ctx.training ? batch_statistics(in, rows, units, epsilon_, synchronized_, replicas)
                     : moving_statistics<T>(detail::on_host(moving_mean().value()),
                                            detail::on_host(moving_variance().value()), epsilon_);
    // This replica's sums of dy and dy · xhat: beta's and gamma's gradients.
    Tensor sums = Tensor::zeros({2 * units}, DType::f64);
    double* sum_dy = sums.mutable_data<double>();
    double* sum_dy_xhat = sum_dy + units;
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::size_t k = 0; k < u; ++k) {
        const double dy = static_cast<double>(g[r * units + static_cast<std::int64_t>(k)]);
        sum_dy[k] += dy;
        sum_dy_xhat[k] += dy * (static_cast<double>(in[r * units + static_cast<std::int64_t>(k)]) - s.mean[k]) * s.inv_std[k];
      }
    }
    for (std::int64_t k = 0; k < units; ++k) {
      dgamma.mutable_data<T>()[k] = static_cast<T>(sum_dy_xhat[k]);
      dbeta.mutable_data<T>()[k] = static_cast<T>(sum_dy[k]);
    }
    if (!need_input) return;
    T* d = dx.mutable_data<T>();
    std::vector<double> scale(u);
    for (std::size_t k = 0; k < u; ++k) scale[k] = (scale_ ? static_cast<double>(gamma.data<T>()[k]) : 1.0) * s.inv_std[k];
    if (!ctx.training) {
      // The moving statistics are constants: dx = gamma / std · dy.
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::size_t k = 0; k < u; ++k) {
          const std::int64_t at = r * units + static_cast<std::int64_t>(k);
          d[at] = static_cast<T>(scale[k] * static_cast<double>(g[at]));
        }
      }
      return;
    }
    // The means over the batch the statistics came from (every replica's, when synchronised):
    // dx = gamma / std · (dy - mean(dy) - xhat · mean(dy · xhat)).
    Tensor global = replicas != nullptr ? replicas->all_reduce(distribute::ReduceOp::sum, sums) : sums;
    const double* gsum_dy = global.data<double>();
    const double* gsum_dy_xhat = gsum_dy + units;
    std::vector<double> mean_dy(u), mean_dy_xhat(u);
    for (std::size_t k = 0; k < u; ++k) {
      mean_dy[k] = s.count > 0 ? gsum_dy[k] / s.count : 0.0;
      mean_dy_xhat[k] = s.count > 0 ? gsum_dy_xhat[k] / s.count : 0.0;
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::size_t k = 0; k < u; ++k) {
        const std::int64_t at = r * units + static_cast<std::int64_t>(k);
        const double xhat = (static_cast<double>(in[at]) - s.mean[k]) * s.inv_std[k];
        d[at] = static_cast<T>(scale[k] * (static_cast<double>(g[at]) - mean_dy[k] - xhat * mean_dy_xhat[k]));
      }
    }
  });
  LayerGradients out;
  if (need_input) out.input = detail::like_device(dx, x_in);
  if (scale_) out.variables.push_back(detail::like_device(dgamma, grad_output));
  if (center_) out.variables.push_back(detail::like_device(dbeta, grad_output));
  return out;
}

std::string BatchNormalization::config_json() const {
  return nlohmann::json{{"axis", -1},         {"momentum", momentum_},
                        {"epsilon", epsilon_}, {"center", center_},
                        {"scale", scale_},     {"synchronized", synchronized_},
                        {"dtype", std::string(dtype_name(dtype_))}}
      .dump();
}

}  // namespace troupe::nn
