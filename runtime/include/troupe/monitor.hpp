#pragma once
// Watching and steering a training run: the metrics stream, the live dashboard, its JSON API and
// Chrome traces.
//
// With Model::fit the monitor is a callback, on every worker:
//
//   Monitor monitor(strategy, model.optimizer().get(), options);
//   fit_options.callbacks.push_back(monitor.callback());
//
// It reads each step from fit's logs (the loss of every replica, the step-time parts of every
// worker), and the dashboard's controls become requests to model.control(): fit agrees on them
// in the reduction every step already makes, so every worker pauses, resumes, takes a learning
// rate, checkpoints (through the callbacks' on_checkpoint) and stops after the same step, and the
// monitor adds no collective of its own.
//
// A custom training loop calls Monitor::on_step_end at every step boundary, on every worker,
// instead. Under MultiWorkerMirroredStrategy the monitors then join one small all-reduce of their
// own at each boundary: the chief's row carries the dashboard's command, every row its worker's
// timings, so every worker applies the same command after the same step (never a divergence),
// and the chief's dashboard shows every worker. Only the chief serves the dashboard.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "troupe/tensor.hpp"

namespace troupe {

namespace distribute {
class Strategy;
struct ActorEvent;
}
namespace nn {
class Callback;
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
  /// Whether this trainer saves checkpoints: with Model::fit, a callback saves in on_checkpoint;
  /// with on_step_end, set_checkpoint_function was given one. False: the dashboard's "Save
  /// checkpoint" and "Stop (with checkpoint)" answer 409 (and the page disables them), since they
  /// would save nothing; "Stop (no checkpoint)" still stops.
  bool checkpoints = true;
  /// Where the monitor says what it did ("dashboard: http://...", "paused after step 40"); nullptr:
  /// std::cout on the chief, nothing elsewhere.
  std::ostream* log = nullptr;
};

/// A number of the application's own that the dashboard sets (a sampling temperature, a noise
/// level): the page shows it with a field to change it; the application reads it with
/// Monitor::control at its step boundary.
struct MonitorControl {
  /// The name on the page and in `POST /api/control?name=`: 1 to 32 of A-Z a-z 0-9 _.
  std::string name;
  /// The value before the page sets one; within [min, max].
  double value = 0;
  /// The values the page may set, both included (finite, min <= max).
  double min = 0;
  double max = 1;
  /// One line shown beside the field ("" for none).
  std::string help;
};

/// What a person asked of one actor from the dashboard's Actors card (Monitor::add_actor_action),
/// as the application takes it at its own boundary (Monitor::take_actor_commands).
struct ActorCommand {
  /// The actor (ActorHandle::id) whose row was clicked.
  std::uint64_t id = 0;
  /// Its label then (Monitor::describe_actor); "" for an unlabelled actor.
  std::string label;
  /// One of the actions added ("stop", "clone").
  std::string action;
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

  /// The monitor as a Model::fit callback (put it in FitOptions::callbacks, on every worker; the
  /// monitor must outlive the fit). The dashboard's controls go through model.control(): pause,
  /// resume, set_learning_rate, request_checkpoint (saved by the callbacks' on_checkpoint) and, for
  /// "stop", request_checkpoint with request_stop(dashboard_stop_reason). A traced range asked for
  /// from the dashboard is traced on the chief. Use either the callback or on_step_end, not both.
  std::shared_ptr<nn::Callback> callback();
  /// The reason of a stop from the dashboard (TrainingControl::stopped_for tells it on any worker).
  static constexpr const char* dashboard_stop_reason = "stopped from the dashboard";

  /// on_step_end's side: what the "checkpoint" and "stop" controls call, on every worker, with
  /// the step just ended.
  void set_checkpoint_function(std::function<void(std::int64_t step)> save);

  /// on_step_end's side: this worker's replicas' losses of the step about to end (each replica's
  /// share of the global mean, as Model::train_step returns it); optional, before on_step_end.
  void record_replica_losses(const std::vector<Tensor>& shares);

  /// For a custom training loop (Model::fit takes callback() instead): the step boundary, after
  /// `step` steps in all, in cross-replica context, on every worker: publishes the step and
  /// applies the dashboard's commands (while paused, it waits here). Under
  /// MultiWorkerMirroredStrategy it makes one small collective of its own per call. Returns
  /// StepDecision::stop once a stop was asked for (after the checkpoint is saved).
  StepDecision on_step_end(std::int64_t step, double loss);

  /// Adds a control the dashboard's page shows and sets (at most max_controls). A value set from
  /// the page is checked there (a finite number in [min, max], else 400 naming the value and the
  /// range) and takes effect at the next step boundary (the callback's on_train_batch_end, or
  /// on_step_end), which says "NAME VALUE from step N+1" and marks the charts. Set in the process
  /// that serves the dashboard (the chief): another worker's keeps `value`, so use a control for
  /// what the chief alone decides (sampling, logging), not for what every replica computes.
  /// std::invalid_argument for a bad name, a name already added, or a range or value that is not
  /// finite or not ordered (min <= value <= max).
  void add_control(const MonitorControl& control);
  /// The control's value as of the last step boundary (thread-safe); std::out_of_range naming the
  /// known controls for a name never added.
  double control(const std::string& name) const;
  /// The most controls a monitor takes.
  static constexpr std::size_t max_controls = 16;

  /// A text summary (as tf.summary.text): the page shows the newest text of every tag, with its
  /// step, refreshed as new ones come. `text` may hold several lines; for the page each line is
  /// made printable (base::printable_line: valid UTF-8, control characters as U+FFFD) and the
  /// whole is cut at max_text_bytes. The last few of each tag are kept (bounded memory).
  /// std::invalid_argument for a tag that is not 1 to 64 of A-Z a-z 0-9 _ . / -, or a new tag
  /// beyond max_text_tags. Thread-safe.
  void publish_text(const std::string& tag, std::int64_t step, const std::string& text);
  /// The most bytes of one text that the page shows.
  static constexpr std::size_t max_text_bytes = 16384;
  /// The most tags a monitor keeps texts of.
  static constexpr std::size_t max_text_tags = 16;

  /// The hook an ActorCluster reports into (put it in ActorClusterOptions::on_event): the
  /// dashboard's Actors card and `GET /api/actors` then show every actor it spawned, with its
  /// type, task, state, restarts and the age of its last reply. Thread-safe; calls after the
  /// monitor is gone do nothing harmful (the record they write is no longer shown).
  std::function<void(const distribute::ActorEvent&)> actor_events();
  /// The application's name for actor `id` (ActorHandle::id) and its numbers at `step` (a trial's
  /// accuracy and learning rate): its row on the Actors card shows them, and the card draws each
  /// label's first number over the steps. A new actor given the label of another (one respawned
  /// in a lost one's place) takes that one's row and counts as its restart. std::invalid_argument
  /// for a label that is not 1 to 64 bytes of printable text, more than max_actor_values numbers,
  /// or a number's name that is not 1 to 32 of A-Z a-z 0-9 _. Thread-safe.
  void describe_actor(std::uint64_t id, const std::string& label, std::int64_t step,
                      const std::vector<std::pair<std::string, double>>& values);
  /// The most numbers describe_actor takes for one actor.
  static constexpr std::size_t max_actor_values = 16;

  /// Offers an action on every running actor's row of the Actors card (a button; `help` its
  /// tooltip), which a person asks for with `POST /api/actor_command?id=N&action=NAME` under the
  /// same rules as every command (the token, the Host and Origin checks, 409 after the end): 400
  /// naming an id that is not a row, or an action not added; 409 for an actor that is not running.
  /// Nothing acts when asked: the application takes the requests with take_actor_commands at its
  /// own boundary and says what it did with answer_actor_command. At most max_actor_actions;
  /// std::invalid_argument for a name that is not 1 to 32 of a-z 0-9 _, or one already added.
  void add_actor_action(const std::string& name, const std::string& help = "");
  /// The actor commands asked for since the last call, oldest first (thread-safe; at most
  /// max_pending_actor_commands wait: beyond, the page is answered 503).
  std::vector<ActorCommand> take_actor_commands();
  /// What the application did with a command it took: `text` (one line: "trial 3 stopped after
  /// generation 4") is said as the monitor's other lines are, and shown on the Actors card under the
  /// table with the newest answers first, as a refusal when `refused` ("not stopped: the last
  /// trial running"). Thread-safe.
  void answer_actor_command(const ActorCommand& command, const std::string& text, bool refused = false);
  /// The most actions add_actor_action takes.
  static constexpr std::size_t max_actor_actions = 8;
  /// The most actor commands that wait for take_actor_commands.
  static constexpr std::size_t max_pending_actor_commands = 64;

  /// The port the dashboard listens on; -1 when this process serves none.
  int dashboard_port() const noexcept;
  /// "http://127.0.0.1:PORT/" (with ?token=... when one is set); "" when none is served.
  std::string dashboard_url() const;
  /// Whether a stop from the dashboard was applied (with the callback: on every worker, once fit
  /// stopped for it).
  bool stopped() const noexcept;
  /// The trace file written last; "" before.
  std::string trace_written() const;

 private:
  struct Impl;
  class FitCallback;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe
