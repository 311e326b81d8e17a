#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/nn/optimizers.hpp"
#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe::nn {

/// An optimizer that scales the loss so that float16 gradients neither underflow nor overflow
/// (tf.keras.mixed_precision.LossScaleOptimizer). Model::compile wraps the optimizer in one by
/// itself when the model computes in float16 ("mixed_float16"), as Keras does, and its step then
/// differentiates get_scaled_loss(loss) and passes get_unscaled_gradients(...) to
/// apply_gradients. A custom loop does the same:
///
///     auto opt = std::make_shared<LossScaleOptimizer>(std::make_shared<SGD>(0.1f));
///     Tensor scaled = opt->get_scaled_loss(loss);                  // differentiate this
///     opt->apply_gradients(zip(opt->get_unscaled_gradients(grads), variables));
///
/// Dynamic loss scaling (the default), at each apply_gradients:
///  1. the gradients are all-reduced as the inner optimizer would (`aggregation`);
///  2. if any element of any reduced gradient is NaN or infinite, the update is skipped (the
///     inner optimizer's iterations still advance, as in Keras), the scale is halved (never below
///     1) and the count of good steps restarts;
///  3. else the inner optimizer applies them, and after `dynamic_growth_steps` finite steps in a
///     row the scale doubles (when the double is finite) and the count restarts.
/// Every replica decides from the all-reduced gradients, which are the same bits on every
/// replica, so all of them skip or apply together and their weights stay identical. (With
/// `aggregation` nullopt the caller must pass gradients already reduced, for the same reason.)
/// A fixed scale (dynamic = false) never changes and never skips.
///
/// The scale and the count are variables ("<name>/loss_scale/current_loss_scale", float32, and
/// "<name>/loss_scale/good_steps", int64) beside the inner optimizer's slots in variables(), so a
/// Checkpoint or BackupAndRestore of the model saves and restores them.
class LossScaleOptimizer : public Optimizer {
 public:
  /// Wraps `inner_optimizer` (not null, not itself a LossScaleOptimizer). initial_scale must be
  /// finite and >= 1 (Keras's default 2^15), dynamic_growth_steps >= 1 (default 2000), else
  /// std::invalid_argument.
  explicit LossScaleOptimizer(std::shared_ptr<Optimizer> inner_optimizer, bool dynamic = true,
                              double initial_scale = 32768.0, std::int64_t dynamic_growth_steps = 2000);

  /// The wrapped optimizer.
  const std::shared_ptr<Optimizer>& inner_optimizer() const noexcept { return inner_; }
  /// Whether the scale changes with the gradients.
  bool dynamic() const noexcept { return dynamic_; }
  /// The scale before the first step.
  double initial_scale() const noexcept { return initial_scale_; }
  /// Finite steps in a row after which the scale doubles.
  std::int64_t dynamic_growth_steps() const noexcept { return growth_steps_; }
  /// The current scale (this replica's component inside Strategy::run; initial_scale() before
  /// the optimizer is built).
  double loss_scale() const;
  /// Finite steps since the scale last changed (Keras's dynamic_counter).
  std::int64_t dynamic_counter() const;

  /// loss * loss_scale() (also a loss's gradient: the scaled loss's gradient is the scaled one).
  Tensor get_scaled_loss(const Tensor& loss) const;
  /// Each gradient / loss_scale(), in its own dtype.
  std::vector<Tensor> get_unscaled_gradients(const std::vector<Tensor>& gradients) const;

  /// Builds the inner optimizer's slots and the scale's variables, in the current scope.
  void build(const std::vector<std::pair<std::string, Variable>>& named_variables) override;
  /// Steps 1-3 of the class comment.
  void apply_gradients(const std::vector<GradientAndVariable>& grads_and_vars,
                       std::optional<distribute::ReduceOp> aggregation = distribute::ReduceOp::sum) override;
  /// The inner optimizer's.
  const Variable& iterations() const override;
  /// The inner optimizer's variables and the two of the scale.
  std::map<std::string, Variable> variables() const override;
  /// Sets the inner optimizer's step size (and this one's copy, which learning_rate() reads).
  void set_learning_rate(float learning_rate) override;

 protected:
  std::vector<std::string> slot_names() const override { return {}; }
  void update(const Tensor&, Variable&, std::vector<Variable>&, std::int64_t) override;

 private:
  void build_state();

  std::shared_ptr<Optimizer> inner_;
  bool dynamic_;
  double initial_scale_;
  std::int64_t growth_steps_;
  std::optional<Variable> scale_;       // float32 scalar
  std::optional<Variable> good_steps_;  // int64 scalar
};

/// The decision of one dynamic loss-scaling step (LossScaleOptimizer's rule, as a plain function
/// so that it is tested alone): the next scale and good-step count, and whether to apply.
struct LossScaleStep {
  double scale;
  std::int64_t good_steps;
  bool apply;
};
/// Next state after a step whose gradients were all finite or not.
LossScaleStep next_loss_scale(double scale, std::int64_t good_steps, bool finite, std::int64_t growth_steps);

}  // namespace troupe::nn
