#pragma once

// The stall inspector: every worker's heartbeat carries its position (the step, the collective it
// waits in and since when, the ring neighbour it waits on and how long the ring moved no byte),
// and the chief's agent asks this inspector, at every check, whether some worker has waited in a
// cross-worker collective for longer than the warning bound. When one has, the inspector writes
// one line that names the collective, the workers waiting in it, and every other worker with
// where it is and how old its last heartbeat is:
//
//   stall: step 812 all_reduce #3 (float32, 1.0 MiB): workers 0, 2, 3 waiting 61 s; worker 1 is in
//   step 811 compute since 63 s (last heartbeat 0.4 s ago)
//
// A worker whose heartbeats stopped is named with where its last one had it and how old that is
// ("worker 1 is silent: its last heartbeat, 2.6 s ago, had it in step 43 compute"); and when every
// worker waits in the same collective, the ring link that made no progress (a
// relay that stopped forwarding): the one whose sender counts more bytes sent than its receiver
// received, else the one idle longest. Workers are named by their ids in the chief's table, which
// a change of members never renumbers, with their rank in the ring beside when a change made the
// two differ ("the ring link from worker 2 (ring rank 1) to worker 3 (ring rank 2)"). The line is repeated at a back-off (the warning bound, then
// twice as long each time, at most 10 minutes apart), cleared once no worker waits too long, and,
// past the shutdown bound (off unless set), handed to the agent to end the cluster with.
// Plain classes without CAF: time is passed in, so tests decide it.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace troupe::actors {

/// Where a worker is: between steps (input), inside a step (compute), or waiting in a
/// cross-worker collective.
enum class worker_phase : std::uint8_t { none, input, compute, collective };

/// "none", "input", "compute", "collective".
const char* to_string(worker_phase p) noexcept;

/// The cross-worker collectives a position names (the flight recorder's names).
enum class position_op : std::uint8_t { none, all_reduce, broadcast, all_gather };

/// "", "all_reduce", "broadcast", "all_gather".
const char* to_string(position_op op) noexcept;

/// The bounds of a position from the network; one beyond them is refused whole.
struct worker_position_limits {
  static constexpr std::uint64_t max_step = std::uint64_t{1} << 62;
  static constexpr std::int64_t max_collective = std::int64_t{1} << 40;
  static constexpr std::uint64_t max_bytes = std::uint64_t{1} << 50;
  static constexpr std::int64_t max_ms = std::int64_t{1} << 40;  ///< about 35 years
  static constexpr std::int32_t dtypes = 6;  ///< base::scalar_type's codes 0..5
};

/// A worker's position, as its heartbeat carries it.
struct worker_position {
  worker_phase phase = worker_phase::none;
  std::uint64_t step = 0;         ///< the step (Strategy::run calls, from 1); 0 before the first
  std::int64_t collective = -1;   ///< in phase collective: its number within the step
  position_op op = position_op::none;
  std::int32_t dtype = -1;        ///< base::scalar_type's code, -1 none
  std::uint64_t bytes = 0;        ///< this worker's bytes in the collective
  std::int64_t phase_ms = 0;      ///< how long it had been in this phase when the beat left
  std::int32_t ring_peer = -1;    ///< in a collective: the ring neighbour whose bytes it waits for
  std::int64_t ring_idle_ms = -1; ///< in a collective: how long the ring moved no byte (-1 unknown)
  /// Bytes this worker sent to its successor in the ring, and received from its predecessor, since
  /// the ring began (both ends of a link count the same stream: a sender ahead of its receiver
  /// while nothing moves lost bytes on the way).
  std::uint64_t ring_sent = 0;
  std::uint64_t ring_received = 0;
};

/// Why a position from the network is refused (the field, its value, what was expected), or
/// nothing when every field is within worker_position_limits and `world` (the ring peer a rank).
std::optional<std::string> check_worker_position(const worker_position& p, int world);

/// What the ring tells a position: the neighbour waited on and when the ring last moved a byte.
struct ring_progress {
  int peer = -1;
  std::chrono::steady_clock::time_point last{};  ///< epoch: unknown
  std::uint64_t sent = 0;      ///< to the successor, since the ring began
  std::uint64_t received = 0;  ///< from the predecessor, since the ring began
};

/// A worker's own position, written by its training thread at every step and cross-worker
/// collective (relaxed atomic stores: no lock, no allocation on the step's path) and read by its
/// heartbeat. Thread-safe.
class position_board {
 public:
  using clock = std::chrono::steady_clock;
  /// Step `step` begins (compute).
  void begin_step(std::uint64_t step) noexcept;
  /// The step ended: the training loop's own work (input) until the next.
  void end_step() noexcept;
  /// A cross-worker collective begins.
  void begin_collective(std::uint64_t step, std::int64_t collective, position_op op, int dtype,
                        std::uint64_t bytes) noexcept;
  /// It ended: back to compute.
  void end_collective() noexcept;
  /// Where the ring's progress is read from while a collective waits (null: nowhere). Set once the
  /// ring exists; the heartbeat calls it.
  void set_ring_probe(std::function<ring_progress()> probe);
  /// The position as of `now`.
  worker_position read(clock::time_point now) const;

 private:
  std::atomic<std::uint8_t> phase_{0};
  std::atomic<std::uint64_t> step_{0};
  std::atomic<std::int64_t> collective_{-1};
  std::atomic<std::uint8_t> op_{0};
  std::atomic<std::int32_t> dtype_{-1};
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<std::int64_t> since_ns_{0};  // steady clock
  mutable std::mutex probe_mutex_;
  std::function<ring_progress()> probe_;
};

/// The longest wait between two repeats of a stall line (the back-off doubles up to it), in both
/// halves of the inspector: this one and the parameter-server cluster's closure_watch.
constexpr std::chrono::milliseconds stall_max_backoff{600000};

/// A duration as the stall lines write it: "61 s".
inline std::string whole_seconds(std::chrono::milliseconds d) { return std::to_string(d.count() / 1000) + " s"; }

/// The inspector's settings.
struct stall_options {
  /// A worker waiting in a collective longer than this is a stall (TROUPE_STALL_WARNING_S).
  std::chrono::milliseconds warning{60000};
  /// Past this the cluster is ended with the line (0: never; TROUPE_STALL_SHUTDOWN_S).
  std::chrono::milliseconds shutdown{0};
  /// A waiting worker whose last heartbeat is older than this is named with its heartbeat's age
  /// (two heartbeat intervals: it is stopped or cut off itself).
  std::chrono::milliseconds late_after{1000};
};

/// What one check found.
struct stall_verdict {
  bool stalled = false;   ///< some worker waits longer than the warning
  bool print = false;     ///< the line is due now (first time, or the back-off passed)
  bool cleared = false;   ///< the stall the last printed line named is over (line says so)
  bool shutdown = false;  ///< past the shutdown bound: end the cluster with `line` (once)
  std::string line;
};

/// The chief's inspector over `world` workers. Thread-safe.
class stall_inspector {
 public:
  using clock = std::chrono::steady_clock;
  stall_inspector(int world, stall_options options);
  /// A beat from `rank` at `now` carried `p` (already checked).
  void position(int rank, const worker_position& p, clock::time_point now);
  /// An elastic cluster admitted a worker: watched from now on under the next id.
  void add_worker();
  /// An elastic cluster went on without `rank`: left out of every line from now on (the ring's
  /// links are between the ranks still in).
  void drop(int rank);
  /// The check at `now`.
  stall_verdict check(clock::time_point now);
  /// The current stall's line, or empty (for the dashboard).
  std::string current() const;
  const stall_options& options() const noexcept { return options_; }

 private:
  struct seen {
    bool known = false;
    bool gone = false;  // dropped from an elastic cluster
    worker_position p;
    clock::time_point at{};
  };
  std::string describe(clock::time_point now, std::chrono::milliseconds& longest) const;

  mutable std::mutex mutex_;
  stall_options options_;
  std::vector<seen> workers_;
  bool printed_ = false;  // a line was printed for the stall now on
  bool shut_ = false;
  clock::time_point next_print_{};
  std::chrono::milliseconds backoff_{0};
  std::string current_;
  std::string last_key_;  // the collective the printed line named
};

/// "400 B", "4.0 KiB", "1.0 MiB", "2.5 GiB".
std::string human_bytes(std::uint64_t bytes);

}  // namespace troupe::actors
