#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace caf {
class actor_system;
}

namespace troupe::actors {

/// The bookkeeping of a coordinator, apart from CAF so it can be tested alone: which replicas
/// have answered the current step, and which were lost.
class coordinator_state {
 public:
  /// Starts step `n+1` over `replicas` replicas and returns its id.
  std::uint64_t begin_step(int replicas);
  /// Replica `replica` finished step `step`. Stale or repeated answers are ignored. Returns
  /// whether the step is complete.
  bool on_done(std::uint64_t step, int replica);
  /// Replica `replica`'s actor is gone: it will never answer. Returns whether the step is complete.
  bool on_lost(int replica, std::string reason);
  bool complete() const noexcept { return pending_ == 0; }
  std::uint64_t step() const noexcept { return step_; }
  /// Why each replica was lost; empty strings for replicas that are fine.
  const std::vector<std::string>& lost() const noexcept { return lost_; }

 private:
  std::uint64_t step_ = 0;
  int pending_ = 0;
  std::vector<bool> answered_;
  std::vector<std::string> lost_;
};

/// A coordinator actor and one detached replica actor per device. run_step sends every replica a
/// step message, each runs fn(replica) on its own thread, and the coordinator gathers their
/// answers. Waits spin briefly before they sleep, since a step is a few microseconds of work
/// when the function is trivial and waking a sleeping thread costs tens.
class coordinator {
 public:
  /// How long destruction waits for replica threads to end: a replica stuck in a user function
  /// that never returns is left behind after this, rather than hanging the program.
  static constexpr std::chrono::seconds stop_timeout{30};

  coordinator(caf::actor_system& system, int replicas, std::chrono::microseconds spin,
              std::string thread_name_prefix = "troupe-replica");
  /// Stops every replica actor and waits until their threads are gone.
  ~coordinator();
  coordinator(const coordinator&) = delete;
  coordinator& operator=(const coordinator&) = delete;

  int replicas() const noexcept;

  /// Runs fn(r) on replica r's thread for every r and returns once all have finished: one
  /// exception_ptr per replica, null where fn returned normally. `on_lost` is called (on the
  /// calling thread) if a replica actor disappears mid-step, so the caller can release replicas
  /// waiting for it. Calls from several threads are serialised.
  std::vector<std::exception_ptr> run_step(const std::function<void(int)>& fn,
                                           const std::function<void(int, const std::string&)>& on_lost);

  /// Whether the calling thread is one of this coordinator's replica threads.
  bool on_replica_thread() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
  std::mutex run_mutex_;
};

}  // namespace troupe::actors
