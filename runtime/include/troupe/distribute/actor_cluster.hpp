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
#include "troupe/errors.hpp"
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
  /// Its handle's RestartPolicy respawns it on another task (ActorClusterOptions::on_restart
  /// hears how that went).
  bool restarting = false;
};

/// How a supervised actor whose host was lost (its process died, went silent or stopped) is
/// respawned, one for one, as Erlang's and CAF's supervisors do: at most `max_restarts` restarts
/// within any `window`; the next loss gives up with ActorRestartsExhausted. The new actor is made
/// on another live task of the same job (the least loaded, as "any" placement) from the constructor
/// arguments of the first spawn; its handle follows it. An actor stopped by its spawner is not
/// restarted, nor is a local one.
struct RestartPolicy {
  int max_restarts = 0;                              ///< 0: never restarted (0..1000)
  std::chrono::milliseconds window{std::chrono::minutes(1)};  ///< counted over this sliding span
};

/// A restart by policy, as its spawner hears it (ActorClusterOptions::on_restart).
struct ActorRestart {
  std::uint64_t previous_id = 0;  ///< the actor that went down (ActorDown::id)
  std::uint64_t id = 0;           ///< the new actor (ActorHandle::id() from now on); 0 when it failed
  std::string type;
  std::string from;               ///< the task it went down on
  std::string task;               ///< the task it runs on now (empty when it failed)
  int restarts = 0;               ///< the restarts within the policy's window, this one included
  std::string error;              ///< why it was not restarted (ActorRestartsExhausted's text), or empty
};

/// A supervised actor lost more often than its RestartPolicy allows (or no task would take it):
/// its handle's calls throw this from then on.
class ActorRestartsExhausted : public Error {
 public:
  using Error::Error;
};

/// What an ActorCluster did with one of its actors, for a watcher such as the dashboard
/// (Monitor::actor_events).
struct ActorEvent {
  enum class Kind {
    spawned,    ///< placed on `task`
    replied,    ///< answered a request (with a result or its own error)
    down,       ///< went down, for `cause`
    restarted,  ///< respawned by its RestartPolicy on `task`, as `id`, in place of `previous_id`
  };
  Kind kind = Kind::spawned;
  std::uint64_t id = 0;  ///< ActorHandle::id()
  std::string type;      ///< its registered type
  std::string task;      ///< where it runs: "/job:worker/replica:0/task:1", or "local"
  std::string cause;     ///< down: why
  std::uint64_t previous_id = 0;  ///< restarted: the actor it replaces (that one's ActorEvent::id)
  bool stopped = false;  ///< down: stopped by its spawner (ActorHandle::stop), not lost
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
  /// TROUPE_ACTOR_DATA_CONNECTIONS (1 or 0): messages to a remote actor go over a direct data
  /// connection to its task (proven with the token and a secret from the spawn's answer, tagged
  /// per frame: docs/actors.md, "The data connections"); false: over the control plane (CAF's).
  bool data_connections = true;
  /// Called once per actor that goes down, on one of the runtime's threads (keep it short).
  std::function<void(const ActorDown&)> on_down;
  /// Called once per restart by policy (and once when one gives up), on the ActorCluster's
  /// restart thread (keep it short).
  std::function<void(const ActorRestart&)> on_restart;
  /// Called at every spawn, reply, down and restart of this spawner's actors, on the thread that
  /// saw it (keep it short, and do not call the ActorCluster from it). Empty: none.
  std::function<void(const ActorEvent&)> on_event;
  /// One line per event (spawned, down); nullptr: "troupe: actors: <line>" on stderr.
  std::function<void(const std::string& line)> log;

  /// The defaults with the TROUPE_* environment applied (malformed: std::invalid_argument).
  static ActorClusterOptions from_environment();
};

/// A request in flight (ActorHandle::request_async): wait for it with receive(), or have then()
/// call back when it completes. A copy refers to the same request.
class ActorRequest {
 public:
  /// An empty request (its calls throw std::logic_error).
  ActorRequest() = default;

  /// Waits for the reply's tensors (the request's timeout bounds the wait); its error is thrown
  /// as troupe::Error (ActorRestartsExhausted for an actor whose policy gave up), as request's.
  /// May be called again, and after then().
  std::vector<Tensor> receive() const;
  /// Calls `on_reply` with the reply's tensors, or `on_error` with the error, once, when the
  /// request completes (at once if it has). They run on the ActorCluster's callback thread, one at
  /// a time in the order the requests completed: never on the caller's stack nor on a runtime
  /// thread, so they may make requests, blocking ones included. A callback must not wait for
  /// another callback (they share one thread). Without `on_error`, an error is logged. A second
  /// then() is std::logic_error.
  void then(std::function<void(std::vector<Tensor>)> on_reply,
            std::function<void(const Error&)> on_error = nullptr) const;
  /// Whether it completed (receive() would not wait).
  bool ready() const;
  explicit operator bool() const noexcept { return state_ != nullptr; }

  struct State;
  explicit ActorRequest(std::shared_ptr<State> state) : state_(std::move(state)) {}

 private:
  State& checked(const char* what) const;
  std::shared_ptr<State> state_;
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
  /// The same request without waiting: the reply comes through the ActorRequest (receive() or
  /// then()). The size bound is std::invalid_argument at once; every other error comes through
  /// the request. An actor restarting by policy fails it (as down) rather than waiting.
  ActorRequest request_async(const std::string& name, const std::vector<Tensor>& tensors = {},
                             std::chrono::milliseconds timeout = std::chrono::seconds(30)) const;
  /// Sends message `name` one way (its reply and its error are dropped). An actor known to be
  /// down is troupe::Error; the size bound is request's.
  void send(const std::string& name, const std::vector<Tensor>& tensors = {}) const;
  /// Stops the actor; its spawner hears it as down ("stopped by its spawner").
  void stop() const;

  /// Why the actor is down, or nothing while it runs.
  std::optional<std::string> down() const;
  /// How many times its RestartPolicy respawned it (0 without a policy).
  int restarts() const;
  /// Its number in its ActorCluster (ActorDown::id), its type and its task (those of the actor
  /// running now, for a handle a RestartPolicy moved).
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
  /// "/job:worker/replica:0/task:1"), "any" (the least-loaded worker task, see load()), "any:JOB"
  /// (the least-loaded task of JOB), or "local" for this process. A task the cluster lacks or a
  /// type the registry lacks is std::invalid_argument; a task that cannot be reached, refuses the
  /// connection (another token) or refuses the type is troupe::Error; each names the type and the
  /// task.
  ActorHandle spawn(const std::string& type, const std::string& task = "local", const std::vector<Tensor>& args = {});
  /// The same, supervised by `policy`: when the actor's host is lost it is respawned on another
  /// task of its job, and the returned handle (and its copies) follow the new actor. Requests made
  /// while it restarts wait for it (within their timeout); one in flight when the host died fails
  /// as for any actor that is down. A policy out of range is std::invalid_argument.
  ActorHandle spawn(const std::string& type, const std::string& task, const std::vector<Tensor>& args,
                    const RestartPolicy& policy);

  /// This spawner's task: "/job:chief/replica:0/task:0".
  const std::string& task() const;

  /// The load "any" placement reads: for each task of `job`, by index, how many actors this
  /// ActorCluster spawned there that are not down. "any:JOB" picks the task with the fewest (the
  /// lowest index among equals), skips this spawner's own task, tries tasks whose host was lost
  /// (died, went silent) last, and moves on to the next when a task cannot be reached.
  std::vector<int> load(const std::string& job = "worker") const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace troupe::distribute
