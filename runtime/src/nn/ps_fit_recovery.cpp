// Model::fit under ParameterServerStrategy after a ps task was lost and restarted alone
// (ClusterCoordinatorOptions::ps_restart_wait; troupe-launch --max-restarts sets it):
// 1. the closure that failed (it needed the lost ps task) is raised and the closures in flight
//    end (PsFitLoop::run);
// 2. the chief waits for the ps task to be reached again at its address, with the cluster's token
//    as at the start (the dispatcher's connector), or for the wait to end, which fails fit as a
//    lost ps task always did;
// 3. the restarted task's shards are made again, then every shard on every ps task is restored
//    from the last sharded checkpoint (in the directory of the last CheckpointManager of ps
//    variables, or ShardedCheckpointManager, made on the strategy),
//    so that the model is one moment's, and the position moves back to that checkpoint's step;
// 4. the workers reach the restarted task again on their next closure.
// No checkpoint to restore from is an error that says what to set.

#include <string>

#include "distribute/cluster/ps_access.hpp"
#include "nn/ps_fit.hpp"
#include "troupe/distribute/sharded_checkpoint.hpp"
#include "troupe/errors.hpp"

namespace troupe::nn::detail {

namespace {

// How long a closure's failure may come before the chief itself hears that a ps task was lost.
constexpr std::chrono::seconds loss_settle{3};

}  // namespace

bool PsFitLoop::recover_from_ps_restart() {
  using distribute::detail::PsAccess;
  if (PsAccess::ps_restart_wait(strategy_).count() == 0) return false;
  const auto restarted = PsAccess::await_ps_restart(strategy_, ps_losses_seen_, loss_settle);
  if (!restarted) return false;
  ps_losses_seen_ = PsAccess::ps_losses(strategy_);
  std::string names;
  for (const int p : *restarted) names += (names.empty() ? "ps task " : ", ps task ") + std::to_string(p);
  if (names.empty()) names = "a ps task";
  const std::string directory = PsAccess::checkpoint_directory(strategy_);
  const std::string what_to_set =
      "make a CheckpointManager of model.variables() before fit and save checkpoints from the on_checkpoint "
      "callback (ps_trainer: --checkpoint-dir and --checkpoint-every), or run without a ps restart wait "
      "(TROUPE_PS_RESTART_WAIT_S=0) so that the whole cluster restarts";
  if (directory.empty()) {
    throw Error("Model::fit: " + names + " was restarted with none of its shards, and there is no checkpoint to restore "
                "every shard from: " + what_to_set);
  }
  PsAccess::remake_shards(strategy_, *restarted);
  distribute::ShardedCheckpointManager checkpoints(strategy_, directory, 1);
  const std::optional<std::int64_t> restored = checkpoints.restore_or_initialize();
  if (!restored) {
    throw Error("Model::fit: " + names + " was restarted with none of its shards, and " + directory +
                " holds no checkpoint yet to restore every shard from: " + what_to_set +
                " (a checkpoint early enough)");
  }
  const std::int64_t from = step_;
  step_ = *restored;
  scheduled_ = step_;
  first_epoch_ = static_cast<int>(step_ / steps_per_epoch_);
  first_k_ = step_ % steps_per_epoch_;
  control_.set_position(step_, first_epoch_);
  checkpoint_pending_ = false;  // the checkpoint restored is the last one
  hold_ = pause_pending_ || stop_pending_;
  rolled_back_ = true;
  PsAccess::log(strategy_, "Model::fit: " + names + " restarted; every shard restored from " +
                               checkpoints.latest_checkpoint().value_or(directory) + ", training resumes at step " +
                               std::to_string(step_) + " (it had reached step " + std::to_string(from) + ")");
  return true;
}

}  // namespace troupe::nn::detail
