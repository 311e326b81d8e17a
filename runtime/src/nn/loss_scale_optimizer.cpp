#include "troupe/nn/loss_scale_optimizer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "troupe/distribute/context.hpp"
#include "troupe/distribute/strategy.hpp"

namespace troupe::nn {

namespace {

std::shared_ptr<Optimizer> checked_inner(std::shared_ptr<Optimizer> inner) {
  if (!inner) throw std::invalid_argument("LossScaleOptimizer: the inner optimizer is null");
  if (dynamic_cast<const LossScaleOptimizer*>(inner.get()) != nullptr) {
    throw std::invalid_argument("LossScaleOptimizer: the inner optimizer is already a LossScaleOptimizer (wrap the "
                                "optimizer itself once)");
  }
  return inner;
}

// True when every element of every tensor is finite (read on the host).
bool all_finite(const std::vector<Tensor>& tensors) {
  for (const Tensor& t : tensors) {
    Tensor host = t.to(Device());
    if (host.dtype() == DType::f16 || host.dtype() == DType::bf16) host = host.cast(DType::f32);
    if (host.dtype() == DType::f32) {
      const float* p = host.data<float>();
      for (std::int64_t i = 0; i < host.num_elements(); ++i) {
        if (!std::isfinite(p[i])) return false;
      }
    } else if (host.dtype() == DType::f64) {
      const double* p = host.data<double>();
      for (std::int64_t i = 0; i < host.num_elements(); ++i) {
        if (!std::isfinite(p[i])) return false;
      }
    }
  }
  return true;
}

}  // namespace

LossScaleStep next_loss_scale(double scale, std::int64_t good_steps, bool finite, std::int64_t growth_steps) {
  if (!finite) return {std::max(scale / 2.0, 1.0), 0, false};
  if (good_steps + 1 >= growth_steps) {
    // The scale is a float32 variable: it doubles only while the double stays finite there.
    const float doubled = static_cast<float>(scale * 2.0);
    return {std::isfinite(doubled) ? static_cast<double>(doubled) : scale, 0, true};
  }
  return {scale, good_steps + 1, true};
}

LossScaleOptimizer::LossScaleOptimizer(std::shared_ptr<Optimizer> inner_optimizer, bool dynamic, double initial_scale,
                                       std::int64_t dynamic_growth_steps)
    : Optimizer(checked_inner(inner_optimizer)->name(), checked_inner(inner_optimizer)->learning_rate()),
      inner_(std::move(inner_optimizer)),
      dynamic_(dynamic),
      initial_scale_(initial_scale),
      growth_steps_(dynamic_growth_steps) {
  if (!(initial_scale >= 1.0) || !std::isfinite(static_cast<float>(initial_scale))) {
    throw std::invalid_argument("LossScaleOptimizer: initial_scale is " + std::to_string(initial_scale) +
                                " (expected a finite float32 >= 1)");
  }
  if (dynamic_growth_steps < 1) {
    throw std::invalid_argument("LossScaleOptimizer: dynamic_growth_steps is " + std::to_string(dynamic_growth_steps) +
                                " (expected >= 1)");
  }
}

void LossScaleOptimizer::build_state() {
  if (scale_) return;
  scale_.emplace(Tensor::scalar<float>(static_cast<float>(initial_scale_)), name() + "/loss_scale/current_loss_scale");
  good_steps_.emplace(Tensor::scalar<std::int64_t>(0), name() + "/loss_scale/good_steps");
}

void LossScaleOptimizer::build(const std::vector<std::pair<std::string, Variable>>& named_variables) {
  inner_->build(named_variables);
  build_state();
}

double LossScaleOptimizer::loss_scale() const {
  return scale_ ? static_cast<double>(scale_->value().item<float>()) : initial_scale_;
}

std::int64_t LossScaleOptimizer::dynamic_counter() const {
  return good_steps_ ? good_steps_->value().item<std::int64_t>() : 0;
}

Tensor LossScaleOptimizer::get_scaled_loss(const Tensor& loss) const { return loss * Scalar(loss_scale()); }

std::vector<Tensor> LossScaleOptimizer::get_unscaled_gradients(const std::vector<Tensor>& gradients) const {
  const double reciprocal = 1.0 / loss_scale();  // exact for the powers of two a dynamic scale takes
  std::vector<Tensor> out;
  out.reserve(gradients.size());
  for (const Tensor& g : gradients) out.push_back(g * Scalar(reciprocal));
  return out;
}

void LossScaleOptimizer::apply_gradients(const std::vector<GradientAndVariable>& grads_and_vars,
                                         std::optional<distribute::ReduceOp> aggregation) {
  for (const auto& [gradient, variable] : grads_and_vars) {
    if (gradient.shape() != variable.shape() || gradient.dtype() != variable.dtype()) {
      throw std::invalid_argument(name() + ".apply_gradients: the gradient of variable '" + variable.name() + "' is " +
                                  std::string(dtype_name(gradient.dtype())) + " " + shape_to_string(gradient.shape()) +
                                  ", the variable is " + std::string(dtype_name(variable.dtype())) + " " +
                                  shape_to_string(variable.shape()));
    }
  }
  distribute::ReplicaContext* ctx = distribute::get_replica_context();
  // The scale's variables, made where the model's are (through merge_call inside a replica, as
  // the base optimizer builds its slots); every replica reads scale_ before replica 0 sets it.
  if (!scale_) {
    const auto make = [&] {
      inner_->build({});
      build_state();
    };
    if (ctx != nullptr) {
      ctx->merge_call(
          [&](distribute::Strategy&, const distribute::PerReplica<int>&) {
            make();
            return 0;
          },
          0);
    } else {
      make();
    }
  }

  std::vector<Tensor> gradients;
  gradients.reserve(grads_and_vars.size());
  for (const auto& gv : grads_and_vars) gradients.push_back(gv.first);
  if (ctx != nullptr && aggregation && ctx->num_replicas_in_sync() > 1) {
    const auto start = std::chrono::steady_clock::now();
    gradients = ctx->all_reduce(*aggregation, gradients);
    if (ctx->replica_id_in_sync_group() == 0) {
      record_all_reduce_time(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start),
                             std::chrono::nanoseconds{0});
    }
  }

  bool apply = true;
  if (dynamic_) {
    // The reduced gradients are the same bits on every replica: so is this decision.
    const LossScaleStep next =
        next_loss_scale(loss_scale(), dynamic_counter(), all_finite(gradients), growth_steps_);
    scale_->assign_local(Tensor::scalar<float>(static_cast<float>(next.scale)));
    good_steps_->assign_local(Tensor::scalar<std::int64_t>(next.good_steps));
    apply = next.apply;
  }
  if (apply) {
    std::vector<GradientAndVariable> reduced;
    reduced.reserve(grads_and_vars.size());
    for (std::size_t i = 0; i < grads_and_vars.size(); ++i) reduced.emplace_back(gradients[i], grads_and_vars[i].second);
    inner_->apply_gradients(reduced, std::nullopt);
  } else {
    Variable iterations = inner_->iterations();
    iterations.assign_local(Tensor::scalar<std::int64_t>(iterations.value().item<std::int64_t>() + 1));
  }
}

const Variable& LossScaleOptimizer::iterations() const { return inner_->iterations(); }

std::map<std::string, Variable> LossScaleOptimizer::variables() const {
  std::map<std::string, Variable> out = inner_->variables();
  if (scale_) {
    out.emplace(scale_->name(), *scale_);
    out.emplace(good_steps_->name(), *good_steps_);
  }
  return out;
}

void LossScaleOptimizer::set_learning_rate(float learning_rate) {
  inner_->set_learning_rate(learning_rate);
  Optimizer::set_learning_rate(learning_rate);
}

void LossScaleOptimizer::update(const Tensor&, Variable&, std::vector<Variable>&, std::int64_t) {
  throw std::logic_error("LossScaleOptimizer::update: the inner optimizer applies the updates");
}

}  // namespace troupe::nn
