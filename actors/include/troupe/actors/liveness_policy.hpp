#pragma once

// When a peer of a cluster counts as gone: one policy for both cluster stacks (the rendezvous'
// watch of MultiWorkerMirroredStrategy and the cluster tasks of ParameterServerStrategy) and the
// dashboard's cluster panel. A plain value without CAF: time is passed in, never read.

#include <chrono>
#include <optional>
#include <string>

namespace troupe::actors {

/// How often peers beat and how many beats one may miss before it is gone, with the one range
/// each setting has, and the rule that forgives a process that was itself not running.
struct liveness_policy {
  using clock = std::chrono::steady_clock;

  static constexpr std::chrono::milliseconds default_interval{500};
  static constexpr int default_missed = 6;
  static constexpr std::chrono::milliseconds min_interval{10};
  static constexpr std::chrono::milliseconds max_interval{600'000};
  static constexpr int min_missed = 1;
  static constexpr int max_missed = 1000;
  /// A peer silent for more than this many intervals shows as late on the dashboard (it is gone
  /// only after `missed`).
  static constexpr int late_after_intervals = 2;

  /// How often every peer beats (or is asked to).
  std::chrono::milliseconds interval = default_interval;
  /// How many intervals a peer may stay silent before it is gone.
  int missed = default_missed;

  /// What is wrong with the settings, as `owner` names them: "<owner>: heartbeat_interval is 5 ms
  /// (expected 10..600000)" or "<owner>: missed_heartbeats is 0 (expected 1..1000)"; nothing
  /// when both are in range.
  std::optional<std::string> problem(const std::string& owner) const;
  /// Throws std::invalid_argument with problem()'s text when there is one.
  void check(const std::string& owner) const;

  /// How long a peer may stay silent: interval * missed.
  std::chrono::milliseconds limit() const noexcept { return interval * missed; }
  /// Whether a peer last heard at `last` has been silent too long at `now` (more than the limit).
  bool silent_too_long(clock::time_point last, clock::time_point now) const noexcept { return now - last > limit(); }
  /// The forgiveness rule. Silence is checked every interval; when the previous check was more than
  /// two intervals before `now`, this process itself was not running (stopped, or starved of CPU),
  /// so no peer's silence meanwhile counts: every peer starts a fresh limit from `now`.
  bool paused(clock::time_point previous_check, clock::time_point now) const noexcept {
    return now - previous_check > 2 * interval;
  }

  friend bool operator==(const liveness_policy& a, const liveness_policy& b) noexcept {
    return a.interval == b.interval && a.missed == b.missed;
  }
  friend bool operator!=(const liveness_policy& a, const liveness_policy& b) noexcept { return !(a == b); }
};

}  // namespace troupe::actors
