#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/data/dataset.hpp"
#include "troupe/distribute/input.hpp"
#include "troupe/nn/callback.hpp"
#include "troupe/nn/dataset_creator.hpp"
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
namespace detail {
class FitLoop;
class PsFitLoop;
}  // namespace detail

/// How Model::fit reports, resumes and is steered.
struct FitOptions {
  /// 0: silent; 1: Keras's progress bar (ETA, ms/step, loss and metrics), redrawn in place on a
  /// terminal and one line per epoch otherwise; 2: one line per epoch
  /// ("Epoch 2/5: 40 steps, loss 0.1234, accuracy 0.9500, 51234 samples/s, 0.52 s, 13 ms/step").
  int verbose = 1;
  /// Where the progress goes; nullptr: std::cout.
  std::ostream* out = nullptr;
  /// Whether `out` is a terminal (the bar is redrawn in place); unset: std::cout on a terminal.
  std::optional<bool> terminal;
  /// Under MultiWorkerMirroredStrategy only the chief prints, unless this is set.
  bool print_on_all_workers = false;
  /// Steps already done by an earlier run (after restoring a checkpoint): training starts at that
  /// step of that epoch. Needs steps_per_epoch.
  std::int64_t initial_step = 0;
  /// Called after every step, in cross-replica context, with the number of steps done in all
  /// (initial_step included) and the step's loss.
  std::function<void(std::int64_t step, double loss)> on_step_end;
  /// Called at every boundary of training, in this order (see Callback).
  std::vector<std::shared_ptr<Callback>> callbacks;
  /// Batches {features, labels} evaluated at the end of every epoch: "val_loss" and the compiled
  /// metrics with "val_" in front, in the epoch's logs and History::history.
  std::optional<data::Dataset> validation_data;
  /// Backs the run up and resumes it where a backup stands (weights, optimizer, step, epoch,
  /// input position), so that an interrupted fit ends bit-identical to one that never stopped.
  /// Not owned; replaces initial_step; one fit per BackupAndRestore. fit tracks the model's
  /// variables itself (track only other state, such as random engines, before calling fit).
  /// A stop at a step boundary (a signal, a request, a callback's stop_training) backs up that
  /// step and keeps the backup, so the next run resumes inside the epoch; a run resumed with no
  /// epoch left trains nothing, says so on `out` and keeps the backup.
  /// See troupe/nn/backup_and_restore.hpp.
  BackupAndRestore* backup_and_restore = nullptr;
  /// Under ParameterServerStrategy: the steps each scheduled closure runs on its worker (Keras's
  /// compile(steps_per_execution=...)); >= 1. The callbacks' batch hooks then run once per
  /// closure, with the index of its last step; controls apply between closures. Elsewhere 1.
  int steps_per_execution = 1;
};

/// What Model::fit measured.
struct History {
  /// Per epoch: its index, counted from the start of training (initial_step included), as Keras's
  /// History.epoch. One entry per epoch: an epoch run again (under ParameterServerStrategy, after
  /// a ps task's restart rolled training back to a checkpoint of an earlier epoch) replaces its
  /// entry and those after it in every list.
  std::vector<int> epoch;
  std::vector<double> loss;                ///< per epoch: the mean of its steps' losses
  std::vector<double> samples_per_second;  ///< per epoch
  std::vector<double> seconds;             ///< per epoch, wall-clock
  /// Per epoch, by name (Keras's History.history): "loss", the compiled metrics, "val_*".
  std::map<std::string, std::vector<double>> history;
  std::int64_t steps = 0;                  ///< steps run by this call
  std::int64_t samples = 0;                ///< examples consumed by this call, over all replicas
  double all_reduce_seconds = 0;           ///< replica 0's time in the gradient all-reduce
  /// Why training ended before its last epoch (TrainingControl::stop_training's reason); empty
  /// when it ran to the end.
  std::string stop_reason;
  /// The step (counted from the start, initial_step included) after which training stopped early.
  std::int64_t stopped_at_step = 0;
  /// The step whose loss was NaN or infinite when TerminateOnNaN stopped training (0: none).
  std::int64_t non_finite_step = 0;
  /// Under elastic membership (MultiWorkerOptions::elastic): this worker was asked to leave
  /// (SIGUSR2, as troupe-launch's host discovery sends it) and left the cluster at the step
  /// boundary stopped_at_step, with stop_reason saying so; the others train on without it. It
  /// runs no more cross-worker collectives (evaluate over the cluster among them).
  bool left_cluster = false;
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

  /// Builds the layers for inputs of `input_shape` (Keras's Model.build; see Sequential::build)
  /// in the model's strategy scope. Layers that take a size from the data are otherwise built
  /// from the first batch; a fit with BackupAndRestore needs them built before it starts.
  void build(Shape input_shape);
  /// Sets the optimizer and the loss, and builds the optimizer's slots in the model's scope. A
  /// model with a layer computing in float16 (made under "mixed_float16") gets the optimizer
  /// wrapped in a LossScaleOptimizer, as Keras does (optimizer() then returns the wrapper).
  void compile(std::shared_ptr<Optimizer> optimizer, Loss loss);
  /// The same, with metrics computed during fit and evaluate: "accuracy" or
  /// "sparse_categorical_accuracy" (the argmax of the outputs against integer labels; anything
  /// else is std::invalid_argument naming it).
  void compile(std::shared_ptr<Optimizer> optimizer, Loss loss, std::vector<std::string> metrics);

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
  /// Trains under ParameterServerStrategy as Keras does (docs/clusters.md): the model, built and
  /// compiled in the strategy's scope, has its variables on the ps tasks; the chief schedules
  /// closures of FitOptions::steps_per_execution steps onto the workers, each of which rebuilds the
  /// model from its architecture, reads the variables, computes the gradients of its next batches
  /// from `creator`'s dataset and has the ps tasks apply the model's optimizer (SGD with or
  /// without momentum or nesterov, Adam, AdamW) to their shards, asynchronously. steps_per_epoch
  /// is required (the workers' datasets have no common end); the callbacks and the controls run
  /// on the chief at closure boundaries. Mistakes are std::invalid_argument naming them (another
  /// strategy, no steps_per_epoch, an optimizer the ps tasks cannot apply, layers not built); a
  /// closure that fails on its worker (an unknown dataset function) is troupe::Error naming the
  /// worker and the cause.
  History fit(const DatasetCreator& creator, int epochs, std::int64_t steps_per_epoch, const FitOptions& options = {});

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
  /// The outputs, in cross-replica context; float32 for a mixed-precision model. Distributed as
  /// TensorFlow's predict is: the rows are split over every replica of every worker (contiguous
  /// shares in replica order), each computes its share with its own weights, and the outputs are
  /// gathered, so every worker returns all of them. Under MultiWorkerMirroredStrategy it is a
  /// collective: every worker calls it with the same x. Fewer rows than replicas are computed
  /// whole by every worker.
  Tensor predict(const Tensor& x) const;
  /// Mean loss and accuracy over a dataset of batches {features, labels}, in cross-replica context.
  /// Each batch is split over the replicas as predict's rows are, and the sums of the loss and the
  /// hits are all-reduced: every example counted once, the same result on every worker (a
  /// collective under MultiWorkerMirroredStrategy: every worker passes the same batches).
  EvaluateResult evaluate(const data::Dataset& batches) const;
  /// The same for one batch.
  EvaluateResult evaluate(const Tensor& features, const Tensor& labels) const;

  /// Saves the model into the directory `dir` (Keras's model.save; load it with nn::load_model,
  /// troupe/nn/saving.hpp): the architecture and the compiled loss, optimizer and metrics as JSON
  /// (dir/model.json), the weights and the optimizer's state in the checkpoint format
  /// (dir/variables.ckpt). The directory is replaced atomically: written beside it under a
  /// temporary name and swapped in, so a crash leaves the previous save whole. An existing `dir`
  /// must be empty or a saved model (SavedModelError otherwise, naming it). The layers must be
  /// built. In cross-replica context; under MultiWorkerMirroredStrategy on every worker (the
  /// chief writes `dir`).
  void save(const std::string& dir) const;

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
  /// The compiled metrics' names.
  const std::vector<std::string>& metrics() const noexcept { return metrics_; }
  /// Requests to a running fit (stop, pause, checkpoint, learning rate): see TrainingControl.
  TrainingControl& control() const noexcept { return *control_; }
  /// The strategy the model belongs to.
  distribute::Strategy& strategy() const noexcept { return *strategy_; }

  /// Prints the layers, their output shapes and parameter counts, and the totals, as Keras's
  /// Model.summary() does:
  ///
  ///     Model: "sequential"
  ///     _________________________________________________________________
  ///      Layer (type)                Output Shape              Param #
  ///     =================================================================
  ///      dense_0 (Dense)             (None, 64)                50240
  ///     ...
  ///     Total params: 50,890
  ///     Trainable params: 50,890
  ///     Non-trainable params: 0
  ///     _________________________________________________________________
  void summary(std::ostream& out) const;
  /// The same on std::cout.
  void summary() const;

 private:
  friend class detail::FitLoop;    // fit's loop runs step_and_update
  friend class detail::PsFitLoop;  // fit's loop under ParameterServerStrategy
  void check_compiled(const char* op) const;
  // One training step on this replica (train_step's, also fit's): forward, loss, backward with
  // the gradients all-reduced (in buckets while backward runs, where the strategy uses them),
  // update. Returns the loss; `outputs`, when given, receives the model's outputs.
  Tensor step_and_update(const data::Element& inputs, std::int64_t global_batch_size, Tensor* outputs, const char* op);

  Sequential layers_;
  distribute::Strategy* strategy_;
  std::shared_ptr<Optimizer> optimizer_;
  Loss loss_;
  std::vector<std::string> metrics_;
  std::shared_ptr<TrainingControl> control_ = std::make_shared<TrainingControl>();
};

}  // namespace troupe::nn
