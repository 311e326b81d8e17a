#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/distribute/actor.hpp"
#include "troupe/distribute/cluster_resolver.hpp"
#include "troupe/distribute/remote_function.hpp"
#include "troupe/runtime.hpp"
#include "troupe/tensor.hpp"

namespace troupe::distribute {

/// An actor that went down, as its spawner hears it.
struct ActorDown {
  std::uint64_t id = 0;  ///< ActorHandle::id()
  std::string type;      ///< its registered type
  std::string task;      ///< where it ran: "/job:worker/replica:0/task:1", or "local"
  std::string cause;     ///< why: its host's connection closed, its host went silent, it was stopped
};

/// What an ActorCluster did with one of its actors, for a watcher such as the dashboard
/// (Monitor::actor_events).
struct ActorEvent {
  enum class Kind {
    spawned,    ///< placed on `task`
    replied,    ///< answered a request (with a result or its own error)
    down,       ///< went down, for `cause`
    restarted,  ///< started again on `task`, under the same id
  };
  Kind kind = Kind::spawned;
  std::uint64_t id = 0;  ///< ActorHandle::id()
  std::string type;      ///< its registered type
  std::string task;      ///< where it runs: "/job:worker/replica:0/task:1", or "local"
  std::string cause;     ///< down: why
};

/// The settings of an ActorCluster, with named defaults. from_environment() reads the same
/// TROUPE_* variables as a Server and a ClusterCoordinator.
struct ActorClusterOptions {
  /// TROUPE_CLUSTER_TOKEN: spawns and messages travel over mutual TLS derived from it (the tasks'
  /// Servers must hold the same). Empty: plain connections, loopback clusters only.
  std::string cluster_token;
  /// TROUPE_INSECURE=1: spawn beyond loopback without a token (a trusted, isolated network only).
  bool insecure = false;
  /// TROUPE_START_TIMEOUT_MS: how long reaching a task and its answer to a spawn may take.
  std::chrono::milliseconds connect_timeout{60000};
  /// TROUPE_HEARTBEAT_MS and TROUPE_MISSED_HEARTBEATS: every task hosting one of this spawner's
  /// actors is asked every interval; one silent for more than missed intervals (stopped, hung)
  /// has its actors reported down. A host whose process dies is reported at once.
  std::chrono::milliseconds heartbeat_interval{500};
  int missed_heartbeats = 6;
  /// The largest message (its tensors' bytes and their headers) a handle sends: larger is
  /// std::invalid_argument before anything travels. At most 1 GiB, which every host enforces.
  std::size_t max_message_bytes = std::size_t{256} << 20;
  /// Called once per actor that goes down, on one of the runtime's threads (keep it short).
  std::function<void(const ActorDown&)> on_down;
  /// Called at every spawn, reply, down and restart of this spawner's actors, on the thread that
  /// saw it (keep it short, and do not call the ActorCluster from it). Empty: none.
  std::function<void(const ActorEvent&)> on_event;
  /// One line per event (spawned, down); nullptr: "troupe: actors: <line>" on stderr.
  std::function<void(const std::string& line)> log;

  /// The defaults with the TROUPE_* environment applied (malformed: std::invalid_argument).
  static ActorClusterOptions from_environment();
};

/// A spawned actor: request and send work the same whether it runs on another task or in this
/// process. A copy refers to the same actor. Valid while its ActorCluster lives: afterwards every
/// call fails as for an actor that is down.
class ActorHandle {
 public:
  /// An empty handle (its calls throw std::logic_error).
  ActorHandle() = default;

  /// Sends message `name` with `tensors` and waits at most `timeout` for the reply's tensors.
  /// The actor's error, an actor that is down and a timeout are troupe::Error naming the actor,
  /// its task and the message; a message over ActorClusterOptions::max_message_bytes is
  /// std::invalid_argument.
  std::vector<Tensor> request(const std::string& name, const std::vector<Tensor>& tensors = {},
                              std::chrono::milliseconds timeout = std::chrono::seconds(30)) const;
  /// Sends message `name` one way (its reply and its error are dropped). An actor known to be
  /// down is troupe::Error; the size bound is request's.
  void send(const std::string& name, const std::vector<Tensor>& tensors = {}) const;
  /// Stops the actor; its spawner hears it as down ("stopped by its spawner").
  void stop() const;

  /// Why the actor is down, or nothing while it runs.
  std::optional<std::string> down() const;
  /// Its number in its ActorCluster (ActorDown::id), its type and its task.
  std::uint64_t id() const;
  const std::string& type() const;
  const std::string& task() const;
  explicit operator bool() const noexcept { return impl_ != nullptr; }

  struct Impl;
  explicit ActorHandle(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

 private:
  const Impl& checked(const char* what) const;
  std::shared_ptr<Impl> impl_;
};

/// Spawns an application's actors on the tasks of its cluster or in its own process, and watches
/// them (Ray's actors, in C++; docs/actors.md). Any task may make one: the chief, or a worker from
/// a function or an actor. A task hosts actors of the types its Server's registry has (a program's
/// own, or those of troupe-worker --module); every spawn and message goes over the cluster's
/// authenticated control plane. Destroying it stops its local actors; its remote actors stop as
/// their hosts see it leave (as they do when its process ends).
class ActorCluster {
 public:
  /// The spawner for `own_task` ("chief:0", or a full task name) of `cluster`; `registry` holds
  /// the types it can spawn locally. A cluster beyond loopback without a token (and not insecure)
  /// is std::invalid_argument naming both ways out.
  ActorCluster(Runtime& runtime, const ClusterSpec& cluster, const std::string& own_task, FunctionRegistry registry = {},
               ActorClusterOptions options = ActorClusterOptions::from_environment());
  /// The spawner for the task the resolver names.
  ActorCluster(Runtime& runtime, const ClusterResolver& resolver, FunctionRegistry registry = {},
               ActorClusterOptions options = ActorClusterOptions::from_environment());
  ~ActorCluster();
  ActorCluster(const ActorCluster&) = delete;
  ActorCluster& operator=(const ActorCluster&) = delete;

  /// Spawns an actor of `type` with constructor arguments `args` on `task`: "worker:1" (or
  /// "/job:worker/replica:0/task:1"), or "local" for this process. A task the cluster lacks or a
  /// type the registry lacks is std::invalid_argument; a task that cannot be reached, refuses the
  /// connection (another token) or refuses the type is troupe::Error; each names the type and the
  /// task.
  ActorHandle spawn(const std::string& type, const std::string& task = "local", const std::vector<Tensor>& args = {});

  /// This spawner's task: "/job:chief/replica:0/task:0".
  const std::string& task() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace troupe::distribute
