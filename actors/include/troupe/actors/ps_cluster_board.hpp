#pragma once

// What the chief of a parameter-server cluster knows of it, for the dashboard: the closure queue
// (queued, in flight, done, per second), each worker's state and throughput, each ps task's bytes
// and update rate as its last report said them, and the last events (a worker lost or back, the
// closures retried or cancelled with it, a closure that failed, a stall, a ps task lost), each
// with the step the chief's training was at.
//
// The chief's dispatch actor writes into it from its own thread; the dashboard reads snapshots.
// A plain class without CAF: time is passed in, so tests decide it. Memory is bounded: one entry
// per task, a few rate buckets each (one per sample_every within rate_window), and a ring
// of the last `capacity` events, each text cut at max_text_bytes.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace troupe::actors {

/// A worker of a parameter-server cluster as the chief sees it.
enum class ps_worker_state : std::uint8_t {
  connecting,  ///< not reached yet
  idle,        ///< reachable, no closure of it in flight
  running,     ///< reachable, running closures
  set_aside,   ///< a closure ran past the stall shutdown bound on it: it takes none until that one returns
  lost,        ///< its connection closed or it stopped answering heartbeats; taken back when it answers
};

/// "connecting", "idle", "running", "set_aside", "lost".
const char* to_string(ps_worker_state s) noexcept;

/// What happened in the cluster.
enum class ps_event_kind : std::uint8_t {
  worker_lost,         ///< text: why
  worker_back,         ///< a lost or set-aside worker takes closures again
  closures_retried,    ///< count: closures in flight on a lost worker, queued again (at-least-once)
  closures_cancelled,  ///< count: closures cancelled after another failed (never run)
  closure_failed,      ///< text: the function's error
  stall,               ///< text: the stall line (a closure running long, or given up on its worker)
  ps_lost,             ///< text: why
  ps_back,             ///< a lost ps task was reached again (restarted), its shards to be restored
};

/// "worker_lost", "worker_back", "closures_retried", "closures_cancelled", "closure_failed",
/// "stall", "ps_lost", "ps_back".
const char* to_string(ps_event_kind k) noexcept;

/// One event.
struct ps_event {
  std::uint64_t sequence = 0;  ///< 1 for the first recorded, then counting up
  std::chrono::steady_clock::time_point at{};
  std::chrono::system_clock::time_point wall{};  ///< the same moment, on the wall clock
  ps_event_kind kind = ps_event_kind::worker_lost;
  int worker = -1;          ///< the worker it concerns, or -1
  int ps = -1;              ///< the ps task it concerns, or -1
  std::uint64_t count = 0;  ///< closures, for closures_retried and closures_cancelled
  std::string text;
  std::int64_t step = -1;   ///< the chief's step when recorded (set_step), or -1 before the first
};

/// What a ps task says of itself (its answer to the chief's request at each heartbeat).
struct ps_task_counters {
  std::int64_t shards = 0;
  std::int64_t bytes_held = 0;  ///< its shards' elements and optimizer slots
  std::uint64_t updates = 0;    ///< updates applied (optimizer, assign, add, scatter), since it started
  std::uint64_t bytes_in = 0;   ///< bytes of updates received
  std::uint64_t bytes_out = 0;  ///< bytes of reads sent
};

/// One worker, at one moment.
struct ps_worker_view {
  int index = 0;
  std::string task;
  ps_worker_state state = ps_worker_state::connecting;
  std::uint64_t done = 0;    ///< closures it completed (with a value or the function's error)
  std::uint64_t failed = 0;  ///< of those, the ones whose function raised
  std::size_t in_flight = 0;
  double closures_per_s = 0;  ///< over the last rate_window
  std::uint64_t samples = 0;  ///< training examples of its closures, as the chief's fit counted them
  double samples_per_s = 0;   ///< over the last rate_window (0 when no fit counts them)
  /// Milliseconds since its last result, or -1 before the first.
  double last_result_age_ms = -1;
  std::uint64_t times_lost = 0;
};

/// One ps task, at one moment.
struct ps_task_view {
  int index = 0;
  std::string task;
  bool lost = false;
  bool reported = false;  ///< a report arrived
  ps_task_counters counters;
  double updates_per_s = 0;  ///< over the last rate_window
  double bytes_in_per_s = 0;
  double bytes_out_per_s = 0;
  double report_age_ms = -1;  ///< since its last report, or -1 before the first
};

/// Everything at one moment.
struct ps_cluster_view {
  std::vector<ps_worker_view> workers;
  std::vector<ps_task_view> ps;
  std::size_t queued = 0;     ///< closures waiting for a worker
  std::size_t in_flight = 0;  ///< closures handed to workers, not answered yet
  std::uint64_t scheduled = 0;
  std::uint64_t done = 0;
  std::uint64_t failed = 0;
  std::uint64_t retried = 0;
  std::uint64_t cancelled = 0;
  std::uint64_t workers_lost = 0;
  double closures_per_s = 0;  ///< all workers, over the last rate_window
  std::vector<ps_event> events;  ///< newest first
  std::uint64_t events_total = 0;
};

/// The chief's record of a parameter-server cluster. Every member function is thread-safe.
class ps_cluster_board {
 public:
  using clock = std::chrono::steady_clock;
  static constexpr std::size_t default_capacity = 64;
  static constexpr std::size_t max_text_bytes = 512;
  /// Rates are measured over this much of the recent past...
  static constexpr std::chrono::milliseconds rate_window{5000};
  /// ...in buckets of this width.
  static constexpr std::chrono::milliseconds sample_every{250};

  /// The workers' and ps tasks' names in index order; keeps the last `capacity` events (at least 1).
  ps_cluster_board(std::vector<std::string> workers, std::vector<std::string> ps,
                   std::size_t capacity = default_capacity);

  /// The step the chief's training is at now: events recorded from now on carry it. Lock-free.
  void set_step(std::int64_t step) noexcept { step_.store(step, std::memory_order_relaxed); }

  /// A closure was scheduled.
  void scheduled(clock::time_point now);
  /// The queue as the dispatcher's rules hold it now: queued, and in flight per worker.
  void set_queue(std::size_t queued, const std::vector<std::size_t>& in_flight);
  /// Worker `w` was reached, or answers again: a worker lost or set aside before is back (an event).
  void worker_up(int w, clock::time_point now);
  /// Worker `w` is lost for `reason`; `retried` of its closures in flight were queued again (an
  /// event of their own when there were any).
  void worker_lost(int w, const std::string& reason, std::uint64_t retried, clock::time_point now);
  /// Worker `w` is set aside past the stall shutdown bound (`line` says which closure);
  /// `retried` closures queued again.
  void worker_set_aside(int w, const std::string& line, std::uint64_t retried, clock::time_point now);
  /// Worker `w` answered a closure (`error` empty: with a value).
  void closure_done(int w, const std::string& error, clock::time_point now);
  /// The chief's fit took a result of worker `w` holding `samples` training examples.
  void samples_done(int w, std::uint64_t samples, clock::time_point now);
  /// `n` closures were cancelled (never run).
  void closures_cancelled(std::uint64_t n, clock::time_point now);
  /// The stall inspector's line.
  void stall(const std::string& line, clock::time_point now);
  /// Ps task `p` reported its counters.
  void ps_report(int p, const ps_task_counters& counters, clock::time_point now);
  /// Ps task `p` is lost for `reason` (the training cannot go on without it).
  void ps_lost(int p, const std::string& reason, clock::time_point now);
  /// Ps task p was reached again after a loss (restarted): it shows as up again (an event). Its
  /// counters start again from 0: the rates take a count that went down as a restart.
  void ps_back(int p, clock::time_point now);

  /// Everything as of `now`, events newest first.
  ps_cluster_view snapshot(clock::time_point now);

 private:
  // A cumulative count's increments in buckets of sample_every, those of the last rate_window
  // kept: the rate is their sum over the window (or over the time since the first sample, when
  // that is shorter).
  struct rate_samples {
    bool started = false;
    clock::time_point first{};
    double last = 0;
    std::deque<std::pair<clock::time_point, double>> buckets;  // start, increments within it
    void add(clock::time_point now, double value);
    double per_second(clock::time_point now) const;
  };
  struct worker_entry {
    std::string task;
    ps_worker_state state = ps_worker_state::connecting;
    bool reached = false;
    std::uint64_t done = 0;
    std::uint64_t failed = 0;
    std::size_t in_flight = 0;
    bool has_result = false;
    clock::time_point last_result{};
    std::uint64_t times_lost = 0;
    std::uint64_t samples = 0;
    rate_samples rate;
    rate_samples sample_rate;
  };
  struct ps_entry {
    std::string task;
    bool lost = false;
    bool reported = false;
    ps_task_counters counters;
    clock::time_point last_report{};
    rate_samples updates, bytes_in, bytes_out;
  };

  bool known_worker(int w) const noexcept { return w >= 0 && static_cast<std::size_t>(w) < workers_.size(); }
  void record(ps_event_kind kind, int worker, int ps, std::uint64_t count, const std::string& text,
              clock::time_point now);
  void sample_locked(clock::time_point now);

  mutable std::mutex mutex_;
  std::size_t capacity_;
  std::vector<worker_entry> workers_;
  std::vector<ps_entry> ps_;
  std::size_t queued_ = 0;
  std::uint64_t scheduled_ = 0, done_ = 0, failed_ = 0, retried_ = 0, cancelled_ = 0, workers_lost_ = 0;
  rate_samples done_rate_;
  std::deque<ps_event> events_;  // oldest first
  std::uint64_t total_ = 0;
  std::atomic<std::int64_t> step_{-1};
};

}  // namespace troupe::actors
