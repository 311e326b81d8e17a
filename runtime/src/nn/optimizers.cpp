#include "troupe/nn/optimizers.hpp"

#include <cmath>
#include <map>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "elements.hpp"
#include "cpu/kernels.hpp"
#include "gpu/gpu.hpp"
#include "eigen_maps.hpp"
#include "troupe/distribute/context.hpp"
#include "troupe/distribute/strategy.hpp"

namespace troupe::nn {

using namespace troupe::nn::eigen;
using distribute::ReduceOp;

namespace {

// A variable's identity: the address of its shared state's name, the same for every handle.
const void* identity_of(const Variable& variable) { return &variable.name(); }

std::string describe(const Variable& variable) {
  return variable.name().empty() ? std::string("a variable") : "variable '" + variable.name() + "'";
}

// Requires lo <= value < hi, or lo < value < hi when lo_open (std::invalid_argument otherwise).
float checked(const char* optimizer, const char* what, float value, float lo, float hi, bool lo_open) {
  const bool ok = (lo_open ? value > lo : value >= lo) && value < hi && std::isfinite(value);
  if (!ok) {
    throw std::invalid_argument(std::string(optimizer) + ": " + what + " is " + std::to_string(value) + " (expected " +
                                (lo_open ? "> " : ">= ") + std::to_string(lo) +
                                (std::isinf(hi) ? std::string() : " and < " + std::to_string(hi)) + ")");
  }
  return value;
}

constexpr float kInf = std::numeric_limits<float>::infinity();

// The gradient where the variable is: a replica's gradient already is; one made elsewhere moves.
Tensor beside(const Tensor& gradient, const Tensor& w) { return gradient.to(w.device()); }

}  // namespace

std::vector<GradientAndVariable> zip(const std::vector<Tensor>& gradients, const std::vector<Variable>& variables) {
  if (gradients.size() != variables.size()) {
    throw std::invalid_argument("zip: " + std::to_string(gradients.size()) + " gradients for " +
                                std::to_string(variables.size()) + " variables (expected one per variable)");
  }
  std::vector<GradientAndVariable> out;
  out.reserve(gradients.size());
  for (std::size_t i = 0; i < gradients.size(); ++i) out.emplace_back(gradients[i], variables[i]);
  return out;
}

Optimizer::Optimizer(std::string name, float learning_rate)
    : name_(std::move(name)), learning_rate_(checked(name_.c_str(), "learning_rate", learning_rate, 0.0f, kInf, true)) {}

Optimizer::~Optimizer() = default;

void Optimizer::set_learning_rate(float learning_rate) {
  learning_rate_ = checked(name_.c_str(), "learning_rate", learning_rate, 0.0f, kInf, true);
}

Optimizer::Entry* Optimizer::find(const Variable& variable) {
  const void* id = identity_of(variable);
  for (Entry& e : entries_) {
    if (e.id == id) return &e;
  }
  return nullptr;
}

void Optimizer::build(const std::vector<std::pair<std::string, Variable>>& named_variables) {
  if (!iterations_) iterations_.emplace(Tensor::scalar<std::int64_t>(0), name_ + "/iterations");
  const std::vector<std::string> slots = slot_names();
  for (const auto& [name, variable] : named_variables) {
    if (find(variable) != nullptr) continue;
    if (variable.dtype() != DType::f32 && variable.dtype() != DType::f64) {
      throw std::invalid_argument(name_ + ": cannot train " + describe(variable) + " of dtype " +
                                  std::string(dtype_name(variable.dtype())) + " (expected float32 or float64)");
    }
    for (const Entry& e : entries_) {
      if (e.name == name) {
        throw std::invalid_argument(name_ + ": two variables are both named '" + name +
                                    "' (slot names must be unique for checkpoints)");
      }
    }
    Entry entry{identity_of(variable), name, {}};
    for (const std::string& slot : slots) {
      entry.slots.emplace_back(Tensor::zeros(variable.shape(), variable.dtype()), name_ + "/" + slot + "/" + name);
    }
    entries_.push_back(std::move(entry));
  }
}

void Optimizer::build_missing(const std::vector<GradientAndVariable>& grads_and_vars) {
  std::vector<std::pair<std::string, Variable>> missing;
  for (std::size_t i = 0; i < grads_and_vars.size(); ++i) {
    const Variable& v = grads_and_vars[i].second;
    if (find(v) != nullptr) continue;
    std::string name = v.name().empty() ? "variable_" + std::to_string(entries_.size() + missing.size()) : v.name();
    // Unnamed layers' variables are all called "kernel" and "bias": keep the slot names apart.
    auto taken = [&](const std::string& n) {
      for (const Entry& e : entries_) {
        if (e.name == n) return true;
      }
      for (const auto& m : missing) {
        if (m.first == n) return true;
      }
      return false;
    };
    for (int k = 1; taken(name); ++k) {
      name = (v.name().empty() ? "variable" : v.name()) + "_" + std::to_string(k);
    }
    missing.emplace_back(std::move(name), v);
  }
  build(missing);
}

void Optimizer::apply_gradients(const std::vector<GradientAndVariable>& grads_and_vars,
                                std::optional<ReduceOp> aggregation) {
  for (const auto& [gradient, variable] : grads_and_vars) {
    if (gradient.shape() != variable.shape() || gradient.dtype() != variable.dtype()) {
      throw std::invalid_argument(name_ + ".apply_gradients: the gradient of " + describe(variable) + " is " +
                                  std::string(dtype_name(gradient.dtype())) + " " + shape_to_string(gradient.shape()) +
                                  ", the variable is " + std::string(dtype_name(variable.dtype())) + " " +
                                  shape_to_string(variable.shape()));
    }
  }
  distribute::ReplicaContext* ctx = distribute::get_replica_context();

  // Slots for variables not seen before. Every replica reads entries_ before replica 0 changes it
  // inside merge_call (which starts once all have arrived), so all take the same branch.
  bool missing = !iterations_;
  for (const auto& gv : grads_and_vars) missing = missing || find(gv.second) == nullptr;
  if (missing) {
    if (ctx != nullptr) {
      ctx->merge_call(
          [&](distribute::Strategy&, const distribute::PerReplica<int>&) {
            build_missing(grads_and_vars);
            return 0;
          },
          0);
    } else {
      build_missing(grads_and_vars);
    }
  }

  std::vector<Tensor> gradients;
  gradients.reserve(grads_and_vars.size());
  for (const auto& gv : grads_and_vars) gradients.push_back(gv.first);
  if (ctx != nullptr && aggregation && ctx->num_replicas_in_sync() > 1) {
    const auto start = std::chrono::steady_clock::now();
    gradients = ctx->all_reduce(*aggregation, gradients);
    if (ctx->replica_id_in_sync_group() == 0) {
      all_reduce_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now() - start).count(),
                               std::memory_order_relaxed);
    }
  }

  const std::int64_t iteration = iterations_->value().item<std::int64_t>() + 1;
  std::vector<Variable> variables;
  variables.reserve(grads_and_vars.size());
  for (const auto& gv : grads_and_vars) variables.push_back(gv.second);
  std::vector<Update> updates;
  updates.reserve(variables.size());
  for (std::size_t i = 0; i < variables.size(); ++i) {
    updates.push_back(Update{&gradients[i], &variables[i], &find(variables[i])->slots});
  }
  update_all(updates, iteration);
  iterations_->assign_local(Tensor::scalar<std::int64_t>(iteration));
}

const Variable& Optimizer::iterations() const {
  if (!iterations_) {
    throw std::logic_error(name_ + ".iterations: the optimizer is not built yet (compile a model with it, call "
                           "build, or apply gradients once)");
  }
  return *iterations_;
}

std::map<std::string, Variable> Optimizer::variables() const {
  std::map<std::string, Variable> out;
  if (iterations_) out.emplace(name_ + "/iterations", *iterations_);
  const std::vector<std::string> slots = slot_names();
  for (const Entry& e : entries_) {
    for (std::size_t k = 0; k < slots.size(); ++k) out.emplace(name_ + "/" + slots[k] + "/" + e.name, e.slots[k]);
  }
  return out;
}

void Optimizer::update_all(const std::vector<Update>& updates, std::int64_t iteration) {
  for (const Update& u : updates) update(*u.gradient, *u.variable, *u.slots, iteration);
}

namespace {

// The GPU variables of a step's updates, one launch per GPU and dtype (gpu::multi_update): the
// new value and slots are written with assign_local as update() writes them. Returns the updates
// left for update(): the CPU variables.
std::vector<Optimizer::Update> update_on_gpus(const std::vector<Optimizer::Update>& updates,
                                              troupe::detail::gpu::update_kind kind, std::size_t slot_count,
                                              double lr, double momentum, bool nesterov, double b1, double b2,
                                              double eps) {
  namespace gpu = troupe::detail::gpu;
  std::vector<Optimizer::Update> rest;
  // Per update: the tensors the kernel reads (kept alive until it is enqueued) and writes.
  struct work {
    const Optimizer::Update* update;
    Tensor w, g, m, v, out_w, out_m, out_v;
  };
  std::map<std::pair<int, DType>, std::vector<work>> groups;
  for (const Optimizer::Update& u : updates) {
    const Tensor w = u.variable->value();
    if (!w.is_gpu()) {
      rest.push_back(u);
      continue;
    }
    work x{&u, w, beside(*u.gradient, w), {}, {}, {}, {}, {}};
    x.out_w = Tensor::empty(w.shape(), w.dtype(), w.device());
    if (slot_count >= 1) {
      x.m = (*u.slots)[0].value().to(w.device());
      x.out_m = Tensor::empty(w.shape(), w.dtype(), w.device());
    }
    if (slot_count >= 2) {
      x.v = (*u.slots)[1].value().to(w.device());
      x.out_v = Tensor::empty(w.shape(), w.dtype(), w.device());
    }
    groups[{w.device().index(), w.dtype()}].push_back(std::move(x));
  }
  for (auto& [key, list] : groups) {
    std::vector<gpu::update_tensor> tensors;
    tensors.reserve(list.size());
    for (work& x : list) {
      auto data = [](const Tensor& t) { return t.num_elements() > 0 ? t.raw_data() : nullptr; };
      auto out = [](Tensor& t) -> void* { return t.num_elements() > 0 ? t.raw_mutable_data() : nullptr; };
      tensors.push_back({x.w.num_elements(), data(x.w), data(x.g), slot_count >= 1 ? data(x.m) : nullptr,
                         slot_count >= 2 ? data(x.v) : nullptr, out(x.out_w), slot_count >= 1 ? out(x.out_m) : nullptr,
                         slot_count >= 2 ? out(x.out_v) : nullptr});
    }
    gpu::multi_update(key.first, kind, tensors, troupe::detail::to_scalar_type(key.second), lr, momentum, nesterov, b1,
                      b2, eps);
    for (work& x : list) {
      if (slot_count >= 1) (*x.update->slots)[0].assign_local(x.out_m);
      if (slot_count >= 2) (*x.update->slots)[1].assign_local(x.out_v);
      x.update->variable->assign_local(x.out_w);
    }
  }
  return rest;
}

}  // namespace

SGD::SGD(float learning_rate, float momentum, bool nesterov)
    : Optimizer("sgd", learning_rate),
      momentum_(checked("sgd", "momentum", momentum, 0.0f, 1.0f, false)),
      nesterov_(nesterov) {}

std::vector<std::string> SGD::slot_names() const {
  if (momentum_ == 0.0f) return {};
  return {"momentum"};
}

void SGD::update(const Tensor& gradient, Variable& variable, std::vector<Variable>& slots, std::int64_t) {
  const Tensor w = variable.value();
  if (w.is_gpu()) {
    // The same formulas as below, as one CUDA kernel on the replica's stream.
    const Tensor g = beside(gradient, w);
    Tensor next = Tensor::empty(w.shape(), w.dtype(), w.device());
    if (slots.empty()) {
      troupe::detail::gpu::sgd(w.device().index(), w.raw_data(), g.raw_data(), next.raw_mutable_data(),
                               w.num_elements(), troupe::detail::to_scalar_type(w.dtype()), learning_rate());
    } else {
      const Tensor velocity = slots[0].value().to(w.device());
      Tensor next_velocity = Tensor::empty(w.shape(), w.dtype(), w.device());
      troupe::detail::gpu::sgd_momentum(w.device().index(), w.raw_data(), g.raw_data(), velocity.raw_data(),
                                        next.raw_mutable_data(), next_velocity.raw_mutable_data(), w.num_elements(),
                                        troupe::detail::to_scalar_type(w.dtype()), learning_rate(), momentum_, nesterov_);
      slots[0].assign_local(next_velocity);
    }
    variable.assign_local(next);
    return;
  }
  Tensor next = Tensor::empty(w.shape(), w.dtype());
  dispatch_float(w.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T lr = static_cast<T>(learning_rate());
    const Tensor g = beside(gradient, w);
    if (slots.empty()) {
      troupe::detail::cpu::kernels_for<T>().sgd(w.data<T>(), g.data<T>(), next.mutable_data<T>(), w.num_elements(), lr);
      return;
    }
    const Tensor velocity = slots[0].value().to(w.device());
    Tensor next_velocity = Tensor::empty(w.shape(), w.dtype());
    troupe::detail::cpu::kernels_for<T>().sgd_momentum(w.data<T>(), g.data<T>(), velocity.data<T>(), next.mutable_data<T>(),
                                  next_velocity.mutable_data<T>(), w.num_elements(), lr, static_cast<T>(momentum_),
                                  nesterov_);
    slots[0].assign_local(next_velocity);
  });
  variable.assign_local(next);
}

void SGD::update_all(const std::vector<Update>& updates, std::int64_t iteration) {
  const bool plain = momentum_ == 0.0f;
  const std::vector<Update> rest =
      update_on_gpus(updates, plain ? troupe::detail::gpu::update_kind::sgd : troupe::detail::gpu::update_kind::momentum,
                     plain ? 0 : 1, learning_rate(), momentum_, nesterov_, 0.0, 0.0, 0.0);
  Optimizer::update_all(rest, iteration);
}

Adam::Adam(float learning_rate, float beta_1, float beta_2, float epsilon)
    : Adam("adam", learning_rate, beta_1, beta_2, epsilon) {}

Adam::Adam(std::string name, float learning_rate, float beta_1, float beta_2, float epsilon)
    : Optimizer(name, learning_rate),
      beta_1_(checked(name.c_str(), "beta_1", beta_1, 0.0f, 1.0f, false)),
      beta_2_(checked(name.c_str(), "beta_2", beta_2, 0.0f, 1.0f, false)),
      epsilon_(checked(name.c_str(), "epsilon", epsilon, 0.0f, kInf, true)) {}

std::vector<std::string> Adam::slot_names() const { return {"m", "v"}; }

void Adam::update(const Tensor& gradient, Variable& variable, std::vector<Variable>& slots, std::int64_t iteration) {
  const Tensor w = variable.value();
  const Tensor m = slots[0].value();
  const Tensor v = slots[1].value();
  // The bias corrections in double: beta^t for large t is far below float's resolution of 1 - x.
  const double t = static_cast<double>(iteration);
  const double b1 = beta_1_;
  const double b2 = beta_2_;
  const double lr_t = learning_rate() * std::sqrt(1.0 - std::pow(b2, t)) / (1.0 - std::pow(b1, t));
  if (w.is_gpu()) {
    const Tensor g = beside(gradient, w);
    const Tensor m_here = m.to(w.device());
    const Tensor v_here = v.to(w.device());
    Tensor next_w = Tensor::empty(w.shape(), w.dtype(), w.device());
    Tensor next_m_w = Tensor::empty(w.shape(), w.dtype(), w.device());
    Tensor next_v_w = Tensor::empty(w.shape(), w.dtype(), w.device());
    troupe::detail::gpu::adam(w.device().index(), w.raw_data(), g.raw_data(), m_here.raw_data(), v_here.raw_data(),
                              next_w.raw_mutable_data(), next_m_w.raw_mutable_data(), next_v_w.raw_mutable_data(),
                              w.num_elements(), troupe::detail::to_scalar_type(w.dtype()), lr_t, b1, 1.0 - b1, b2, 1.0 - b2,
                              epsilon_);
    slots[0].assign_local(next_m_w);
    slots[1].assign_local(next_v_w);
    variable.assign_local(next_w);
    return;
  }
  Tensor next = Tensor::empty(w.shape(), w.dtype());
  Tensor next_m = Tensor::empty(w.shape(), w.dtype());
  Tensor next_v = Tensor::empty(w.shape(), w.dtype());
  dispatch_float(w.dtype(), [&](auto tag) {
    using T = decltype(tag);
    // The same formulas as the GPU's kernel, with a correctly rounded sqrt: the same bits.
    const Tensor g = beside(gradient, w);
    const Tensor m_here = m.to(w.device());
    const Tensor v_here = v.to(w.device());
    troupe::detail::cpu::kernels_for<T>().adam(w.data<T>(), g.data<T>(), m_here.data<T>(), v_here.data<T>(), next.mutable_data<T>(),
                          next_m.mutable_data<T>(), next_v.mutable_data<T>(), w.num_elements(), static_cast<T>(lr_t),
                          static_cast<T>(b1), static_cast<T>(1.0 - b1), static_cast<T>(b2), static_cast<T>(1.0 - b2),
                          static_cast<T>(epsilon_));
  });
  slots[0].assign_local(next_m);
  slots[1].assign_local(next_v);
  variable.assign_local(next);
}

void Adam::update_all(const std::vector<Update>& updates, std::int64_t iteration) {
  // The bias-corrected step size of this iteration, as update() computes it.
  const double t = static_cast<double>(iteration);
  const double b1 = beta_1_;
  const double b2 = beta_2_;
  const double lr_t = learning_rate() * std::sqrt(1.0 - std::pow(b2, t)) / (1.0 - std::pow(b1, t));
  const std::vector<Update> rest =
      update_on_gpus(updates, troupe::detail::gpu::update_kind::adam, 2, lr_t, 0.0, false, b1, b2, epsilon_);
  Optimizer::update_all(rest, iteration);
}

AdamW::AdamW(float learning_rate, float weight_decay, float beta_1, float beta_2, float epsilon)
    : Adam("adamw", learning_rate, beta_1, beta_2, epsilon),
      weight_decay_(checked("adamw", "weight_decay", weight_decay, 0.0f, kInf, false)) {}

void AdamW::decay(Variable& variable) const {
  if (weight_decay_ == 0.0f) return;
  // Keras: variable - variable * wd * lr, each operation rounded in the variable's dtype (on
  // its device: a GPU variable decays through the GPU's elementwise kernels).
  const Tensor w = variable.value();
  variable.assign_local(w - (w * static_cast<double>(weight_decay_)) * static_cast<double>(learning_rate()));
}

void AdamW::update_all(const std::vector<Update>& updates, std::int64_t iteration) {
  // Every variable decays first, then takes Adam's step (the multi-tensor apply on GPUs,
  // Adam::update on the host). Optimizer::apply_gradients always comes here, never to update().
  for (const Update& u : updates) decay(*u.variable);
  Adam::update_all(updates, iteration);
}

}  // namespace troupe::nn
