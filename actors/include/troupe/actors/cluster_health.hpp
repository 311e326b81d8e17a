#pragma once

// What the chief's control plane knows about the health of its cluster, for the dashboard: every
// worker's last heartbeat as the chief's agent received it, its state, the report its heartbeat
// carried (its CPU, memory and last log lines), and the last events (a worker late, back, lost; a
// fault reported; a connection refused; a collective that failed), each with the step the chief's
// training was at.
// The cluster agent, the control gate and the worker group write into it from their own threads;
// the dashboard reads snapshots. A plain class without CAF: time is passed in, so tests decide it.
// Memory is bounded: one entry per worker (its report within worker_report_limits), and a ring of
// the last `capacity` events, each text cut at max_text_bytes.

#include <chrono>
#include <cstddef>
#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/worker_report.hpp"

namespace troupe::actors {

/// A worker's liveness as the chief sees it.
enum class worker_state : std::uint8_t {
  alive,  ///< beat within the last late_after_intervals intervals (or the watch just began)
  late,   ///< silent for longer than that, not yet declared gone
  lost,   ///< declared gone (silent too long, or its connection closed)
  left,   ///< said goodbye: it finished cleanly
};

/// "alive", "late", "lost", "left".
const char* to_string(worker_state s) noexcept;

/// What happened.
enum class cluster_event_kind : std::uint8_t {
  worker_late,         ///< a worker went silent for more than late_after_intervals intervals
  worker_back,         ///< a late or lost worker beat again
  worker_lost,         ///< the chief declared a worker gone (text: why)
  fault_reported,      ///< a worker reported a fault of the cluster's (text: the report)
  connection_refused,  ///< the control plane refused a peer (address, text: why)
  collective_error,    ///< a cross-worker collective failed on the chief (text: the error)
  stall,               ///< the stall inspector's line (text), printed on the chief's log too
  stall_cleared,       ///< the stall it named is over (text: which collective)
  membership_changed,  ///< an elastic cluster changed its members (text: who left or joined, the step, the pause)
  worker_joined,       ///< the chief admitted a worker into a running elastic cluster (text: its task)
};

/// "worker_late", "worker_back", "worker_lost", "fault_reported", "connection_refused",
/// "collective_error", "stall", "stall_cleared", "membership_changed", "worker_joined".
const char* to_string(cluster_event_kind k) noexcept;

/// One event of the cluster.
struct cluster_event {
  std::uint64_t sequence = 0;  ///< 1 for the first event recorded, then counting up
  std::chrono::steady_clock::time_point at{};
  std::chrono::system_clock::time_point wall{};  ///< the same moment, on the wall clock
  cluster_event_kind kind = cluster_event_kind::worker_lost;
  int rank = -1;        ///< the worker it concerns, or -1 (a refused stranger, a collective)
  std::string address;  ///< a refused peer's address ("127.0.0.1:40312"), else empty
  std::string text;     ///< what happened, at most max_text_bytes
  /// The step the chief's training was at when the chief recorded it (cluster_health::set_step:
  /// its monitor's last step boundary), or -1 before the first.
  std::int64_t step = -1;
};

/// One worker, as the chief sees it.
struct worker_health {
  int rank = 0;
  std::string task;    ///< "/job:worker/task:1"
  worker_state state = worker_state::alive;
  bool heard = false;  ///< a heartbeat arrived since the watch began
  /// The last heartbeat (the watch's start until one arrives).
  std::chrono::steady_clock::time_point last_beat{};
  /// What its heartbeats reported: CPU and memory as of the last one (-1 unknown, and before the
  /// first), and the last lines it sent with their running total.
  worker_report report;
  bool reported = false;  ///< a report was taken since the watch began
};

/// One change of an elastic cluster's members, as its chief made it.
struct membership_record {
  std::vector<std::string> left;    ///< the tasks that left (lost, or asked to leave), in ring order
  std::vector<std::string> joined;  ///< the tasks admitted, in ring order
  std::int64_t step = -1;           ///< the step training continues from
  std::int64_t paused_ms = 0;       ///< from the failure (or the step boundary) to training again
  int workers = 0;                  ///< the workers that continue
  std::uint64_t generation = 0;     ///< the ring's new generation
  std::uint64_t state_bytes = 0;    ///< the state broadcast to the joiners (0: none joined)
  /// Those in `left` asked to leave and left at the step boundary `step` (nothing rolled back);
  /// false: they were lost, and training rolled back to `step`.
  bool leave = false;
  /// Each ring rank's worker id after the change (the ids of cluster_snapshot::workers).
  std::vector<int> ring;
  std::chrono::system_clock::time_point wall{};  ///< when the chief recorded it
};

/// Everything at one moment.
struct cluster_snapshot {
  bool watching = false;                ///< the watch has begun (the rendezvous completed)
  std::chrono::milliseconds interval{0};  ///< the heartbeat interval
  int late_after_intervals = 2;
  std::string incarnation;              ///< this start of the cluster (the chief's 32 hex digits)
  int restart_count = 0;                ///< starts of the cluster before this one
  /// By id: the workers of the start in rank order, then each admitted joiner under the id the
  /// chief gave it. A lost one stays, marked lost.
  std::vector<worker_health> workers;
  /// Each ring rank's id in `workers` now (empty: no change yet, ring rank r is id r).
  std::vector<int> ring;
  std::vector<membership_record> changes;  ///< oldest first, at most the capacity
  std::vector<cluster_event> events;    ///< newest first, at most the capacity
  std::uint64_t events_total = 0;       ///< recorded since the start, the dropped ones included
  std::string stall;                    ///< the stall inspector's line while a stall lasts, else empty
};

/// The chief's record of its cluster's health. Every member function is thread-safe.
class cluster_health {
 public:
  using clock = std::chrono::steady_clock;
  static constexpr std::size_t default_capacity = 64;
  static constexpr std::size_t max_text_bytes = 512;

  /// Keeps the last `capacity` events (at least 1).
  explicit cluster_health(std::size_t capacity = default_capacity);

  /// The watch begins at `now`: `tasks` in rank order, each expected to beat every `interval`; a
  /// worker silent for more than `late_after_intervals` intervals is late.
  void start(std::vector<std::string> tasks, std::chrono::milliseconds interval, int late_after_intervals,
             std::string incarnation, clock::time_point now);
  /// How many times the cluster was started again before this start (troupe-launch's count).
  void set_restart_count(int restarts);
  /// A heartbeat from `rank`: alive again (a late or lost worker's comeback is an event).
  /// Ignored before start() and for a rank outside the cluster.
  void beat(int rank, clock::time_point now);
  /// The report beside a heartbeat of `rank`: recorded (its lines only when it has some) unless
  /// check_worker_report refuses it, when nothing changes and the reason is returned. Ignored
  /// before start() and for a rank outside the cluster.
  std::optional<std::string> report(int rank, const worker_report& report);
  /// The step the chief's training is at now (its monitor's step boundary): every event recorded
  /// from now on carries it. Lock-free: called at every step.
  void set_step(std::int64_t step) noexcept { step_.store(step, std::memory_order_relaxed); }
  /// `rank` was declared gone, for `reason`.
  void lost(int rank, const std::string& reason, clock::time_point now);
  /// `rank` said goodbye.
  void left(int rank);
  /// `rank` reported a fault of the cluster's.
  void fault(int rank, const std::string& what, clock::time_point now);
  /// The control plane refused the peer at `address`, for `reason`.
  void refused(const std::string& address, const std::string& reason, clock::time_point now);
  /// A cross-worker collective failed with `what`.
  void collective_error(const std::string& what, clock::time_point now);
  /// An elastic cluster changed its membership: `what` says who left, at which step, and how long
  /// training paused.
  void membership_changed(const std::string& what, clock::time_point now);
  /// The same, with the change itself: kept (the last capacity ones) and its ring made current.
  void membership_changed(membership_record change, const std::string& what, clock::time_point now);
  /// The chief admitted `task` into the running cluster as worker `id` (ids count on from the
  /// start's ranks): watched from `now` like the others. Ignored before start() and for an id
  /// already known.
  void add_worker(int id, std::string task, clock::time_point now);
  /// The stall inspector's line, now (empty: no stall); `event` also records it as an event
  /// (a stall line printed, or a clearing when `line` starts with "stall cleared").
  void stall(const std::string& line, bool event, clock::time_point now);
  /// Marks the workers silent for too long late (an event each), as of `now`.
  void observe(clock::time_point now);
  /// observe(now), then everything, events newest first.
  cluster_snapshot snapshot(clock::time_point now);

 private:
  void record(cluster_event_kind kind, int rank, std::string address, const std::string& text, clock::time_point now);
  bool known(int rank) const noexcept { return rank >= 0 && static_cast<std::size_t>(rank) < workers_.size(); }
  void observe_locked(clock::time_point now);

  mutable std::mutex mutex_;
  std::size_t capacity_;
  bool watching_ = false;
  std::chrono::milliseconds interval_{0};
  int late_after_ = 2;
  std::string incarnation_;
  int restart_count_ = 0;
  std::vector<worker_health> workers_;
  std::vector<int> ring_;
  std::deque<membership_record> changes_;  // oldest first
  std::deque<cluster_event> events_;  // oldest first
  std::uint64_t total_ = 0;
  std::string stall_;
  std::atomic<std::int64_t> step_{-1};
};

}  // namespace troupe::actors
