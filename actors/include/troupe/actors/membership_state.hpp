#pragma once

// The rules of an elastic cluster's changes of membership, as a plain class without CAF so that
// every rule is tested alone (rendezvous_state's way). The chief holds one; its decisions travel
// to the survivors, which apply them. A change, numbered as it happens:
//   1. The watch declares a worker gone (lose): the cluster's generation is about to change.
//      Workers declared gone before the chief decides leave in the same change (two at once).
//   2. The chief decides (decide): the survivors in their old rank order become ranks 0..n-1 of
//      generation g+1, whose ring proves an incarnation of its own (generation_incarnation), so a
//      hello or frame of generation g is refused by the ring of g+1.
//   3. Every survivor rolls back to the newest commit all of them hold (common_commit), re-forms
//      the ring and reports back; once all have, the chief completes the change.
// A join is a change too: at a step boundary the chief admits the workers that asked
// (admit), every member keeps its rank and the joiners take the ranks after them, and the
// change completes once the ring of g+1 formed with them.
// A leave is a change too: at a step boundary the chief lets go the workers that asked to leave
// (leave), the others keep their rank order as generation g+1 without them, and training goes on
// from that boundary (nothing is rolled back: every worker completed the step before it).
// The change falls back to the restart path (the whole cluster ends, named, as without
// elasticity) when the chief is lost (it holds the table), when fewer than min_workers would be
// left, or when a survivor of a decided change is lost before it completed. A fallback is final:
// nothing is decided after it, so a cluster never waits on a change that cannot finish.
// Time is not read here: the caller bounds each phase.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe::actors {

/// A change of membership the chief decided: generation `generation`'s members.
struct membership_change {
  std::uint64_t generation = 0;     ///< the new generation (the start is 0)
  std::vector<int> survivors;       ///< ranks of the generation before, in their new rank order
  std::vector<std::string> tasks;   ///< the new generation's members, in rank order
  std::vector<std::string> left;    ///< who left, in the old rank order
  std::vector<std::string> joined;  ///< who joined (ranks after the survivors'), in that order
  /// The new rank of a worker of the generation before; -1 when it left.
  int new_rank(int old_rank) const;
};

/// The chief's rules of membership for an elastic cluster.
class membership_state {
 public:
  /// Where a change stands.
  enum class phase {
    stable,    ///< every member lives (as far as the watch knows)
    losing,    ///< workers were declared gone; the chief has not decided yet
    changing,  ///< decided: the survivors re-form the ring
    failed,    ///< fell back to the restart path (fallback() says why)
  };

  /// Generation 0's members in rank order (tasks[0] is the chief), and the bounds.
  /// Throws std::invalid_argument for an empty table, min_workers outside 1..tasks.size(), or a
  /// max_workers (0: the table's size) below the table's size.
  /// `generation` and `changes` start a joiner's copy where the cluster it joined stands.
  membership_state(std::vector<std::string> tasks, int min_workers, int max_workers = 0, std::uint64_t generation = 0,
                   int changes = 0);

  /// The watch declared `rank` (of the current generation) gone for `reason`. Returns whether it
  /// counts: a rank outside the table, one already lost, and anything after a fallback are
  /// ignored. Losing the chief, falling below min_workers, or losing a survivor while a decided
  /// change re-forms (phase changing) falls back.
  bool lose(int rank, const std::string& reason);
  /// The chief decides the change for every loss so far (phase losing): the next generation,
  /// its members and who left. Nothing (nullopt) in any other phase.
  std::optional<membership_change> decide();
  /// Whether `task` may join now: nullopt when it may, else why not (the cluster fell back, it is
  /// changing, it has max_workers members, or `task` is one of them).
  std::optional<std::string> check_join(const std::string& task) const;
  /// The chief admits `joiners` at a step boundary (phase stable, each passing check_join, at most
  /// max_workers in all): the next generation keeps every member in its rank order and adds the
  /// joiners after them. Nothing (nullopt) when they may not join, or there are none.
  std::optional<membership_change> admit(const std::vector<std::string>& joiners);
  /// The chief lets the workers `ranks` (of the current generation) that asked to leave go at a
  /// step boundary (phase stable): the next generation keeps the others in their rank order.
  /// A rank is refused, its reason added to `refused`, when it is the chief (it holds the
  /// membership), outside the table, named twice, or when letting it go would leave fewer than
  /// min_workers (the lower ranks are let go first). Nothing (nullopt) when nobody may leave.
  std::optional<membership_change> leave(const std::vector<int>& ranks, std::vector<std::string>& refused);
  /// Every member re-formed the ring of `generation`: it becomes the current one (stable).
  /// Returns false, changing nothing, for any other generation or phase.
  bool complete(std::uint64_t generation);
  /// The re-forming failed (a survivor did not come, the survivors hold no common commit): falls
  /// back, with `why`.
  void abort(const std::string& why);

  phase current_phase() const noexcept { return phase_; }
  /// The current generation (the last completed).
  std::uint64_t generation() const noexcept { return generation_; }
  /// The current generation's members in rank order.
  const std::vector<std::string>& tasks() const noexcept { return tasks_; }
  /// Why the cluster falls back to the restart path; empty while it does not.
  const std::string& fallback() const noexcept { return fallback_; }
  /// Changes completed so far.
  int changes() const noexcept { return changes_; }
  int min_workers() const noexcept { return min_workers_; }
  int max_workers() const noexcept { return max_workers_; }

 private:
  void fail(std::string why);
  int live_after_losses() const;
  /// The change without the ranks marked in `gone` (a loss or a leave), now pending.
  membership_change begin_change_without(const std::vector<bool>& gone);

  std::vector<std::string> tasks_;
  int min_workers_;
  int max_workers_;
  std::uint64_t generation_ = 0;
  phase phase_ = phase::stable;
  std::vector<bool> lost_;              // by rank of the current generation
  std::vector<std::string> reasons_;    // by rank: why it was declared gone
  std::optional<membership_change> pending_;
  std::string fallback_;
  int changes_ = 0;
};

/// The step every survivor rolls back to: the newest step of which every survivor holds a
/// commit (`held[w]` lists survivor w's commit steps, in any order). Survivors stand at most one
/// step apart when a worker is lost (a step completes on one only once every worker contributed
/// to it), so each keeps its last two commits and a common one exists. nullopt when there is
/// none (or no survivor): the change falls back.
std::optional<std::int64_t> common_commit(const std::vector<std::vector<std::int64_t>>& held);

/// Whether a reason the cluster watch gave for rank `task` is the chief's verdict that the worker
/// is lost (its connection closed, or it sent no heartbeat: rendezvous_state's words), rather
/// than a fault a worker reported or the stall shutdown, which no change of membership mends.
bool is_loss_verdict(const std::string& task, const std::string& reason);

/// The incarnation the ring of `generation` proves (transport::ring_auth): `incarnation` (the
/// start's, from the rendezvous) for generation 0, else 32 hex digits of
/// HMAC-SHA256(incarnation, "troupe ring generation <g>"). Every survivor derives the same
/// value; a hello made for another generation fails the ring's proof.
std::string generation_incarnation(const std::string& incarnation, std::uint64_t generation);

}  // namespace troupe::actors
