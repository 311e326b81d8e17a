#pragma once

// Elastic membership as the training loop sees it (MultiWorkerOptions::elastic): after a step
// failed because a worker was lost, change() turns the cluster into its survivors, or throws the
// named fallback (the restart path). The loop itself rolls back to the newest commit every
// survivor holds (elastic_commit.hpp) and re-splits its input. A worker joins at a step boundary
// (admit): the members commit there, the joiner receives that state from the chief over the new
// ring, and every worker re-splits its input; docs/multi-worker.md walks through both.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::distribute::detail {

/// TROUPE_JOIN=1 (with TROUPE_ELASTIC): this process joins the running elastic cluster its
/// TF_CONFIG names (the chief's address) as its task, instead of starting one. troupe-launch
/// --elastic sets it for a replacement. A value other than 0 or 1 throws, naming the variable.
bool join_from_environment();

/// One change of membership, as applied on this worker.
struct MembershipChange {
  std::uint64_t generation = 0;    ///< the ring's new generation
  std::vector<std::string> left;   ///< the workers that left
  std::vector<std::string> joined; ///< the workers that joined
  /// A leave: the workers that asked to and were refused, each with why (they stay).
  std::vector<std::string> refused;
  int workers = 0;                 ///< the workers that continue
  int rank = 0;                    ///< this worker's rank among them; -1: this worker left
  /// Each ring rank's id in the chief's cluster watch after the change (the dashboard's ids).
  std::vector<int> watch_ids;
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

  // Joining (the chief admits at a step boundary every worker agreed on):
  /// The chief's: workers waiting to join (0 on the others).
  virtual int joiners_waiting() const = 0;
  /// At a step boundary every worker reached (a collective): the chief admits the workers waiting
  /// (refusing, named, those with no room under max_workers or a member's task), every worker
  /// learns the new table from it over the ring, and the ring re-forms with the joiners after
  /// the members. `joined` is empty when the chief admitted nobody (nothing changed). Throws
  /// CollectiveAborted naming why when the ring of the new generation does not form (a joiner
  /// died on the way: the restart path).
  virtual MembershipChange admit() = 0;
  // Leaving (a worker asked to leave: SIGUSR2, which troupe-launch's host discovery sends):
  /// Whether this worker was asked to leave and has not left (nor been refused) yet.
  virtual bool leave_requested() const = 0;
  /// At a step boundary every worker reached, whose table says that the workers `ranks` ask to
  /// leave: the chief lets them go (refusing, named in `refused`, itself and any that would leave
  /// fewer than min_workers), every worker learns its decision over the ring, the workers let go
  /// leave (rank -1 in the change: no more collectives, and the chief's watch hears their
  /// goodbye, so that their exit is no loss) and the others re-form the ring without them, in
  /// their rank order. `left` is empty when nobody left. A refused worker stops asking. Throws
  /// CollectiveAborted naming why when the ring of the new generation does not form.
  virtual MembershipChange leave(const std::vector<int>& ranks) = 0;
  /// The chief's, when its Model::fit ends: refuses every worker still waiting to join with
  /// `why`, so that none waits out its start timeout.
  virtual void refuse_waiting(const std::string& why) = 0;
  /// Whether this worker joined a running cluster and has not received its state yet.
  virtual bool joining() const = 0;
  /// This worker is about to receive the cluster's state (its collectives are real from now).
  virtual void end_joining() = 0;
};

}  // namespace troupe::distribute::detail
