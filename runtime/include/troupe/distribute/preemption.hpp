#pragma once
// PreemptionCheckpointHandler (tf.distribute.experimental.PreemptionCheckpointHandler): when one
// worker is told to stop (SIGTERM, or a user's termination watcher), every worker saves a
// checkpoint at the same step and exits with the restart code; the restarted program restores
// it and goes on from that step.
//
// How the workers agree, with W workers calling run() (or save_checkpoint_if_preempted()) once
// per step, in the same order, in cross-replica context:
//  1. SIGTERM only sets a flag (the handler installs a SIGTERM handler and puts the previous one
//     back when it is destroyed); the termination watcher is called at each step boundary.
//  2. At each step boundary every worker contributes 1 if it was told to stop, else 0, to one sum
//     over the workers (a few bytes on the ring), so every worker learns of a signal that reached
//     one of them at the same boundary: the step saved is the same everywhere.
//  3. When the sum is positive, every worker saves (a collective checkpoint save: the chief writes
//     the file), all meet once more so that none exits before the file is written, and each
//     calls exit_fn (by default: flush and exit with restart_exit_code).
//  4. The new process's handler restores the newest checkpoint of the manager, and
//     total_run_calls() continues from the step it holds.

#include <cstdint>
#include <functional>
#include <type_traits>
#include <utility>

namespace troupe {
class CheckpointManager;
}

namespace troupe::distribute {

class Strategy;

/// The exit status of a worker that saved a checkpoint because it was told to stop: EX_TEMPFAIL
/// of sysexits.h (a temporary failure; run it again). troupe-launch --max-restarts restarts on it.
inline constexpr int restart_exit_code = 75;

/// How a PreemptionCheckpointHandler learns of a termination, saves, and exits
/// (tf.distribute.experimental.TerminationConfig).
struct TerminationConfig {
  /// Called at every step boundary; true means this worker is about to be stopped. SIGTERM is
  /// watched in any case. Keep it cheap and non-blocking.
  std::function<bool()> termination_watcher_fn;
  /// Called after the checkpoint is saved on every worker. Empty: flush std::cout and std::cerr
  /// and exit the process at once with restart_exit_code (no destructors run: a training
  /// program's threads are stopped by the exit). A function that returns lets the caller go on.
  std::function<void()> exit_fn;
  /// Saves the checkpoint for `step` (total_run_calls) instead of CheckpointManager::save(step),
  /// for callers that save more than the manager's variables (BackupAndRestore).
  std::function<void(std::int64_t step)> save_fn;
};

/// Saves a checkpoint on every worker at one agreed step when any worker is told to stop, then
/// exits (see the walkthrough at the top of this header). Made for MultiWorkerMirroredStrategy;
/// under a strategy of one process there is nothing to agree and it saves on its own signal.
class PreemptionCheckpointHandler {
 public:
  /// Restores the newest checkpoint of `manager` (CheckpointManager::restore_or_initialize, in
  /// the strategy's scope) and starts watching for SIGTERM. `strategy` and `manager` must outlive
  /// the handler; construct it in cross-replica context, on every worker.
  PreemptionCheckpointHandler(Strategy& strategy, CheckpointManager& manager, TerminationConfig config = {});
  ~PreemptionCheckpointHandler();
  PreemptionCheckpointHandler(const PreemptionCheckpointHandler&) = delete;
  PreemptionCheckpointHandler& operator=(const PreemptionCheckpointHandler&) = delete;

  /// Saves and exits first when a worker was told to stop (save_checkpoint_if_preempted), then
  /// calls fn(args...) (one training step, typically a strategy.run) and counts it.
  template <class Fn, class... Args>
  decltype(auto) run(Fn&& fn, Args&&... args) {
    save_checkpoint_if_preempted();
    if constexpr (std::is_void_v<std::invoke_result_t<Fn, Args...>>) {
      std::invoke(std::forward<Fn>(fn), std::forward<Args>(args)...);
      ++total_run_calls_;
    } else {
      auto result = std::invoke(std::forward<Fn>(fn), std::forward<Args>(args)...);
      ++total_run_calls_;
      return result;
    }
  }

  /// One step boundary without a step: agrees with the other workers whether any was told to
  /// stop, and if so saves at total_run_calls() and calls exit_fn. Every worker must call it (or
  /// run) the same number of times. Returns true when it saved (only seen when exit_fn returns).
  bool save_checkpoint_if_preempted();

  /// Steps run so far, counting those of the runs before the checkpoint restored.
  std::int64_t total_run_calls() const noexcept { return total_run_calls_; }
  /// Counts a step run without run() (a loop that calls save_checkpoint_if_preempted itself).
  void set_total_run_calls(std::int64_t steps) noexcept { total_run_calls_ = steps; }
  /// The step of the checkpoint restored at construction; -1 when there was none.
  std::int64_t restored_step() const noexcept { return restored_step_; }

 private:
  Strategy* strategy_;
  CheckpointManager* manager_;
  TerminationConfig config_;
  std::int64_t total_run_calls_ = 0;
  std::int64_t restored_step_ = -1;
};

}  // namespace troupe::distribute
