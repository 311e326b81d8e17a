#pragma once
// The metrics stream of a training run: an actor that the trainer's step boundary publishes one
// event per step to (each event carries what the replicas, the collectives and the input
// pipeline recorded during that step, on every worker), that keeps a bounded history, and that
// pushes the new events to its subscribers (the dashboard's HTTP server) every push interval.
//
// Memory stays bounded on long runs: the history holds at most `capacity` events; when it is
// full, every other event is dropped and from then on only every 2nd (4th, ...) step is kept, so
// the history always spans the whole run at a coarser grain. Between two pushes at most
// max_pending events wait, thinned the same way.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace caf {
class actor_system;
}

namespace troupe::actors {

/// One worker's share of a step.
struct worker_metrics {
  int worker = 0;
  std::int64_t step = 0;
  double input_ms = 0;        ///< the training thread waited for the next batch
  double compute_ms = 0;      ///< replica functions, collectives taken out (the slowest replica)
  double all_reduce_ms = 0;   ///< inside collectives (the slowest replica)
  double other_ms = 0;        ///< the rest of the step: reducing the loss, the step boundary
  std::uint64_t all_reduce_bytes = 0;  ///< bytes handed to collectives by one replica
  int collectives = 0;        ///< collectives of one replica
  double samples_per_s = 0;
  double heartbeat_age_ms = 0;  ///< since the chief last heard from this worker
  bool paused = false;
};

/// One step of the run.
struct step_event {
  std::int64_t step = 0;
  double time_s = 0;          ///< since the monitor started
  double loss = 0;            ///< the global batch's mean loss
  double learning_rate = 0;
  double samples_per_s = 0;   ///< global
  bool paused = false;
  std::vector<double> replica_loss;      ///< every replica of every worker, by global replica id
  std::vector<worker_metrics> workers;   ///< by worker index
};

/// The event as one JSON object.
std::string to_json(const step_event& e);

/// The bounded history (what the actor holds; a plain class so it is tested alone).
class metrics_history {
 public:
  explicit metrics_history(std::size_t capacity);
  /// Offers the next event; it is kept when it falls on the current stride.
  void add(const step_event& e);
  const std::deque<step_event>& events() const noexcept { return events_; }
  /// Every how many offered events one is kept (1 until the history first fills).
  std::uint64_t stride() const noexcept { return stride_; }
  /// {"stride": n, "events": [...]}
  std::string to_json() const;

 private:
  std::size_t capacity_;
  std::uint64_t stride_ = 1;
  std::uint64_t offered_ = 0;
  std::deque<step_event> events_;
};

/// The stream actor and its handle. publish() never blocks the caller: it is one message.
class metrics_stream {
 public:
  /// Called on the stream's thread with a JSON array of the events since the last push.
  using subscriber = std::function<void(const std::string& json_events)>;
  static constexpr std::size_t max_pending = 256;

  metrics_stream(caf::actor_system& system, std::size_t capacity, std::chrono::milliseconds push_interval);
  /// Stops the actor; no subscriber is called after this returns.
  ~metrics_stream();
  metrics_stream(const metrics_stream&) = delete;
  metrics_stream& operator=(const metrics_stream&) = delete;

  /// Publishes steps, oldest first. A trainer batches its steps (a few per message) so that a
  /// fast training loop does not wake the stream's thread at every step.
  void publish(std::vector<step_event> events);
  /// Adds a subscriber; returns its id.
  int subscribe(subscriber s);
  /// Removes a subscriber; once this returns it is not called again.
  void unsubscribe(int id);
  /// The history as JSON (metrics_history::to_json), or "" when the actor does not answer in time.
  std::string history_json(std::chrono::milliseconds timeout);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::actors
