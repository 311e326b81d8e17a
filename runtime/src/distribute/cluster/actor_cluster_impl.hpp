#pragma once

// The state an ActorCluster's parts share: the cluster and its spawner (ActorCluster::Impl), and
// what a handle refers to (ActorHandle::Impl). actor_cluster.cpp spawns and talks,
// actor_placement.cpp places "any" spawns, actor_restart.cpp restarts by RestartPolicy.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "distribute/cluster/actor_placement.hpp"
#include "distribute/cluster/serial_worker.hpp"
#include "troupe/actors/app_actors.hpp"
#include "troupe/distribute/actor_cluster.hpp"

namespace troupe::distribute {

struct ActorCluster::Impl {
  ClusterSpec cluster;
  std::string task;
  FunctionRegistry registry;
  ActorClusterOptions options;
  std::shared_ptr<actors::control_credentials> credentials;
  std::unique_ptr<actors::actor_client> client;
  std::atomic<bool> closed{false};
  detail::actor_load load;  // what "any" placement reads
  mutable std::mutex supervised_mutex;
  std::map<std::uint64_t, std::weak_ptr<ActorHandle::Impl>> supervised;  // by the id of the actor running now
  detail::serial_worker restarter;  // restarts by policy, one at a time
  detail::serial_worker callbacks;  // ActorRequest::then's callbacks, one at a time

  // Tells options.on_event, when set.
  void report(ActorEvent::Kind kind, std::uint64_t id, const std::string& type, const std::string& where,
              const std::string& cause = {}, std::uint64_t previous_id = 0, bool stopped = false) const {
    if (options.on_event) options.on_event(ActorEvent{kind, id, type, where, cause, previous_id, stopped});
  }

  // Supervision by a RestartPolicy (actor_restart.cpp): the handle of the actor running now as `id`.
  void supervise(std::uint64_t id, const std::shared_ptr<ActorHandle::Impl>& h);
  // The handle supervising `id`, taken out (nullptr when none).
  std::shared_ptr<ActorHandle::Impl> supervised_handle(std::uint64_t id);
  void unsupervise(std::uint64_t id);

  std::vector<int> load_of(const std::string& job) const { return load.of(cluster, job); }
  std::vector<int> placement_order(const std::string& job, const std::string& exclude = "") const {
    return load.order(cluster, job, task, exclude);
  }

  // Spawns on one remote task, trying again for up to `wait_listening` while nothing listens
  // there yet; troupe::Error naming the type and the task when it fails, with `reached` false when
  // the task could not be reached (or refused the connection).
  std::shared_ptr<actors::actor_ref> spawn_remote(const std::string& type, const std::string& job, int index,
                                                  const std::string& args_bytes, const std::string& what,
                                                  bool* reached = nullptr,
                                                  std::chrono::milliseconds wait_listening = std::chrono::milliseconds(0));

  // An "any" spawn (actor_placement.cpp): the tasks of `job` tried in placement order (but
  // `exclude`) until one takes the actor; when none could be reached, the order is tried again,
  // with growing pauses, for up to `wait_listening` (tasks not listening yet). `refused` holds the
  // error of a task that answered and refused it (the others would refuse it the same way: no
  // more are tried); `tried` each failure of the last pass, one per line.
  struct placed {
    std::shared_ptr<actors::actor_ref> ref;
    std::string tried;
    std::optional<std::string> refused;
  };
  placed place_any(const std::string& type, const std::string& job, const std::string& args_bytes,
                   const std::string& what, const std::string& exclude = "",
                   std::chrono::milliseconds wait_listening = std::chrono::milliseconds(0));

  actors::actor_client& client_for(const std::string& what) {
    if (closed) throw Error(what + ": its ActorCluster is gone");
    return *client;
  }

  void log(const std::string& line) const;
};

struct ActorHandle::Impl {
  // One actor a handle has referred to: the first spawn's, then each restart's.
  struct incarnation {
    std::shared_ptr<actors::actor_ref> ref;
    std::uint64_t id = 0;
    std::string task;
  };

  std::shared_ptr<ActorCluster::Impl> cluster;
  std::string type;
  // Supervision by a RestartPolicy: the job it stays in and its constructor arguments.
  bool supervised = false;
  RestartPolicy policy;
  std::string job;
  std::string args_bytes;

  mutable std::mutex mutex;
  mutable std::condition_variable changed;
  std::shared_ptr<const incarnation> now;
  std::vector<std::shared_ptr<const incarnation>> history;  // kept: task() hands out references
  bool restarting = false;
  // stop() was called: a restart under way stops the actor it makes (or makes none), and no
  // later loss restarts it.
  mutable bool stopped = false;
  std::string cancelled;  // why a restart stopped by stop() made no actor, or empty
  std::string exhausted;  // ActorRestartsExhausted's text once the policy gave up
  int restarts = 0;
  std::deque<std::chrono::steady_clock::time_point> restart_times;  // within the policy's window

  void adopt(std::shared_ptr<actors::actor_ref> ref) {
    auto inc = std::make_shared<incarnation>();
    inc->id = actors::actor_client::id(*ref);
    inc->task = actors::actor_client::task(*ref);
    inc->ref = std::move(ref);
    history.push_back(inc);
    now = std::move(inc);
  }

  // The actor now, without waiting.
  std::shared_ptr<const incarnation> current() const {
    std::lock_guard<std::mutex> lock(mutex);
    return now;
  }

  // The actor to talk to: while it restarts, waits for the new one at most `wait`; a policy that
  // gave up is ActorRestartsExhausted.
  std::shared_ptr<const incarnation> reachable(std::chrono::milliseconds wait, const std::string& what) const;

  std::string describe(const incarnation& inc) const;
  std::string describe() const { return describe(*current()); }

  // The message's bytes; std::invalid_argument for a name or a message over the bounds.
  std::string encode(const std::string& name, const std::vector<Tensor>& tensors, const char* op) const;
};

namespace detail {

/// What the cluster does with an actor that went down (on the runtime's supervisor thread,
/// actor_restart.cpp): its load is gone, and a supervised one whose host was lost is restarted
/// on the cluster's restart thread.
void actor_went_down(const std::shared_ptr<ActorCluster::Impl>& self, actors::actor_down d);

/// A RestartPolicy out of range: std::invalid_argument starting with `what`.
void check_restart_policy(const RestartPolicy& policy, const std::string& what);

}  // namespace detail

}  // namespace troupe::distribute
