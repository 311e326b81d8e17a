#include "troupe/nn/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "nn/eigen_maps.hpp"
#include "nn/layer_checks.hpp"
#include "troupe/nn/dropout.hpp"
#include "troupe/nn/ops.hpp"

namespace troupe::nn {

namespace {

constexpr const char* names[8] = {"query/kernel", "query/bias", "key/kernel", "key/bias",
                                  "value/kernel", "value/bias", "attention_output/kernel", "attention_output/bias"};

template <class T>
using Matrix = eigen::RowMajorMatrix<T>;
template <class T>
using ConstBlock = Eigen::Map<const Matrix<T>, 0, Eigen::OuterStride<>>;
template <class T>
using Block = Eigen::Map<Matrix<T>, 0, Eigen::OuterStride<>>;
template <class T>
using ConstMatrixMap = Eigen::Map<const Matrix<T>>;
template <class T>
using ConstRow = Eigen::Map<const eigen::RowVector<T>>;

// The sizes of one call.
struct Dims {
  Eigen::Index batch, length, dim, heads, key, value;
  Eigen::Index rows() const { return batch * length; }
};

// What the forward pass computes and backward needs again: the projections [rows, heads·key]
// (values [rows, heads·value]), the probabilities [batch, heads, length, length], with dropout
// the probabilities dropped and scaled (`kept`, same layout), and the heads' concatenated outputs
// [rows, heads·value].
template <class T>
struct Pass {
  Matrix<T> q, k, v, o;
  std::vector<T> p, kept;
};

// w: the eight host values in weights() order; mask: the dropout mask over the probabilities
// (1 / (1 - rate) kept, 0 dropped), or null for none.
template <class T>
Pass<T> attend(const Tensor& x, const std::vector<Tensor>& w, const Dims& d, bool causal, const double* mask) {
  const ConstMatrixMap<T> X(x.data<T>(), d.rows(), d.dim);
  const Eigen::Index hk = d.heads * d.key, hv = d.heads * d.value;
  Pass<T> s;
  s.q.noalias() = X * ConstMatrixMap<T>(w[0].data<T>(), d.dim, hk);
  s.q.rowwise() += ConstRow<T>(w[1].data<T>(), hk);
  s.k.noalias() = X * ConstMatrixMap<T>(w[2].data<T>(), d.dim, hk);
  s.k.rowwise() += ConstRow<T>(w[3].data<T>(), hk);
  s.v.noalias() = X * ConstMatrixMap<T>(w[4].data<T>(), d.dim, hv);
  s.v.rowwise() += ConstRow<T>(w[5].data<T>(), hv);
  s.o.resize(d.rows(), hv);
  s.p.resize(static_cast<std::size_t>(d.batch * d.heads * d.length * d.length));
  if (mask != nullptr) s.kept.resize(s.p.size());
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d.key)));
  const Eigen::Index L = d.length;
  for (Eigen::Index b = 0; b < d.batch; ++b) {
    for (Eigen::Index h = 0; h < d.heads; ++h) {
      const ConstBlock<T> qh(s.q.data() + b * L * hk + h * d.key, L, d.key, Eigen::OuterStride<>(hk));
      const ConstBlock<T> kh(s.k.data() + b * L * hk + h * d.key, L, d.key, Eigen::OuterStride<>(hk));
      const ConstBlock<T> vh(s.v.data() + b * L * hv + h * d.value, L, d.value, Eigen::OuterStride<>(hv));
      Eigen::Map<Matrix<T>> p(s.p.data() + (b * d.heads + h) * L * L, L, L);
      p.noalias() = (qh * kh.transpose()) * scale;
      for (Eigen::Index i = 0; i < L; ++i) {
        const Eigen::Index seen = causal ? i + 1 : L;  // the positions row i attends to
        T max = p(i, 0);
        for (Eigen::Index j = 1; j < seen; ++j) max = std::max(max, p(i, j));
        T sum = 0;
        for (Eigen::Index j = 0; j < seen; ++j) sum += (p(i, j) = std::exp(p(i, j) - max));
        for (Eigen::Index j = 0; j < seen; ++j) p(i, j) /= sum;
        for (Eigen::Index j = seen; j < L; ++j) p(i, j) = 0;
      }
      Block<T> oh(s.o.data() + b * L * hv + h * d.value, L, d.value, Eigen::OuterStride<>(hv));
      if (mask == nullptr) {
        oh.noalias() = p * vh;
        continue;
      }
      const Eigen::Index at = (b * d.heads + h) * L * L;
      Eigen::Map<Matrix<T>> kept(s.kept.data() + at, L, L);
      for (Eigen::Index e = 0; e < L * L; ++e) {
        const double m = mask[at + e];
        kept.data()[e] = m == 0.0 ? T(0) : p.data()[e] * static_cast<T>(m);
      }
      oh.noalias() = kept * vh;
    }
  }
  return s;
}

}  // namespace

struct MultiHeadAttention::State {
  mutable std::mutex mutex;
  int dim = -1;
  std::vector<Variable> variables;  // weights() order; empty until built
};

MultiHeadAttention::MultiHeadAttention(int num_heads, int key_dim, bool use_causal_mask, std::uint64_t seed,
                                       std::string name, int value_dim, DType dtype, double dropout)
    : Layer(std::move(name)),
      num_heads_(detail::positive("MultiHeadAttention", num_heads, "num_heads")),
      key_dim_(detail::positive("MultiHeadAttention", key_dim, "key_dim")),
      value_dim_(value_dim == -1 ? key_dim : detail::positive("MultiHeadAttention", value_dim, "value_dim")),
      causal_(use_causal_mask),
      dropout_(dropout),
      seed_(seed),
      dtype_(detail::float_dtype("MultiHeadAttention", dtype)),
      state_(std::make_shared<State>()) {
  if (!(dropout >= 0.0 && dropout < 1.0)) {
    throw std::invalid_argument("MultiHeadAttention: dropout is " + std::to_string(dropout) +
                                " (expected 0 <= dropout < 1)");
  }
}

std::optional<Tensor> MultiHeadAttention::attention_mask(std::int64_t elements, const CallContext& ctx) const {
  if (!ctx.training || dropout_ == 0.0) return std::nullopt;
  return Dropout(dropout_, seed_ + 4).mask(elements, ctx);
}

void MultiHeadAttention::build(const Shape& input_shape) const {
  if (input_shape.size() != 3 || input_shape.back() <= 0 || input_shape.back() > std::numeric_limits<int>::max()) {
    throw std::invalid_argument(who() + ": input of shape " + shape_to_string(input_shape) +
                                " (expected [batch, sequence, dim] with dim known)");
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (!state_->variables.empty()) return;
  const std::int64_t d = input_shape.back(), h = num_heads_, k = key_dim_, v = value_dim_;
  const auto kernel = [&](std::int64_t in, std::int64_t out, std::uint64_t seed, Shape shape) {
    return glorot_uniform(in, out, seed, dtype_).reshape(std::move(shape));
  };
  const Tensor values[8] = {kernel(d, h * k, seed_, {d, h, k}),         Tensor::zeros({h, k}, dtype_),
                            kernel(d, h * k, seed_ + 1, {d, h, k}),     Tensor::zeros({h, k}, dtype_),
                            kernel(d, h * v, seed_ + 2, {d, h, v}),     Tensor::zeros({h, v}, dtype_),
                            kernel(h * v, d, seed_ + 3, {h, v, d}),     Tensor::zeros({d}, dtype_)};
  for (int i = 0; i < 8; ++i) state_->variables.emplace_back(values[i], detail::variable_name(name(), names[i]));
  state_->dim = static_cast<int>(d);
}

bool MultiHeadAttention::built() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return !state_->variables.empty();
}

int MultiHeadAttention::dim() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->dim;
}

std::vector<std::pair<std::string, Variable>> MultiHeadAttention::weights() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  std::vector<std::pair<std::string, Variable>> out;
  for (std::size_t i = 0; i < state_->variables.size(); ++i) out.emplace_back(names[i], state_->variables[i]);
  return out;
}

Shape MultiHeadAttention::output_shape(const Shape& input_shape) const {
  const int dim = this->dim();
  if (input_shape.size() != 3 || (dim >= 0 && input_shape.back() >= 0 && input_shape.back() != dim)) {
    throw std::invalid_argument(who() + ": input of shape " + shape_to_string(input_shape) +
                                " (expected [batch, sequence, " + (dim >= 0 ? std::to_string(dim) : std::string("dim")) +
                                "])");
  }
  return input_shape;
}

void MultiHeadAttention::check_input(const Tensor& x) const {
  detail::check_float_input(who(), x, &dtype_);
  output_shape(x.shape());
}

std::vector<Tensor> MultiHeadAttention::host_values() const {
  std::vector<Tensor> out;
  for (auto& [name, variable] : weights()) out.push_back(detail::on_host(variable.value()));
  if (out.size() != 8) throw std::logic_error(who() + ": used before it was built");
  return out;
}

Tensor MultiHeadAttention::call(const Tensor& x_in, const CallContext& ctx) const {
  check_input(x_in);
  const Tensor x = detail::on_host(x_in);
  const std::vector<Tensor> w = host_values();
  const Dims d{x.shape()[0], x.shape()[1], x.shape()[2], num_heads_, key_dim_, value_dim_};
  const std::optional<Tensor> mask = attention_mask(d.batch * d.heads * d.length * d.length, ctx);
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  eigen::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const Pass<T> s = attend<T>(x, w, d, causal_, mask ? mask->data<double>() : nullptr);
    Eigen::Map<Matrix<T>> y(out.mutable_data<T>(), d.rows(), d.dim);
    y.noalias() = s.o * ConstMatrixMap<T>(w[6].data<T>(), d.heads * d.value, d.dim);
    y.rowwise() += ConstRow<T>(w[7].data<T>(), d.dim);
  });
  return detail::like_device(out, x_in);
}

LayerGradients MultiHeadAttention::gradients(const Tensor& x_in, const Tensor& output, const Tensor& grad_output,
                                             const CallContext& ctx, bool need_input) const {
  check_input(x_in);
  detail::check_grad_output(who(), grad_output, output);
  if (output.shape() != x_in.shape()) {
    throw std::invalid_argument(who() + ": output of shape " + shape_to_string(output.shape()) + " for input " +
                                shape_to_string(x_in.shape()) + " (expected the input's shape)");
  }
  const Tensor x = detail::on_host(x_in);
  const Tensor g = detail::on_host(grad_output);
  const std::vector<Tensor> w = host_values();
  const Dims d{x.shape()[0], x.shape()[1], x.shape()[2], num_heads_, key_dim_, value_dim_};
  std::vector<Tensor> grads;
  for (const Tensor& value : w) grads.push_back(Tensor::empty(value.shape(), value.dtype()));
  Tensor dx = need_input ? Tensor::empty(x.shape(), x.dtype()) : Tensor();
  // The forward call's mask, from the same context.
  const std::optional<Tensor> mask = attention_mask(d.batch * d.heads * d.length * d.length, ctx);
  const double* m = mask ? mask->data<double>() : nullptr;
  eigen::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const Eigen::Index hk = d.heads * d.key, hv = d.heads * d.value, L = d.length;
    const Pass<T> s = attend<T>(x, w, d, causal_, m);
    const ConstMatrixMap<T> X(x.data<T>(), d.rows(), d.dim);
    const ConstMatrixMap<T> dy(g.data<T>(), d.rows(), d.dim);
    const auto as_matrix = [](Tensor& t, Eigen::Index rows, Eigen::Index cols) {
      return Eigen::Map<Matrix<T>>(t.mutable_data<T>(), rows, cols);
    };
    const auto as_row = [](Tensor& t, Eigen::Index cols) { return Eigen::Map<eigen::RowVector<T>>(t.mutable_data<T>(), cols); };
    // The output projection.
    as_matrix(grads[6], hv, d.dim).noalias() = s.o.transpose() * dy;
    as_row(grads[7], d.dim) = dy.colwise().sum();
    const Matrix<T> d_o = dy * ConstMatrixMap<T>(w[6].data<T>(), hv, d.dim).transpose();
    // Each head: through P·V, the softmax and the scaled Q·Kᵀ.
    Matrix<T> dq(d.rows(), hk), dk(d.rows(), hk), dv(d.rows(), hv);
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d.key)));
    Matrix<T> dp(L, L);
    for (Eigen::Index b = 0; b < d.batch; ++b) {
      for (Eigen::Index h = 0; h < d.heads; ++h) {
        const Eigen::Index qk_at = b * L * hk + h * d.key, v_at = b * L * hv + h * d.value;
        const ConstBlock<T> qh(s.q.data() + qk_at, L, d.key, Eigen::OuterStride<>(hk));
        const ConstBlock<T> kh(s.k.data() + qk_at, L, d.key, Eigen::OuterStride<>(hk));
        const ConstBlock<T> vh(s.v.data() + v_at, L, d.value, Eigen::OuterStride<>(hv));
        const ConstBlock<T> doh(d_o.data() + v_at, L, d.value, Eigen::OuterStride<>(hv));
        const Eigen::Index at = (b * d.heads + h) * L * L;
        const Eigen::Map<const Matrix<T>> p(s.p.data() + at, L, L);
        // V was weighed by the probabilities as dropped: dV with those, and dP through the mask.
        const Eigen::Map<const Matrix<T>> weighed(m != nullptr ? s.kept.data() + at : s.p.data() + at, L, L);
        Block<T>(dv.data() + v_at, L, d.value, Eigen::OuterStride<>(hv)).noalias() = weighed.transpose() * doh;
        dp.noalias() = doh * vh.transpose();
        if (m != nullptr) {
          for (Eigen::Index e = 0; e < L * L; ++e) dp.data()[e] = m[at + e] == 0.0 ? T(0) : dp.data()[e] * static_cast<T>(m[at + e]);
        }
        // Softmax backward, row by row: dS = P ∘ (dP - Σ_j P·dP), times the scale. Masked
        // positions have P = 0, so they get no gradient.
        for (Eigen::Index i = 0; i < L; ++i) {
          const T dot = (p.row(i).array() * dp.row(i).array()).sum();
          dp.row(i) = (p.row(i).array() * (dp.row(i).array() - dot) * scale).matrix();
        }
        Block<T>(dq.data() + qk_at, L, d.key, Eigen::OuterStride<>(hk)).noalias() = dp * kh;
        Block<T>(dk.data() + qk_at, L, d.key, Eigen::OuterStride<>(hk)).noalias() = dp.transpose() * qh;
      }
    }
    as_matrix(grads[0], d.dim, hk).noalias() = X.transpose() * dq;
    as_row(grads[1], hk) = dq.colwise().sum();
    as_matrix(grads[2], d.dim, hk).noalias() = X.transpose() * dk;
    as_row(grads[3], hk) = dk.colwise().sum();
    as_matrix(grads[4], d.dim, hv).noalias() = X.transpose() * dv;
    as_row(grads[5], hv) = dv.colwise().sum();
    if (need_input) {
      auto dX = as_matrix(dx, d.rows(), d.dim);
      dX.noalias() = dq * ConstMatrixMap<T>(w[0].data<T>(), d.dim, hk).transpose();
      dX.noalias() += dk * ConstMatrixMap<T>(w[2].data<T>(), d.dim, hk).transpose();
      dX.noalias() += dv * ConstMatrixMap<T>(w[4].data<T>(), d.dim, hv).transpose();
    }
  });
  LayerGradients out;
  if (need_input) out.input = detail::like_device(dx, x_in);
  for (Tensor& t : grads) out.variables.push_back(detail::like_device(t, grad_output));
  return out;
}

std::string MultiHeadAttention::config_json() const {
  return nlohmann::json{{"num_heads", num_heads_},
                        {"key_dim", key_dim_},
                        {"value_dim", value_dim_},
                        {"dropout", dropout_},
                        {"use_bias", true},
                        {"use_causal_mask", causal_},
                        {"seed", seed_},
                        {"dtype", std::string(dtype_name(dtype_))}}
      .dump();
}

}  // namespace troupe::nn
