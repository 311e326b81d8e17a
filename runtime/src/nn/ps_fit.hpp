#pragma once

// Model::fit under ParameterServerStrategy, as Keras runs it: the chief schedules train-step
// closures onto the workers through the ClusterCoordinator; each worker runs troupe's built-in
// function "troupe.fit.train_step", which every worker Server's registry holds.
//
// One closure, in order:
// 1. the chief schedules "troupe.fit.train_step" with three arguments: the per-worker iterator of
//    the DatasetCreator's dataset function, the model's training config (architecture, loss,
//    metrics, the ps names of its trainable variables in order, the optimizer without its
//    learning rate: the same text for every closure of a fit, so the worker builds the model
//    once and caches it by that text), and a float64 vector {steps, learning rate, first step};
// 2. the worker takes the model from its cache (rebuilding it on first use, outside any strategy,
//    its variables local), and for each of the closure's steps: takes its next batch, reads every
//    trainable variable from the ps tasks (all shards in flight at once: one round trip) into the
//    local model, computes the loss and the gradients, and sends the gradients to the ps tasks,
//    which apply the optimizer to their shards with the slots beside them (an Embedding first
//    layer's table only in the rows the batch looked up, with their slots);
// 3. the worker returns three float64 vectors, one entry per step: the loss, the rows, and the
//    hits of the compiled accuracy metric (0 without one);
// 4. the chief takes the results in the order it scheduled them, runs the callbacks and applies
//    the controls at that closure boundary (a learning rate reaches the closures scheduled after
//    it; a pause, a checkpoint or a stop first lets the closures in flight finish).
//
// A worker lost with a closure runs it again elsewhere (at-least-once: its updates may have been
// applied in part). Updates are asynchronous: each closure reads the variables as the ps tasks
// hold them when it starts.

#include <chrono>
#include <cstdint>
#include <deque>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "nn/completion_rate.hpp"
#include "nn/epoch_end.hpp"
#include "troupe/distribute/parameter_server_strategy.hpp"
#include "troupe/nn/model.hpp"

namespace troupe::distribute {
class FunctionRegistry;
}  // namespace troupe::distribute

namespace troupe::nn::detail {

/// The built-in worker function's name.
inline constexpr const char* fit_train_step = "troupe.fit.train_step";

/// The loss of a batch, its gradients (trainable_variables() order) and the model's outputs, as
/// fit's step computes them (the batch's rows as its global batch; `step` for Dropout's random
/// stream). Defined in model.cpp.
LossAndGradients batch_gradients(const Model& model, const data::Element& batch, std::int64_t step, Tensor* outputs);

/// The optimizer the ps tasks apply in place of `optimizer` (SGD, with momentum or nesterov,
/// Adam, AdamW); any other is std::invalid_argument naming it and what the ps tasks apply.
distribute::ShardOptimizer shard_optimizer_of(const Optimizer& optimizer);

/// One call of Model::fit(DatasetCreator, ...) on the chief, from its checks to its History.
class PsFitLoop {
 public:
  /// Checks the arguments (std::invalid_argument naming the bad one).
  PsFitLoop(Model& model, distribute::ParameterServerStrategy& strategy, const DatasetCreator& creator, int epochs,
            std::int64_t steps_per_epoch, const FitOptions& options);
  ~PsFitLoop();
  PsFitLoop(const PsFitLoop&) = delete;
  PsFitLoop& operator=(const PsFitLoop&) = delete;

  History run();

 private:
  using Clock = std::chrono::steady_clock;
  struct InFlight {
    distribute::RemoteValue value;
    std::int64_t first_k = 0;  // its first step's index in the epoch
    std::int64_t steps = 0;
  };
  using EpochSums = detail::EpochSums;

  void begin();
  void run_epoch(int epoch);
  void schedule(std::int64_t first_k, std::int64_t steps);
  // Takes the oldest closure's result, runs its callbacks; false once none is in flight.
  bool take_one(int epoch, EpochSums& sums);
  // With nothing in flight: the checkpoint, stop or pause that waited; false once stopped.
  bool boundary();
  void end_epoch(int epoch, const EpochSums& sums, Logs& epoch_logs, Clock::time_point start);
  void record_iterations();
  // After a closure failed: when it was a ps task lost and restarted alone (ps_fit_recovery.cpp),
  // every shard is restored from the last sharded checkpoint and the position moved back to it;
  // returns whether training goes on from there (false: the failure was not that, raise it).
  bool recover_from_ps_restart();

  Model& model_;
  distribute::ParameterServerStrategy& strategy_;
  const int epochs_;
  const std::int64_t steps_per_epoch_;
  const std::int64_t steps_per_execution_;
  const FitOptions& options_;
  TrainingControl& control_;
  std::ostream& out_;
  const distribute::ShardOptimizer optimizer_;
  const std::string dataset_function_;
  std::unique_ptr<distribute::ClusterCoordinator> coordinator_;
  Tensor config_;  // the training config's text, as int32 words
  distribute::PerWorkerIterator iterator_;
  std::size_t window_ = 2;  // closures in flight
  std::vector<std::shared_ptr<Callback>> callbacks_;
  History history_;
  std::deque<InFlight> in_flight_;
  std::int64_t step_ = 0;       // steps done
  std::int64_t iterations_at_start_ = 0;  // the optimizer's iterations when this fit began
  std::int64_t scheduled_ = 0;  // steps scheduled
  int first_epoch_ = 0;
  std::int64_t first_k_ = 0;    // where the first epoch starts (initial_step)
  bool stopped_ = false;
  bool hold_ = false;           // a pause, a checkpoint or a stop waits for the closures in flight
  bool checkpoint_pending_ = false;
  bool pause_pending_ = false;
  std::string stop_reason_;
  bool stop_pending_ = false;
  CompletionRate rate_{2, std::chrono::seconds(1)};
  bool counting_samples_ = false;  // the workers' samples go to the dashboard's board (on_result)  // samples/s and step time over the last results
  Logs last_batch_logs_;
  std::uint64_t ps_losses_seen_ = 0;  // ps losses this fit recovered from (or saw at its start)
  bool rolled_back_ = false;          // a ps restart moved the position back to a checkpoint
};

}  // namespace troupe::nn::detail

namespace troupe::distribute::detail {

/// Adds troupe's built-in worker functions ("troupe.fit.train_step") to a worker's registry.
void add_builtin_functions(FunctionRegistry& registry);

/// A string as an int32 tensor (its byte count, then its bytes four to a word), and back: text
/// travels as a scheduled function's tensor argument. A tensor that is not one is
/// std::invalid_argument.
Tensor text_tensor(const std::string& text);
std::string tensor_text(const Tensor& t);

}  // namespace troupe::distribute::detail
