// Optimizers that the ps tasks apply to their own shards (ShardOptimizer): the worker's side
// (FunctionContext::apply_gradients: gradients cut into shards, one message each) and the ps
// task's (apply_raw: the update of a shard or a row, with the slots beside it).
//
// Built with -ffp-contract=off, as the CPU kernels are: no multiply-add is fused, so a shard
// updated here gets the bits nn::SGD and nn::Adam give in one process.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "distribute/cluster/remote_wire.hpp"
#include "distribute/cluster/worker_services.hpp"
#include "troupe/actors/shard_client.hpp"
#include "troupe/base/quote.hpp"
#include "troupe/distribute/remote_function.hpp"

namespace troupe::distribute {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Requires lo <= value < hi, or lo < value < hi when lo_open, as nn's optimizers do.
float checked(const char* optimizer, const char* what, float value, float lo, float hi, bool lo_open) {
  const bool ok = (lo_open ? value > lo : value >= lo) && value < hi && std::isfinite(value);
  if (!ok) {
    throw std::invalid_argument(std::string("ShardOptimizer::") + optimizer + ": " + what + " is " +
                                std::to_string(value) + " (expected " + (lo_open ? "> " : ">= ") + std::to_string(lo) +
                                (std::isinf(hi) ? std::string() : " and < " + std::to_string(hi)) + ")");
  }
  return value;
}

actors::apply_params params_of(const ShardOptimizer& o) {
  actors::apply_params p;
  switch (o.kind) {
    case ShardOptimizer::Kind::sgd: p.kind = actors::shard_optimizer::sgd; break;
    case ShardOptimizer::Kind::momentum: p.kind = actors::shard_optimizer::momentum; break;
    case ShardOptimizer::Kind::adam: p.kind = actors::shard_optimizer::adam; break;
    case ShardOptimizer::Kind::adamw: p.kind = actors::shard_optimizer::adamw; break;
  }
  // Floats widened exactly: the ps task narrows them back to the shard's type as nn's optimizers do.
  p.nesterov = o.nesterov;
  p.learning_rate = o.learning_rate;
  p.momentum = o.momentum;
  p.beta_1 = o.beta_1;
  p.beta_2 = o.beta_2;
  p.epsilon = o.epsilon;
  p.weight_decay = o.weight_decay;
  return p;
}

template <class T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
void store(char* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

// The elements may lie unaligned in a shard's bytes: each is copied in and out.
template <class T>
void apply_typed(char* value, char* const* slots, const char* grad, std::size_t n, const actors::apply_params& p,
                 std::int64_t step) {
  constexpr std::size_t z = sizeof(T);
  switch (p.kind) {
    case actors::shard_optimizer::sgd: {
      const auto lr = static_cast<T>(static_cast<float>(p.learning_rate));
      for (std::size_t i = 0; i < n; ++i) store<T>(value + i * z, load<T>(value + i * z) - lr * load<T>(grad + i * z));
      return;
    }
    case actors::shard_optimizer::momentum: {
      const auto lr = static_cast<T>(static_cast<float>(p.learning_rate));
      const auto m = static_cast<T>(static_cast<float>(p.momentum));
      for (std::size_t i = 0; i < n; ++i) {
        const T g = load<T>(grad + i * z);
        const T velocity = m * load<T>(slots[0] + i * z) - lr * g;
        store<T>(slots[0] + i * z, velocity);
        const T w = load<T>(value + i * z);
        store<T>(value + i * z, p.nesterov ? w + (m * velocity - lr * g) : w + velocity);
      }
      return;
    }
    case actors::shard_optimizer::adam:
    case actors::shard_optimizer::adamw: {
      // nn::Adam's step size: the bias corrections in double, then narrowed.
      const double t = static_cast<double>(step);
      const double b1 = p.beta_1;
      const double b2 = p.beta_2;
      const double lr_t = static_cast<double>(static_cast<float>(p.learning_rate)) * std::sqrt(1.0 - std::pow(b2, t)) /
                          (1.0 - std::pow(b1, t));
      const auto tb1 = static_cast<T>(b1), c1 = static_cast<T>(1.0 - b1);
      const auto tb2 = static_cast<T>(b2), c2 = static_cast<T>(1.0 - b2);
      const auto eps = static_cast<T>(p.epsilon);
      const auto tlr_t = static_cast<T>(lr_t);
      const bool decay = p.kind == actors::shard_optimizer::adamw;
      const auto wd = static_cast<T>(p.weight_decay);
      const auto lr = static_cast<T>(static_cast<float>(p.learning_rate));
      for (std::size_t i = 0; i < n; ++i) {
        const T g = load<T>(grad + i * z);
        T w = load<T>(value + i * z);
        if (decay) w = w - w * wd * lr;  // Keras's AdamW: the decay first, with the plain rate
        const T mi = tb1 * load<T>(slots[0] + i * z) + c1 * g;
        const T vi = tb2 * load<T>(slots[1] + i * z) + c2 * (g * g);
        store<T>(slots[0] + i * z, mi);
        store<T>(slots[1] + i * z, vi);
        store<T>(value + i * z, w - tlr_t * mi / (std::sqrt(vi) + eps));
      }
      return;
    }
  }
}

}  // namespace

ShardOptimizer ShardOptimizer::sgd(float learning_rate, float momentum, bool nesterov) {
  ShardOptimizer o;
  o.kind = momentum == 0.0f ? Kind::sgd : Kind::momentum;
  o.learning_rate = checked("sgd", "learning_rate", learning_rate, 0.0f, kInf, true);
  o.momentum = checked("sgd", "momentum", momentum, 0.0f, 1.0f, false);
  o.nesterov = nesterov;
  return o;
}

ShardOptimizer ShardOptimizer::adam(float learning_rate, float beta_1, float beta_2, float epsilon) {
  ShardOptimizer o;
  o.kind = Kind::adam;
  o.learning_rate = checked("adam", "learning_rate", learning_rate, 0.0f, kInf, true);
  o.beta_1 = checked("adam", "beta_1", beta_1, 0.0f, 1.0f, false);
  o.beta_2 = checked("adam", "beta_2", beta_2, 0.0f, 1.0f, false);
  o.epsilon = checked("adam", "epsilon", epsilon, 0.0f, kInf, true);
  return o;
}

ShardOptimizer ShardOptimizer::adamw(float learning_rate, float weight_decay, float beta_1, float beta_2,
                                     float epsilon) {
  ShardOptimizer o = adam(learning_rate, beta_1, beta_2, epsilon);
  o.kind = Kind::adamw;
  o.weight_decay = checked("adamw", "weight_decay", weight_decay, 0.0f, kInf, false);
  return o;
}

void FunctionContext::apply_gradients(const ShardOptimizer& optimizer, const std::vector<std::string>& names,
                                      const std::vector<Tensor>& gradients) {
  if (names.size() != gradients.size()) {
    throw std::invalid_argument("apply_gradients: " + std::to_string(names.size()) + " names and " +
                                std::to_string(gradients.size()) + " gradients (expected one gradient per name)");
  }
  unsigned char params[actors::apply_params_bytes];
  actors::encode_apply_params(params_of(optimizer), params);
  std::vector<Tensor> host;  // the gradients' bytes, sent from here
  host.reserve(gradients.size());
  std::vector<actors::shard_client::shard_apply> applies;
  std::shared_ptr<actors::shard_client> client;
  for (std::size_t k = 0; k < names.size(); ++k) {
    auto [v, c] = services_->variable(names[k]);
    client = c;
    const Tensor& g = host.emplace_back(gradients[k].to(Device()));
    if (g.shape() != v.shape || g.dtype() != v.dtype) {
      throw std::invalid_argument("apply_gradients to variable " + base::quoted(names[k]) + ": the gradient is a " +
                                  std::string(dtype_name(g.dtype())) + " tensor of shape " + shape_to_string(g.shape()) +
                                  ", the variable " + std::string(dtype_name(v.dtype)) + " of shape " +
                                  shape_to_string(v.shape) + " (they must match)");
    }
    if (!dtype_is_floating(v.dtype) || dtype_size(v.dtype) < 4) {
      throw std::invalid_argument("apply_gradients to variable " + base::quoted(names[k]) + ": optimizers update " +
                                  "float32 and float64 variables; it is " + std::string(dtype_name(v.dtype)));
    }
    const char* base = static_cast<const char*>(g.raw_data());
    const std::size_t row_bytes =
        v.shape.empty() || v.shape[0] == 0 ? g.nbytes() : g.nbytes() / static_cast<std::size_t>(v.shape[0]);
    std::size_t row = 0;
    for (const auto& s : v.shards) {
      const std::size_t n = static_cast<std::size_t>(s.rows) * row_bytes;
      if (row * row_bytes + n > g.nbytes()) {
        throw std::invalid_argument("variable " + base::quoted(names[k]) + ": its shards do not fit its shape");
      }
      actors::shard_client::shard_apply a;
      a.ps = s.ps;
      a.key = s.key;
      a.kind = params_of(optimizer).kind;
      a.params = params;
      a.from = base + row * row_bytes;
      a.nbytes = n;
      a.dtype = detail::wire_dtype(v.dtype);
      if (n > 0) applies.push_back(std::move(a));
      row += static_cast<std::size_t>(s.rows);
    }
  }
  if (!applies.empty()) client->apply_from(applies);
}

void FunctionContext::apply_gradients(const ShardOptimizer& optimizer, const std::string& name,
                                      const std::vector<std::int64_t>& ids, const Tensor& gradients) {
  auto [v, client] = services_->variable(name);
  const Tensor g = gradients.to(Device());
  Shape expected{static_cast<std::int64_t>(ids.size())};
  for (std::size_t d = 1; d < v.shape.size(); ++d) expected.push_back(v.shape[d]);
  if (g.shape() != expected || g.dtype() != v.dtype) {
    throw std::invalid_argument("apply_gradients to rows of variable " + base::quoted(name) + ": the gradients are a " +
                                std::string(dtype_name(g.dtype())) + " tensor of shape " + shape_to_string(g.shape()) +
                                ", expected " + std::string(dtype_name(v.dtype)) + " of shape " +
                                shape_to_string(expected) + " (one row per id)");
  }
  if (!dtype_is_floating(v.dtype) || dtype_size(v.dtype) < 4) {
    throw std::invalid_argument("apply_gradients to rows of variable " + base::quoted(name) + ": optimizers update " +
                                "float32 and float64 variables; it is " + std::string(dtype_name(v.dtype)));
  }
  std::vector<std::int64_t> starts;  // each shard's first row
  std::int64_t total = 0;
  for (const auto& s : v.shards) {
    starts.push_back(total);
    total += s.rows;
  }
  const std::size_t row_bytes = ids.empty() ? 0 : g.nbytes() / ids.size();
  // A row named twice: its gradients summed in the order given (what TensorFlow's deduplication
  // of IndexedSlices does), one update per row.
  std::map<std::int64_t, std::size_t> first;  // id -> its position among the unique rows
  std::vector<std::int64_t> unique;
  std::vector<char> summed;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::int64_t id = ids[i];
    if (id < 0 || id >= total) {
      throw std::out_of_range("variable " + base::quoted(name) + " has " + std::to_string(total) + " rows; id " +
                              std::to_string(id) + " (at " + std::to_string(i) + ") is outside them");
    }
    const char* src = static_cast<const char*>(g.raw_data()) + i * row_bytes;
    auto [it, fresh] = first.emplace(id, unique.size());
    if (fresh) {
      unique.push_back(id);
      summed.insert(summed.end(), src, src + row_bytes);
      continue;
    }
    char* dst = summed.data() + it->second * row_bytes;
    const std::size_t n = row_bytes / dtype_size(v.dtype);
    for (std::size_t e = 0; e < n; ++e) {
      if (v.dtype == DType::f32) {
        store<float>(dst + e * 4, load<float>(dst + e * 4) + load<float>(src + e * 4));
      } else {
        store<double>(dst + e * 8, load<double>(dst + e * 8) + load<double>(src + e * 8));
      }
    }
  }
  unsigned char params[actors::apply_params_bytes];
  actors::encode_apply_params(params_of(optimizer), params);
  // Per shard: its local row indices and their gradient rows, in the order of first appearance.
  std::vector<std::vector<std::uint64_t>> rows(v.shards.size());
  std::vector<std::vector<char>> blocks(v.shards.size());
  for (std::size_t u = 0; u < unique.size(); ++u) {
    const auto k = static_cast<std::size_t>(std::upper_bound(starts.begin(), starts.end(), unique[u]) - starts.begin() - 1);
    rows[k].push_back(static_cast<std::uint64_t>(unique[u] - starts[k]));
    const char* src = summed.data() + u * row_bytes;
    blocks[k].insert(blocks[k].end(), src, src + row_bytes);
  }
  std::vector<actors::shard_client::shard_apply> applies;
  for (std::size_t k = 0; k < v.shards.size(); ++k) {
    if (rows[k].empty()) continue;
    actors::shard_client::shard_apply a;
    a.ps = v.shards[k].ps;
    a.key = v.shards[k].key;
    a.kind = params_of(optimizer).kind;
    a.params = params;
    a.rows = rows[k].data();
    a.count = rows[k].size();
    a.from = blocks[k].data();
    a.nbytes = blocks[k].size();
    a.dtype = detail::wire_dtype(v.dtype);
    applies.push_back(std::move(a));
  }
  if (!applies.empty()) client->apply_from(applies);
}

namespace detail {

std::optional<std::string> apply_raw(char* value, char* const* slots, const char* grad, std::size_t nbytes,
                                     std::uint8_t dtype, const actors::apply_params& p, std::int64_t step) {
  if (dtype == wire_dtype(DType::f32)) {
    apply_typed<float>(value, slots, grad, nbytes / sizeof(float), p, step);
  } else if (dtype == wire_dtype(DType::f64)) {
    apply_typed<double>(value, slots, grad, nbytes / sizeof(double), p, step);
  } else {
    return std::string("optimizers update float32 and float64 variables; this shard holds element type ") +
           std::to_string(dtype);
  }
  return std::nullopt;
}

}  // namespace detail
}  // namespace troupe::distribute
