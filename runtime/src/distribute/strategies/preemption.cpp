#include "troupe/distribute/preemption.hpp"

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <string>

#include "distribute/collectives/worker_group.hpp"
#include "troupe/checkpoint.hpp"
#include "troupe/distribute/context.hpp"
#include "troupe/distribute/strategy.hpp"
#include "troupe/log.hpp"

namespace troupe::distribute {
namespace {

// A signal handler reaches nothing but globals: the count of SIGTERMs received, and what was
// installed before the first handler (put back when the last one goes).
std::atomic<int> sigterm_count{0};
static_assert(std::atomic<int>::is_always_lock_free, "the SIGTERM flag is written from a signal handler");

extern "C" void on_sigterm(int) { sigterm_count.fetch_add(1, std::memory_order_relaxed); }

struct sigterm_watch {
  std::mutex mutex;
  int users = 0;
  struct sigaction previous {};
  int baseline = 0;  // sigterm_count when the first user came: older signals are not ours
};

sigterm_watch& watch() {
  static sigterm_watch w;  // process-wide like the signal disposition it mirrors
  return w;
}

void start_watching_sigterm() {
  sigterm_watch& w = watch();
  std::lock_guard<std::mutex> lock(w.mutex);
  if (w.users++ > 0) return;
  w.baseline = sigterm_count.load();
  struct sigaction action {};
  action.sa_handler = on_sigterm;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  if (::sigaction(SIGTERM, &action, &w.previous) != 0) {
    --w.users;
    throw std::runtime_error("PreemptionCheckpointHandler: cannot install a SIGTERM handler");
  }
}

void stop_watching_sigterm() noexcept {
  sigterm_watch& w = watch();
  std::lock_guard<std::mutex> lock(w.mutex);
  if (--w.users > 0) return;
  ::sigaction(SIGTERM, &w.previous, nullptr);
}

bool sigterm_received() { return sigterm_count.load(std::memory_order_relaxed) > watch().baseline; }

}  // namespace

PreemptionCheckpointHandler::PreemptionCheckpointHandler(Strategy& strategy, CheckpointManager& manager,
                                                         TerminationConfig config)
    : strategy_(&strategy), manager_(&manager), config_(std::move(config)) {
  if (has_strategy() && !in_cross_replica_context()) {
    throw std::logic_error("PreemptionCheckpointHandler: construct it in cross-replica context, not inside Strategy::run");
  }
  {
    auto scope = strategy_->scope();
    if (auto step = manager_->restore_or_initialize()) {
      restored_step_ = *step;
      total_run_calls_ = *step;
    }
  }
  start_watching_sigterm();
}

PreemptionCheckpointHandler::~PreemptionCheckpointHandler() { stop_watching_sigterm(); }

bool PreemptionCheckpointHandler::save_checkpoint_if_preempted() {
  if (has_strategy() && !in_cross_replica_context()) {
    throw std::logic_error("PreemptionCheckpointHandler: call run or save_checkpoint_if_preempted in cross-replica "
                           "context, not inside Strategy::run");
  }
  const bool signalled = sigterm_received();
  const bool watched = !signalled && config_.termination_watcher_fn && config_.termination_watcher_fn();
  auto scope = strategy_->scope();
  detail::WorkerGroup& workers = strategy_->backend().workers();
  // One sum per step boundary: every worker learns here whether any worker was told to stop.
  const std::int64_t told = workers.sum(Tensor::scalar<std::int64_t>(signalled || watched ? 1 : 0)).item<std::int64_t>();
  if (told == 0) return false;

  const std::string who = "worker " + std::to_string(workers.rank()) + " of " + std::to_string(workers.size());
  log(LogLevel::warning, "PreemptionCheckpointHandler: " + who + ": " + std::to_string(told) +
                             " worker(s) told to stop" + (signalled ? " (this one by SIGTERM)" : watched ? " (this one by its termination watcher)" : "") +
                             "; saving a checkpoint at step " + std::to_string(total_run_calls_) +
                             (config_.exit_fn ? std::string() : ", then exiting with status " + std::to_string(restart_exit_code)));
  if (config_.save_fn) {
    config_.save_fn(total_run_calls_);
  } else {
    manager_->save(total_run_calls_);
  }
  // No worker leaves before every one has saved (the chief's file is written by now). A worker
  // that completes this sum has everyone's contribution, so every worker had saved: one that
  // sees the sum fail because a faster worker already left has nothing more to wait for.
  try {
    workers.sum(Tensor::scalar<std::int64_t>(1));
  } catch (const std::exception& e) {
    log(LogLevel::info, std::string("PreemptionCheckpointHandler: after the save: ") + e.what());
  }
  if (config_.exit_fn) {
    config_.exit_fn();
    return true;
  }
  std::cout << std::flush;
  std::cerr << std::flush;
  std::fflush(nullptr);
  std::_Exit(restart_exit_code);
}

}  // namespace troupe::distribute
