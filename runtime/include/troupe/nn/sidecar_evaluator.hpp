#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "troupe/data/dataset.hpp"
#include "troupe/nn/model.hpp"

namespace troupe::nn {

/// What a SidecarEvaluator measured on one checkpoint.
struct SidecarEvaluation {
  std::string checkpoint;  ///< its directory
  std::int64_t step = 0;   ///< its training step
  EvaluateResult result;
};

/// The SidecarEvaluator's controls beyond Keras's arguments.
struct SidecarEvaluatorOptions {
  /// How often the checkpoint directory is listed while no new checkpoint is there.
  std::chrono::milliseconds poll_interval{500};
  /// Stop once the checkpoint of this step (or a later one) is evaluated or skipped: the final
  /// step of the training. nullopt: no such step.
  std::optional<std::int64_t> final_step;
  /// TensorBoard scalars "eval_loss" and "eval_<metric>" of every checkpoint at its step, in an
  /// event file in this directory (created). Empty: none.
  std::string tensorboard_dir;
  /// One line per checkpoint ("evaluator: step S (DIR): eval_loss=... eval_accuracy=...") and
  /// per skipped checkpoint; nullptr: none.
  std::ostream* out = nullptr;
  /// Called after each evaluation, from the thread that runs start().
  std::function<void(const SidecarEvaluation&)> on_evaluation;
};

/// Evaluates the checkpoints a training writes, in a process of its own
/// (tf.keras.utils.SidecarEvaluator, the "evaluator" task of a TF_CONFIG cluster, or any
/// process that reaches the checkpoint directory): start() watches `checkpoint_dir` for sharded
/// checkpoints (the `ckpt-<step>` directories a CheckpointManager of ps variables keeps; a save still in
/// its temporary directory is never taken) and evaluates each new one once, in step order: its
/// variables are loaded into `model` (a local copy of the trained model, compiled, made outside
/// any ParameterServerStrategy; each variable found by its name, its shards' rows joined; the
/// optimizer's slots are not read), then Model::evaluate runs on `data` (its first `steps`
/// batches when steps > 0, else all of it). A checkpoint that does not read back intact is
/// reported on options.out and std::cerr and skipped, never retried; a checkpoint whose step is
/// not above the last one evaluated (one replaced after a restart) is left alone. A checkpoint
/// lacking one of the model's variables, or holding it with another shape or dtype, is a
/// CheckpointError naming it: the model does not match the training's.
///
/// start() returns when `max_evaluations` (> 0; 0: no limit) checkpoints were evaluated, when the
/// checkpoint of options.final_step was, or when stop() was called (from any thread).
class SidecarEvaluator {
 public:
  /// `model` must be compiled and outlive the evaluator; steps < 0 or max_evaluations < 0 is
  /// std::invalid_argument, as is an empty checkpoint_dir.
  SidecarEvaluator(Model& model, data::Dataset data, std::string checkpoint_dir, std::int64_t steps = 0,
                   int max_evaluations = 0, SidecarEvaluatorOptions options = {});

  /// Watches and evaluates until one of the stop conditions; returns the evaluations, in step
  /// order. Waits for the checkpoint directory to appear.
  std::vector<SidecarEvaluation> start();
  /// Makes start() return after the evaluation in progress (at once while it waits).
  void stop();

  /// The step of the last checkpoint evaluated or skipped (-1: none yet).
  std::int64_t last_step() const noexcept { return last_step_; }

 private:
  bool stop_requested();

  Model* model_;
  data::Dataset data_;
  std::string checkpoint_dir_;
  std::int64_t steps_;
  int max_evaluations_;
  SidecarEvaluatorOptions options_;
  std::int64_t last_step_ = -1;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
};

}  // namespace troupe::nn
