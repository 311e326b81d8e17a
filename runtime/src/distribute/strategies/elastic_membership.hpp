#pragma once

// Elastic membership as the training loop sees it (MultiWorkerOptions::elastic): after a step
// failed because a worker was lost, change() turns the cluster into its survivors, or throws the
// named fallback (the restart path). The loop itself rolls back to the newest commit every
// survivor holds (elastic_commit.hpp) and re-splits its input; docs/multi-worker.md walks through
// it.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::distribute::detail {

/// One change of membership, as applied on this worker.
struct MembershipChange {
  std::uint64_t generation = 0;    ///< the ring's new generation
  std::vector<std::string> left;   ///< the workers that left
  int workers = 0;                 ///< the workers that continue
  int rank = 0;                    ///< this worker's rank among them
  std::chrono::milliseconds waited{0};  ///< from the failure to the re-formed ring
};

/// A strategy's elastic membership (MultiWorkerMirroredStrategy under MultiWorkerOptions::elastic).
class ElasticMembership {
 public:
  virtual ~ElasticMembership() = default;
  /// Commit the training state at every this many step boundaries.
  virtual int commit_every_steps() const = 0;
  /// After a step failed with `failure`: waits (bounded) for the cluster watch to name the lost
  /// worker, applies the membership rules (actors::membership_state) and re-forms the ring
  /// without it. Throws CollectiveAborted naming why when the cluster cannot continue: the
  /// watch named nobody (the failure was not a lost worker), the chief was lost, fewer than
  /// min_workers would be left, or the new ring did not form (a second loss during the change).
  virtual MembershipChange change(const std::string& failure) = 0;
  /// Changes completed so far.
  virtual int changes() const = 0;
};

}  // namespace troupe::distribute::detail
