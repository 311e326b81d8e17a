#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/distribute/reduce_op.hpp"
#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe::nn {

/// A gradient and the variable it is for.
using GradientAndVariable = std::pair<Tensor, Variable>;

/// Pairs gradients with variables (Python's zip); the sizes must match (std::invalid_argument).
std::vector<GradientAndVariable> zip(const std::vector<Tensor>& gradients, const std::vector<Variable>& variables);

/// Base of the optimizers (tf.keras.optimizers.Optimizer). Not copyable: it owns slot variables
/// (hold it by shared_ptr, as Model does).
///
/// apply_gradients in replica context (inside Strategy::run), on every replica:
///  1. all-reduces every gradient with `aggregation` in ONE packed collective (skipped when
///     aggregation is nullopt: the caller has already reduced them);
///  2. computes the update from the reduced gradient, the variable's own component and the slots'
///     own components; every replica has the same bits for all of them, so every replica
///     computes the same bits;
///  3. writes the results with Variable::assign_local (no further collective).
/// In cross-replica context, or with the default strategy, there is no all-reduce and the update
/// is written to every component.
///
/// Slot variables (momentum, Adam's m and v) and the iteration count are Variables created in the
/// scope the optimizer is built in: build() them where the model's variables were created (Model
/// does it in compile). A variable apply_gradients meets for the first time inside a replica
/// function gets its slots through merge_call, in cross-replica context, as in TensorFlow.
class Optimizer {
 public:
  virtual ~Optimizer();
  /// Not copyable: a copy would share the slots but not the bookkeeping of which exist.
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// Creates the iteration count and the slots of these variables (named for checkpoints), in
  /// the current scope; variables already built are skipped.
  /// (Virtual, like the methods below, so that a LossScaleOptimizer can wrap another optimizer.)
  virtual void build(const std::vector<std::pair<std::string, Variable>>& named_variables);

  /// Applies one update; see the class comment. Every gradient must have its variable's shape
  /// and dtype (float32 or float64), else std::invalid_argument naming the variable.
  virtual void apply_gradients(const std::vector<GradientAndVariable>& grads_and_vars,
                               std::optional<distribute::ReduceOp> aggregation = distribute::ReduceOp::sum);

  /// Updates applied so far (an int64 scalar variable, "<name>/iterations").
  virtual const Variable& iterations() const;
  /// The slots and the iteration count by checkpoint name: "adam/m/dense_0/kernel",
  /// "adam/iterations"... Empty before build.
  virtual std::map<std::string, Variable> variables() const;

  /// "sgd", "adam" or "adamw".
  const std::string& name() const noexcept { return name_; }
  /// The step size.
  float learning_rate() const noexcept { return learning_rate_; }
  /// Changes the step size for the following updates (> 0, else std::invalid_argument); call it
  /// between steps, not while replicas are applying gradients.
  virtual void set_learning_rate(float learning_rate);

  /// Time replica 0 spent in the gradient all-reduce (its share of waiting for the others
  /// included), for benchmarks.
  std::chrono::nanoseconds all_reduce_time() const noexcept {
    return std::chrono::nanoseconds(all_reduce_ns_.load(std::memory_order_relaxed));
  }
  /// The part of all_reduce_time() that the backward pass did not hide: replica 0's wait for its
  /// gradient buckets from the moment every replica of its worker had finished backward (started
  /// its last bucket); waiting for a replica still differentiating is not counted. Only Model::train_step's bucketed
  /// all-reduce (RuntimeOptions::gradient_bucket_bytes) measures it; for benchmarks.
  std::chrono::nanoseconds exposed_all_reduce_time() const noexcept {
    return std::chrono::nanoseconds(exposed_ns_.load(std::memory_order_relaxed));
  }
  /// The part of exposed_all_reduce_time() in which the all-reduce across workers waited for
  /// another worker to join it (from a bucket's start on the ring until the first byte of the
  /// other worker's share arrived: that worker still differentiating, or not scheduled; Horovod's
  /// NEGOTIATE). The rest of the exposed time is the all-reduce itself. 0 within one process.
  std::chrono::nanoseconds exposed_peer_wait_time() const noexcept {
    return std::chrono::nanoseconds(exposed_peer_wait_ns_.load(std::memory_order_relaxed));
  }
  /// Adds to all_reduce_time(), exposed_all_reduce_time() and exposed_peer_wait_time(), for a
  /// caller that all-reduced the gradients itself before apply_gradients(..., std::nullopt).
  void record_all_reduce_time(std::chrono::nanoseconds waited, std::chrono::nanoseconds exposed,
                              std::chrono::nanoseconds exposed_peer_wait = std::chrono::nanoseconds{0}) noexcept {
    all_reduce_ns_.fetch_add(waited.count(), std::memory_order_relaxed);
    exposed_ns_.fetch_add(exposed.count(), std::memory_order_relaxed);
    exposed_peer_wait_ns_.fetch_add(exposed_peer_wait.count(), std::memory_order_relaxed);
  }

 protected:
  Optimizer(std::string name, float learning_rate);

  /// The names of the per-variable slots, e.g. {"m", "v"}.
  virtual std::vector<std::string> slot_names() const = 0;
  /// Writes the updated variable and slots with assign_local. `iteration` counts from 1.
  virtual void update(const Tensor& gradient, Variable& variable, std::vector<Variable>& slots,
                      std::int64_t iteration) = 0;

 public:
  /// One variable's update within a step, for update_all.
  struct Update {
    const Tensor* gradient;
    Variable* variable;
    std::vector<Variable>* slots;
  };

 protected:
  /// Applies one step's updates: update() for each, by default. SGD and Adam update the variables
  /// of each GPU and dtype with one launch (a multi-tensor apply), by update()'s formulas.
  virtual void update_all(const std::vector<Update>& updates, std::int64_t iteration);

 private:
  // A built variable: its identity (the address of its shared state's name), its checkpoint
  // name, and its slots in slot_names() order.
  struct Entry {
    const void* id;
    std::string name;
    std::vector<Variable> slots;
  };
  Entry* find(const Variable& variable);
  void build_missing(const std::vector<GradientAndVariable>& grads_and_vars);

  std::string name_;
  float learning_rate_;
  std::vector<Entry> entries_;
  std::optional<Variable> iterations_;
  std::atomic<std::int64_t> all_reduce_ns_{0};
  std::atomic<std::int64_t> exposed_ns_{0};
  std::atomic<std::int64_t> exposed_peer_wait_ns_{0};
};

/// Gradient descent, with optional momentum (tf.keras.optimizers.SGD):
///   momentum 0:  variable -= lr * g
///   momentum m:  velocity = m * velocity - lr * g;  variable += velocity
///   nesterov:    variable += m * velocity - lr * g  (with the new velocity)
class SGD : public Optimizer {
 public:
  /// learning_rate > 0 and 0 <= momentum < 1 (std::invalid_argument otherwise).
  explicit SGD(float learning_rate = 0.01f, float momentum = 0.0f, bool nesterov = false);
  /// The momentum factor (0: plain gradient descent, no slot).
  float momentum() const noexcept { return momentum_; }
  /// Whether the update uses Nesterov momentum.
  bool nesterov() const noexcept { return nesterov_; }

 protected:
  std::vector<std::string> slot_names() const override;
  void update(const Tensor& gradient, Variable& variable, std::vector<Variable>& slots,
              std::int64_t iteration) override;
  void update_all(const std::vector<Update>& updates, std::int64_t iteration) override;

 private:
  float momentum_;
  bool nesterov_;
};

/// Adam (tf.keras.optimizers.Adam), at step t (from 1):
///   m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
///   variable -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + epsilon)
class Adam : public Optimizer {
 public:
  /// learning_rate > 0, 0 <= beta < 1, epsilon > 0 (std::invalid_argument otherwise).
  explicit Adam(float learning_rate = 0.001f, float beta_1 = 0.9f, float beta_2 = 0.999f, float epsilon = 1e-7f);
  /// The decay of the first moment.
  float beta_1() const noexcept { return beta_1_; }
  /// The decay of the second moment.
  float beta_2() const noexcept { return beta_2_; }
  /// The term added to sqrt(v).
  float epsilon() const noexcept { return epsilon_; }

 protected:
  /// For AdamW: Adam's update under another name (the prefix of its checkpoint names).
  Adam(std::string name, float learning_rate, float beta_1, float beta_2, float epsilon);

  std::vector<std::string> slot_names() const override;
  void update(const Tensor& gradient, Variable& variable, std::vector<Variable>& slots,
              std::int64_t iteration) override;
  void update_all(const std::vector<Update>& updates, std::int64_t iteration) override;

 private:
  float beta_1_;
  float beta_2_;
  float epsilon_;
};

/// Adam with decoupled weight decay (Keras 3's keras.optimizers.AdamW, Loshchilov and Hutter):
/// before each Adam step every variable decays by the learning rate times weight_decay,
///   variable = variable - variable * weight_decay * lr
/// (in the variable's dtype, in that order, as Keras computes it), then Adam's update above runs
/// on the decayed variable. The decay never enters m or v. Checkpoint names start with "adamw/".
/// GPU variables decay through the GPU's elementwise kernels, then take Adam's multi-tensor
/// update.
class AdamW : public Adam {
 public:
  /// weight_decay >= 0, and Adam's ranges (std::invalid_argument otherwise).
  explicit AdamW(float learning_rate = 0.001f, float weight_decay = 0.004f, float beta_1 = 0.9f, float beta_2 = 0.999f,
                 float epsilon = 1e-7f);
  /// The decay rate (Keras's weight_decay).
  float weight_decay() const noexcept { return weight_decay_; }

 protected:
  void update_all(const std::vector<Update>& updates, std::int64_t iteration) override;

 private:
  // Writes variable - variable * weight_decay * lr to the replica's component.
  void decay(Variable& variable) const;

  float weight_decay_;
};

}  // namespace troupe::nn
