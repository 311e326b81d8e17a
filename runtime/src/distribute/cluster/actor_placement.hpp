#pragma once

// Where an ActorCluster's actor goes: the task names a spawn accepts ("worker:1",
// "/job:worker/replica:0/task:1", "any", "any:JOB") and the load "any" placement reads, the live
// remote actors by task and the tasks whose host was lost. ActorCluster::Impl::place_any walks
// the order this gives (actor_placement.cpp); docs/actors.md says it for users.

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "troupe/distribute/cluster_resolver.hpp"

namespace troupe::distribute::detail {

/// One task of a cluster: its job and index.
struct task_ref {
  std::string job;
  int index = 0;
};

/// "worker:1" or "/job:worker/replica:0/task:1"; nothing when it is neither.
std::optional<task_ref> parse_task(const std::string& task);

/// "any" -> "worker", "any:JOB" -> JOB; nothing for any other task.
std::optional<std::string> any_job(const std::string& task);

/// The cluster's tasks as "chief:0, worker:0, worker:1" (or "none"), for errors.
std::string tasks_of(const ClusterSpec& cluster);

/// The live remote actors by id (their task) and the lost tasks; thread-safe.
class actor_load {
 public:
  /// An actor spawned on `task`: it counts there, and the task is reachable again.
  void spawned(std::uint64_t id, const std::string& task);
  /// An actor gone: it no longer counts; `host_lost` marks its task lost.
  void went_down(std::uint64_t id, const std::string& task, bool host_lost);
  /// A task that could not be reached (or refused the connection): tried last from now on.
  void unreachable(const std::string& task);
  /// For each task of `job` in `cluster`, by index, its live actors.
  std::vector<int> of(const ClusterSpec& cluster, const std::string& job) const;
  /// The tasks of `job` in the order "any" tries them: live ones by (load, index), then lost ones
  /// by (load, index); never `own` nor `exclude`.
  std::vector<int> order(const ClusterSpec& cluster, const std::string& job, const std::string& own,
                         const std::string& exclude = "") const;

 private:
  mutable std::mutex mutex_;
  std::map<std::uint64_t, std::string> live_;
  std::set<std::string> lost_;
};

}  // namespace troupe::distribute::detail
