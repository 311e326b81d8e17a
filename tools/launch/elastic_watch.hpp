#pragma once
// --elastic: the launcher's side of elastic membership.
//   1. A worker that died of a signal (killed, crashed), other than rank 0, is dropped while at
//      least --min workers still run: the others go on without it (goes_on).
//   2. With --max-restarts N, each such loss starts a replacement in its place, up to N in all,
//      which joins the running cluster (TROUPE_JOIN=1, the same TF_CONFIG) (replacement_env).
//      A replacement that fails after the chief finished the training came too late to join
//      (the chief's fit ended before a step boundary could admit it, or its chief was gone): it
//      is said and is no failure of the run (late), as for a worker host discovery added.
//   3. A worker stopped (SIGSTOP, SIGTSTP...) keeps its connections open, so no exit ever tells of
//      it: the launcher hears of stops and continues (note_stop), and kills one stopped past the
//      heartbeat limit (check_stalls), which makes it a lost worker like any killed one.

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "launch/launch_options.hpp"
#include "launch/worker_process.hpp"

namespace troupe::launch {

/// The elastic rules of one launch; the supervisor asks them at each exit, stop and timer.
class elastic_watch {
 public:
  using say_fn = std::function<void(const std::string&)>;

  /// `options` must outlive the watch.
  explicit elastic_watch(const launch_options& options) : options_(options) {}

  /// Whether `w` (a running worker that has not exited) is stopped or was continued since:
  /// updates w.stopped_since.
  static void note_stop(worker& w);

  /// How long a worker may stay stopped before it counts as lost. The chief declares a silent
  /// worker gone after TROUPE_MISSED_HEARTBEATS intervals of TROUPE_HEARTBEAT_MS (the workers'
  /// own settings, from this environment; their defaults when unset or unreadable, which the
  /// workers refuse themselves), and the others go on without it; the launcher then ends it, so
  /// that it cannot hold the launch until --timeout, with one interval more.
  static clock::duration stall_limit();

  /// Kills (SIGKILL, its whole group) every running worker stopped past stall_limit(), saying so.
  void check_stalls(std::vector<worker>& workers, clock::time_point now, const say_fn& say) const;

  /// The earliest time check_stalls acts; nullopt when no worker is stopped (or not --elastic).
  std::optional<clock::time_point> next_stall_check(const std::vector<worker>& workers) const;

  /// Whether the cluster goes on without `w`, which ended `how` with wait status `status` while
  /// `running` workers still run (the launcher says so when it does).
  bool goes_on(const worker& w, int status, const std::string& how, int running, const say_fn& say) const;

  /// With --max-restarts left: the environment of a replacement for `w` (`base` plus TROUPE_JOIN=1
  /// and w's TF_CONFIG over `addresses`), counted and announced. nullopt when none are left.
  std::optional<std::vector<std::string>> replacement_env(const worker& w, std::vector<std::string> base,
                                                          const std::vector<std::string>& addresses, const say_fn& say);

  /// Whether rank `rank` runs a replacement (the last process started for it was one).
  bool replacement(int rank) const { return replaced_.count(rank) > 0; }
  /// Whether `w`, a replacement, ended with `status` (not a success) after the chief finished
  /// the training (`chief_finished`): it came too late to join, or ended after the others, and is
  /// no failure of the run. Says so when it is.
  bool late(const worker& w, int status, bool chief_finished, const say_fn& say) const;

 private:
  const launch_options& options_;
  int replacements_ = 0;  // workers started to take a lost one's place
  std::set<int> replaced_;  // ranks whose process is a replacement
};

}  // namespace troupe::launch
