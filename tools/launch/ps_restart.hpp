#pragma once
// --max-restarts with --ps: a lost ps task is restarted alone.
//   1. A ps rank that fails (killed, crashed, a non-zero exit other than preemption's) while restarts
//      are left is started again after the restart backoff, on its same address (the same
//      TF_CONFIG and token), while the chief and the workers keep running (takes, due, start_env).
//   2. Every task hears TROUPE_PS_RESTART_WAIT_S (unless the caller set it): how long the chief
//      waits for the lost ps task to come back before its fit fails (environment); there, fit
//      restores every shard from the last sharded checkpoint and goes on (docs/clusters.md).
//   3. Such restarts count against --max-restarts with the whole-cluster ones. A chief that fails
//      anyway (the ps task did not come back, or there was no checkpoint) is a failure like any
//      other: the whole cluster restarts while restarts are left.
// TROUPE_PS_RESTART_WAIT_S=0 in the launcher's environment turns this off: a lost ps task then
// restarts the whole cluster, as without --ps.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "launch/launch_options.hpp"
#include "launch/worker_process.hpp"

namespace troupe::launch {

/// The ps restart rules of one launch; the supervisor asks them at each exit and timer.
class ps_restart {
 public:
  using say_fn = std::function<void(const std::string&)>;

  /// `options` must outlive the rules.
  explicit ps_restart(const launch_options& options);

  /// Whether lost ps tasks are restarted alone in this launch.
  bool enabled() const noexcept { return enabled_; }
  /// Whether rank `rank` is a ps task (the last --ps ranks).
  bool is_ps(int rank) const noexcept;

  /// The wait the chief is told (TROUPE_PS_RESTART_WAIT_S=...) when enabled and the caller set
  /// none; appended to `env`.
  void environment(std::vector<std::string>& env) const;

  /// Whether `w`, which ended `how`, is restarted alone, with `used` restarts of --max-restarts
  /// spent so far; says so (the start comes after the backoff: due).
  bool takes(const worker& w, const std::string& how, int used, const say_fn& say);

  /// The ranks whose restart is due at `now` (each returned once).
  std::vector<int> due(clock::time_point now);
  /// The earliest restart pending, if any.
  std::optional<clock::time_point> next() const;
  /// Forgets the restarts pending (the launch is stopping).
  void clear() { pending_.clear(); }
  /// Whether a restart of `rank` is pending.
  bool pending(int rank) const;

 private:
  struct pending_start {
    int rank;
    clock::time_point at;
  };
  const launch_options& options_;
  bool enabled_ = false;
  bool caller_set_wait_ = false;
  std::vector<pending_start> pending_;
};

}  // namespace troupe::launch
