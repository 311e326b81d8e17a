#include "troupe/nn/dropout.hpp"

#include <cmath>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "nn/eigen_maps.hpp"
#include "nn/layer_checks.hpp"

namespace troupe::nn {

namespace {

constexpr std::uint64_t golden = 0x9e3779b97f4a7c15ULL;

// SplitMix64's output function: a bijection that spreads every input bit over the output.
std::uint64_t finalize(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::uint64_t combine(std::uint64_t key, std::uint64_t value) { return finalize(key + golden + finalize(value + golden)); }

}  // namespace

Dropout::Dropout(double rate, std::uint64_t seed, std::string name) : Layer(std::move(name)), rate_(rate), seed_(seed) {
  if (!(rate >= 0.0 && rate < 1.0)) {
    throw std::invalid_argument("Dropout: rate is " + std::to_string(rate) + " (expected 0 <= rate < 1)");
  }
}

Tensor Dropout::mask(std::int64_t n, const CallContext& ctx) const {
  if (n < 0) throw std::invalid_argument(who() + ": mask of " + std::to_string(n) + " elements (expected n >= 0)");
  // The stream's key: (seed, step, replica, layer); element i is SplitMix64's i-th output from it.
  std::uint64_t key = finalize(seed_ + golden);
  key = combine(key, static_cast<std::uint64_t>(ctx.step));
  key = combine(key, static_cast<std::uint64_t>(ctx.replica));
  key = combine(key, static_cast<std::uint64_t>(ctx.layer));
  const double scale = 1.0 / (1.0 - rate_);
  Tensor out = Tensor::empty({n}, DType::f64);
  double* m = out.mutable_data<double>();
  for (std::int64_t i = 0; i < n; ++i) {
    const double unit = static_cast<double>(finalize(key + golden * static_cast<std::uint64_t>(i + 1)) >> 11) * 0x1.0p-53;
    m[i] = unit >= rate_ ? scale : 0.0;
  }
  return out;
}

Tensor Dropout::masked(const Tensor& t_in, const CallContext& ctx) const {
  detail::check_float_input(who(), t_in);
  const Tensor t = detail::on_host(t_in);
  const Tensor m = mask(t.num_elements(), ctx);
  Tensor out = Tensor::empty(t.shape(), t.dtype());
  eigen::dispatch_float(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = t.data<T>();
    const double* k = m.data<double>();
    T* o = out.mutable_data<T>();
    for (std::int64_t i = 0; i < t.num_elements(); ++i) o[i] = k[i] == 0.0 ? T(0) : in[i] * static_cast<T>(k[i]);
  });
  return detail::like_device(out, t_in);
}

Tensor Dropout::call(const Tensor& x, const CallContext& ctx) const {
  detail::check_float_input(who(), x);
  if (!ctx.training || rate_ == 0.0) return x;
  return masked(x, ctx);
}

LayerGradients Dropout::gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output,
                                  const CallContext& ctx, bool need_input) const {
  detail::check_grad_output(who(), grad_output, output);
  if (x.shape() != output.shape()) {
    throw std::invalid_argument(who() + ": output of shape " + shape_to_string(output.shape()) + " for input " +
                                shape_to_string(x.shape()) + " (expected the input's shape)");
  }
  LayerGradients out;
  if (need_input) out.input = !ctx.training || rate_ == 0.0 ? grad_output : masked(grad_output, ctx);
  return out;
}

std::string Dropout::config_json() const { return nlohmann::json{{"rate", rate_}, {"seed", seed_}}.dump(); }

}  // namespace troupe::nn
