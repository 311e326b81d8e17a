#pragma once

// The liveness rules of a cluster of tasks (cluster_tasks.hpp, step 5b), apart from CAF.

#include <chrono>
#include <optional>
#include <vector>

#include "troupe/actors/liveness_policy.hpp"

namespace troupe::actors {

/// The liveness rules of a cluster of tasks, apart from CAF: peers beat (answer a heartbeat, or
/// send one) and a peer watched but silent for more than the policy's limit is overdue, unless
/// this process itself was not running meanwhile (the policy's forgiveness rule). The chief keeps
/// one for its workers and one for its ps tasks; a task keeps one for its chief.
class heartbeat_state {
 public:
  using clock = std::chrono::steady_clock;
  /// `peers` peers, none watched; throws std::invalid_argument for peers < 0 or a policy out of
  /// its ranges.
  heartbeat_state(int peers, liveness_policy policy);

  /// Peer `p` is watched from `now` on (a beat at `now`); it is not overdue.
  void watch(int p, clock::time_point now);
  /// Peer `p` is no longer watched (its connection closed, or the chief is done).
  void forget(int p);
  /// Peer `p` answered at `now`. Returns true when it had been overdue: it is back (and watched
  /// again). A peer not watched changes nothing and returns false.
  bool beat(int p, clock::time_point now);
  /// The watched peers silent for more than the limit at `now` that were not overdue yet; each is
  /// marked overdue (reported once until it beats again). Called every interval; when the previous
  /// call is itself more than two intervals ago (liveness_policy::paused), nobody is blamed, and
  /// every watched peer is given a fresh limit from now.
  std::vector<int> overdue(clock::time_point now);

  bool watched(int p) const { return watched_.at(static_cast<std::size_t>(p)); }
  bool is_overdue(int p) const { return overdue_.at(static_cast<std::size_t>(p)); }
  int peers() const noexcept { return static_cast<int>(watched_.size()); }
  const liveness_policy& policy() const noexcept { return policy_; }
  std::chrono::milliseconds interval() const noexcept { return policy_.interval; }
  int missed() const noexcept { return policy_.missed; }
  /// How long a peer may be silent: interval * missed.
  std::chrono::milliseconds limit() const noexcept { return policy_.limit(); }

 private:
  liveness_policy policy_;
  std::vector<bool> watched_;
  std::vector<bool> overdue_;
  std::vector<clock::time_point> last_;
  std::optional<clock::time_point> checked_;  // the previous call of overdue
};

}  // namespace troupe::actors
