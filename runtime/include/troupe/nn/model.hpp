#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "troupe/data/dataset.hpp"
#include "troupe/distribute/input.hpp"
#include "troupe/nn/losses.hpp"
#include "troupe/nn/optimizers.hpp"
#include "troupe/nn/sequential.hpp"
#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe::distribute {
class Strategy;
}

namespace troupe::nn {

class BackupAndRestore;

/// How Model::fit reports and resumes.
struct FitOptions {
  /// 0: silent; 1: one line per epoch ("Epoch 2/5: 40 steps, loss 0.1234, 51234 samples/s, 0.52 s").
  int verbose = 1;
  /// Where the progress lines go; nullptr: std::cout.
  std::ostream* out = nullptr;
  /// Steps already done by an earlier run (after restoring a checkpoint): training starts at that
  /// step of that epoch. Needs steps_per_epoch.
  std::int64_t initial_step = 0;
  /// Called after every step, in cross-replica context, with the number of steps done in all
  /// (initial_step included) and the step's loss: where a trainer saves checkpoints.
  std::function<void(std::int64_t step, double loss)> on_step_end;
  /// Backs the run up and resumes it where a backup stands (weights, optimizer, step, epoch,
  /// input position), so that an interrupted fit ends bit-identical to one that never stopped.
  /// Not owned; replaces initial_step; one fit per BackupAndRestore. fit tracks the model's
  /// variables itself (track only other state, such as random engines, before calling fit).
  /// See troupe/nn/backup_and_restore.hpp.
  BackupAndRestore* backup_and_restore = nullptr;
};

/// What Model::fit measured.
struct History {
  std::vector<double> loss;                ///< per epoch: the mean of its steps' losses
  std::vector<double> samples_per_second;  ///< per epoch
  std::vector<double> seconds;             ///< per epoch, wall-clock
  std::int64_t steps = 0;                  ///< steps run by this call
  std::int64_t samples = 0;                ///< examples consumed by this call, over all replicas
  double all_reduce_seconds = 0;           ///< replica 0's time in the gradient all-reduce
};

/// What Model::evaluate measured.
struct EvaluateResult {
  double loss = 0;      ///< the compiled loss, mean over the examples
  double accuracy = 0;  ///< classification accuracy (argmax of the outputs against integer labels)
  std::int64_t samples = 0;
};

/// The loss of a batch and the gradients of every trainable variable (the GradientTape part of
/// the seed's step_fn).
struct LossAndGradients {
  Tensor loss;                     ///< scalar float32
  std::vector<Tensor> gradients;   ///< in the order of trainable_variables()
};

/// A Sequential model that can be compiled and fitted under any strategy (tf.keras.Model). It
/// belongs to the strategy current when it is constructed (get_strategy(): the scope's, else the
/// default strategy), which must be the one its layers were created in, and must outlive it.
class Model {
 public:
  /// Takes the layers; their variables must have one component per replica of the current
  /// strategy (std::invalid_argument otherwise: create the layers in the same scope).
  explicit Model(Sequential layers);

  /// Sets the optimizer and the loss, and builds the optimizer's slots in the model's scope.
  void compile(std::shared_ptr<Optimizer> optimizer, Loss loss);

  /// Trains for `epochs` epochs. Each step takes the next per-replica batch {features, targets},
  /// and runs train_step on every replica through strategy.run; the step's loss is the global
  /// batch's mean. steps_per_epoch > 0: that many steps per epoch, one iterator continued across
  /// epochs (restarted when it ends); -1: one full pass per epoch. Returns what it measured.
  History fit(const distribute::DistributedDataset& dataset, int epochs = 1, std::int64_t steps_per_epoch = -1,
              const FitOptions& options = {});
  /// The same for a dataset of global batches: distributed with experimental_distribute_dataset.
  /// An infinite dataset needs steps_per_epoch (std::invalid_argument).
  History fit(const data::Dataset& dataset, int epochs = 1, std::int64_t steps_per_epoch = -1,
              const FitOptions& options = {});

  /// One training step on this replica's batch {features, targets} (the seed's step_fn), for
  /// strategy.run: forward, the compiled loss scaled by global_batch_size (the rows of all
  /// replicas in this step), backward, optimizer.apply_gradients (SUM all-reduce). Returns this
  /// replica's share of the loss; the sum over replicas is the global mean.
  Tensor train_step(const data::Element& inputs, std::int64_t global_batch_size);
  /// The compiled loss of (features, targets) scaled by global_batch_size, and its gradients.
  LossAndGradients compute_gradients(const Tensor& features, const Tensor& targets,
                                     std::int64_t global_batch_size) const;

  /// The outputs for x [batch, input_dim] (the replica's own weights inside strategy.run).
  Tensor operator()(const Tensor& x) const { return layers_.forward(x); }
  /// The outputs, in cross-replica context (the primary component of the weights).
  Tensor predict(const Tensor& x) const;
  /// Mean loss and accuracy over a dataset of batches {features, labels}, in cross-replica context.
  EvaluateResult evaluate(const data::Dataset& batches) const;
  /// The same for one batch.
  EvaluateResult evaluate(const Tensor& features, const Tensor& labels) const;

  /// The layers.
  const Sequential& layers() const noexcept { return layers_; }
  /// The layers' variables, in the order of compute_gradients' gradients.
  std::vector<Variable> trainable_variables() const { return layers_.trainable_variables(); }
  /// The model's variables and, once compiled, the optimizer's: what a Checkpoint saves.
  std::map<std::string, Variable> variables() const;
  /// The compiled optimizer (nullptr before compile).
  const std::shared_ptr<Optimizer>& optimizer() const noexcept { return optimizer_; }
  /// The compiled loss (no function before compile).
  const Loss& loss() const noexcept { return loss_; }
  /// The strategy the model belongs to.
  distribute::Strategy& strategy() const noexcept { return *strategy_; }

 private:
  void check_compiled(const char* op) const;

  Sequential layers_;
  distribute::Strategy* strategy_;
  std::shared_ptr<Optimizer> optimizer_;
  Loss loss_;
};

}  // namespace troupe::nn
