#pragma once
// Watching and steering a training run: the metrics stream, the live dashboard, its JSON API and
// Chrome traces. A training loop calls Monitor::on_step_end at every step boundary, on every
// worker; the monitor publishes the step, and applies what the dashboard asked for there.
//
//   Monitor monitor(strategy, model.optimizer().get(), options);
//   fit_options.on_replica_losses = [&](const std::vector<Tensor>& l) { monitor.record_replica_losses(l); };
//   fit_options.on_step_end = [&](std::int64_t step, double loss) {
//     if (monitor.on_step_end(step, loss) == StepDecision::stop) throw TrainingStopped(step);
//   };
//
// Under MultiWorkerMirroredStrategy the monitor of every worker joins one small all-gather at each
// step boundary: the chief's row carries the command the dashboard gave it, and every row carries
// its worker's timings, so every worker applies the same command after the same step (never a
// divergence), and the chief's dashboard shows every worker. Only the chief serves the dashboard.

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/tensor.hpp"

namespace troupe {

namespace distribute {
class Strategy;
}
namespace nn {
class Optimizer;
}

/// How a Monitor serves and traces.
struct MonitorOptions {
  static constexpr std::int64_t default_trace_first_step = 10;
  static constexpr std::int64_t default_trace_last_step = 110;

  /// The dashboard's TCP port: -1 serves none (the stream and the traces still work), 0 any free
  /// port. Only the chief (worker 0) serves.
  int dashboard_port = -1;
  /// The address the dashboard binds. Any other than a loopback address needs dashboard_token.
  std::string dashboard_address = "127.0.0.1";
  /// The secret every request must carry (`?token=` or `Authorization: Bearer`); "" for none,
  /// which only a loopback address allows.
  std::string dashboard_token;
  /// Where a trace is written; "" traces nothing unless the dashboard asks (then to
  /// "troupe-trace.json"). A worker other than the chief writes "<file>.worker-<i>".
  std::string trace_file;
  /// The steps traced, both included (step n is the n-th step of the run, 1-based). The file is
  /// written as soon as step trace_last_step has ended.
  std::int64_t trace_first_step = default_trace_first_step;
  std::int64_t trace_last_step = default_trace_last_step;
  /// Examples per step over all workers, for samples/s (0: the dashboard shows steps/s instead).
  std::int64_t global_batch_size = 0;
  /// Steps the metrics stream keeps (then every 2nd, 4th, ... step: bounded memory).
  std::size_t history_capacity = 4096;
  /// How often new steps are pushed to open dashboards.
  std::chrono::milliseconds push_interval{100};
  /// Where the monitor says what it did ("dashboard: http://...", "paused after step 40"); nullptr:
  /// std::cout on the chief, nothing elsewhere.
  std::ostream* log = nullptr;
};

/// What the training loop does after a step boundary.
enum class StepDecision { proceed, stop };

/// Thrown by a training loop's step callback to end fit() when the monitor says stop.
class TrainingStopped : public std::runtime_error {
 public:
  explicit TrainingStopped(std::int64_t step)
      : std::runtime_error("training stopped from the dashboard after step " + std::to_string(step)), step_(step) {}
  std::int64_t step() const noexcept { return step_; }

 private:
  std::int64_t step_;
};

/// The metrics stream, the dashboard, and the controls of one training run, for one strategy.
/// Construct it on every worker, in the thread that trains, after the strategy; destroy it before.
class Monitor {
 public:
  /// `optimizer` (may be null) is the one whose learning rate is shown and set. Throws
  /// std::invalid_argument for a non-loopback dashboard_address without a token, a bad address
  /// or trace range, and std::runtime_error when the port cannot be bound.
  Monitor(distribute::Strategy& strategy, nn::Optimizer* optimizer, MonitorOptions options = {});
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  /// What the "checkpoint" and "stop" controls call, on every worker, with the step just ended.
  void set_checkpoint_function(std::function<void(std::int64_t step)> save);

  /// This worker's replicas' losses of the step about to end (each replica's share of the global
  /// mean, as Model::train_step returns it); optional, before on_step_end.
  void record_replica_losses(const std::vector<Tensor>& shares);

  /// The step boundary, after `step` steps in all, in cross-replica context, on every worker:
  /// publishes the step and applies the dashboard's commands (while paused, it waits here).
  /// Returns StepDecision::stop once a stop was asked for (after the checkpoint is saved).
  StepDecision on_step_end(std::int64_t step, double loss);

  /// The port the dashboard listens on; -1 when this process serves none.
  int dashboard_port() const noexcept;
  /// "http://127.0.0.1:PORT/" (with ?token=... when one is set); "" when none is served.
  std::string dashboard_url() const;
  /// Whether a stop was applied.
  bool stopped() const noexcept;
  /// The trace file written last; "" before.
  std::string trace_written() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe
