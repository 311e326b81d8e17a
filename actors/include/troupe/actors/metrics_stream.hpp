#pragma once
// The metrics stream of a training run: an actor that receives one event per step (each event
// carries what the replicas, the collectives and the input pipeline recorded during that step, on
// every worker), keeps a bounded history, and pushes the new events to its subscribers (the
// dashboard's HTTP server) every push interval.
//
// The step boundary hands its event over without a message, a lock, an allocation or a wakeup:
// it copies the event into the next slot of a ring allocated once (step_ring), and the stream's
// thread drains the ring on its own timer, every push interval. Training never waits for the
// stream; when the ring is full (the stream's thread starved for a long while) a step's event is
// dropped and counted, never blocked on.
//
// Memory stays bounded on long runs: the history holds at most `capacity` events; when it is
// full, every other event is dropped and from then on only every 2nd (4th, ...) step is kept, so
// the history always spans the whole run at a coarser grain. Between two pushes at most
// max_pending events wait, thinned the same way.

#include <atomic>
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
  /// The compiled metrics of the step ("accuracy", ...), in the order of *metric_names; the names
  /// are shared by every step of a run (copying an event copies the pointer, not the names).
  std::vector<double> metrics;
  std::shared_ptr<const std::vector<std::string>> metric_names;
  /// Metric values a ring slot holds without allocating.
  static constexpr std::size_t reserved_metrics = 8;
};

/// The event as one JSON object ("metrics": {name: value} only when it has metrics).
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
  std::vector<step_event> spare_;  // events dropped by a thinning, reused (with their vectors) by add
};

/// The hand-over from one producer thread (the step boundary) to one consumer thread (the stream):
/// a ring of step events whose vectors are sized once, for `replicas` replica losses and
/// `workers` workers, so that filling a slot with an event of those sizes allocates nothing.
/// Lock-free: the producer and the consumer each own one index.
class step_ring {
 public:
  /// `slots` is rounded up to a power of two (at least 2).
  step_ring(std::size_t slots, std::size_t replicas, std::size_t workers);
  step_ring(const step_ring&) = delete;
  step_ring& operator=(const step_ring&) = delete;

  /// Producer: copies `e` into the next free slot; false (and the step counted in dropped())
  /// when every slot still waits for the consumer.
  bool push(const step_event& e);
  /// Consumer: hands every event pushed so far to `f`, oldest first, and frees their slots.
  /// Returns how many.
  std::size_t drain(const std::function<void(const step_event&)>& f);
  /// Events waiting for the consumer.
  std::size_t size() const noexcept;
  std::size_t capacity() const noexcept { return slots_.size(); }
  /// Events the producer dropped because the ring was full.
  std::uint64_t dropped() const noexcept { return dropped_.load(std::memory_order_relaxed); }

 private:
  std::vector<step_event> slots_;
  std::size_t mask_;
  alignas(64) std::atomic<std::uint64_t> head_{0};  // next slot the producer fills
  alignas(64) std::atomic<std::uint64_t> tail_{0};  // next slot the consumer reads
  std::atomic<std::uint64_t> dropped_{0};
};

/// The stream actor and its handle. Neither push() nor publish() blocks the caller.
class metrics_stream {
 public:
  /// Called on the stream's thread with a JSON array of the events since the last push.
  using subscriber = std::function<void(const std::string& json_events)>;
  static constexpr std::size_t max_pending = 256;

  /// The stream of one run with `replicas` replicas over `workers` workers (the sizes of its
  /// events' vectors: events of other sizes still pass, by allocating); `capacity` steps of history.
  metrics_stream(caf::actor_system& system, std::size_t capacity, std::chrono::milliseconds push_interval,
                 std::size_t replicas = 0, std::size_t workers = 0);
  /// Stops the actor; no subscriber is called after this returns.
  ~metrics_stream();
  metrics_stream(const metrics_stream&) = delete;
  metrics_stream& operator=(const metrics_stream&) = delete;

  /// The step boundary's hand-over (one producer thread): copies the step into the ring, which
  /// the stream drains every push interval. Never blocks, allocates or wakes a thread; false when
  /// the ring was full and the step was dropped.
  bool push(const step_event& e);
  /// Asks the stream to drain the ring and push to its subscribers now (a pause, a stop: a change
  /// a person waits to see). One message; not for every step.
  void flush_now();
  /// Publishes steps, oldest first, as one message (for events from elsewhere than the ring's
  /// one producer).
  void publish(std::vector<step_event> events);
  /// Steps dropped because the ring was full.
  std::uint64_t dropped() const noexcept;
  /// Whether a subscriber has anyone to push to now (called on the stream's thread).
  using listening = std::function<bool()>;
  /// Adds a subscriber; returns its id. With `is_listening`, steps are turned into JSON for it
  /// only while it returns true (the dashboard with no browser open costs no JSON).
  int subscribe(subscriber s, listening is_listening = {});
  /// Removes a subscriber; once this returns it is not called again.
  void unsubscribe(int id);
  /// The history as JSON (metrics_history::to_json), or "" when the actor does not answer in time.
  std::string history_json(std::chrono::milliseconds timeout);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::actors
