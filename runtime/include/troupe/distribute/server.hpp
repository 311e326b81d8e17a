#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "troupe/distribute/cluster_resolver.hpp"
#include "troupe/distribute/remote_function.hpp"
#include "troupe/runtime.hpp"

namespace troupe::distribute {

/// The settings of a Server, with named defaults. from_environment() reads the same TROUPE_*
/// variables as MultiWorkerOptions.
struct ServerOptions {
  /// TROUPE_CLUSTER_TOKEN: with one, peers connect over mutual TLS derived from it, so only its
  /// holders are heard at all. Empty: plain connections, allowed only on loopback (or `insecure`).
  std::string cluster_token;
  /// TROUPE_INSECURE=1: serve beyond loopback without a token (a trusted, isolated network only).
  bool insecure = false;
  /// TROUPE_START_TIMEOUT_MS: how long a worker waits for a ps task to answer, and how long a ps
  /// task waits for a worker that stalls in the middle of sending or reading a variable's bytes.
  std::chrono::milliseconds peer_timeout{60000};
  /// TROUPE_PS_DATA_PORT: the port a ps task serves its variables' bytes on, beside its cluster
  /// address (where a firewall stands between hosts, open both). 0: a free port the system picks;
  /// the workers learn it over the authenticated control connection either way. Two ps tasks on
  /// one host need two ports (troupe-worker's --data-port sets it per task).
  std::uint16_t data_port = 0;
  /// join() returns once the chief that connected leaves or is lost: what a task of a training
  /// program wants (the same binary in every role). A daemon (troupe-worker) serves on.
  bool stop_with_chief = false;
  /// One line per event (a peer connected, left or was lost); nullptr: "troupe: <task>: <line>" on
  /// stderr.
  std::function<void(const std::string& line)> log;

  /// The defaults with the TROUPE_* environment applied (malformed: std::invalid_argument).
  static ServerOptions from_environment();
};

/// One task of a cluster, like tf.distribute.Server: a worker runs the functions a
/// ClusterCoordinator schedules (found by name in its FunctionRegistry); a ps task holds variable
/// shards. It listens at its own address in the cluster spec from construction on.
class Server {
 public:
  /// Serves `task_type`:`task_id` of `cluster` ("worker" or "ps"; a "chief" or "evaluator" task
  /// runs no Server). A task that is not in the cluster, or an address it cannot listen on, is
  /// std::invalid_argument / std::runtime_error naming it; a cluster beyond loopback without a
  /// token (and not insecure) is std::invalid_argument naming both ways out.
  Server(Runtime& runtime, const ClusterSpec& cluster, const std::string& task_type, int task_id,
         FunctionRegistry functions = {}, ServerOptions options = ServerOptions::from_environment());
  /// The task the resolver names.
  Server(Runtime& runtime, const ClusterResolver& resolver, FunctionRegistry functions = {},
         ServerOptions options = ServerOptions::from_environment());
  /// Stops serving (as stop()).
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// "host:port" where it listens (the port it got, when the spec said port 0).
  std::string target() const;
  /// "/job:worker/replica:0/task:1".
  const std::string& task() const;
  /// Serves until stop() (or, with stop_with_chief, until the chief leaves).
  void join();
  /// Makes join() return; safe from any thread.
  void stop();

  struct Impl;

 private:
  friend bool serve_if_worker_or_ps(Runtime&, const ClusterResolver&, FunctionRegistry, ServerOptions);
  std::unique_ptr<Impl> impl_;
};

/// For a program that runs in every role (TensorFlow's own examples): when the resolver's task is
/// a "worker" or "ps", serves it with `functions` until its chief leaves and returns true; for any
/// other task returns false at once, and the program goes on as the chief. A chief that has not
/// connected within options.peer_timeout (TROUPE_START_TIMEOUT_MS) is troupe::Error naming the
/// task, so no task is left behind by a chief that failed at start. Once it returned true the
/// process is expected to end: a function still running when the chief left has its waits on the
/// ps tasks ended at once, and 5 s later the process exits with status 0 if it still runs (a
/// function busy in its own code), saying so.
bool serve_if_worker_or_ps(Runtime& runtime, const ClusterResolver& resolver, FunctionRegistry functions,
                           ServerOptions options = ServerOptions::from_environment());

}  // namespace troupe::distribute
