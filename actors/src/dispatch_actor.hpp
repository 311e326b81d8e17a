#pragma once

// The chief's dispatch actor (troupe/actors/cluster_tasks.hpp, steps 2 to 6 on the chief's side):
// it schedules closures onto the workers by dispatch_state's rules and watches every task by
// heartbeat_state's. Internal to actors/.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "caf/all.hpp"
#include "control_gate.hpp"
#include "troupe/actors/closure_watch.hpp"
#include "troupe/actors/dispatch_state.hpp"
#include "troupe/actors/dispatcher.hpp"
#include "troupe/actors/heartbeat_state.hpp"
#include "troupe/actors/liveness_policy.hpp"
#include "troupe/actors/ps_cluster_board.hpp"

namespace troupe::actors {

// What the dispatcher's object, its connector thread and its actor share.
struct dispatcher::impl {
  caf::actor_system* system = nullptr;
  dispatcher_options options;
  std::unique_ptr<control_gate> gate;  // every connection to the tasks
  std::function<void(closure_outcome)> on_done;
  std::function<void(const std::string&, const std::string&)> on_ps_lost;
  std::function<void(int, const std::string&, const std::string&)> on_ps_down;  // may be empty
  std::function<void(int, const std::string&)> on_ps_back;                      // may be empty
  std::function<void(const std::string&)> log;
  caf::actor actor;
  caf::actor router;  // the chief's own requests to the ps tasks, failed at once when one is lost
  std::vector<caf::actor> ps;
  std::vector<caf::actor> ps_pulse;  // what answers each ps task's heartbeats
  std::unique_ptr<std::atomic<bool>[]> connected;  // by worker: set by the connector, cleared on loss
  std::atomic<std::uint64_t> retried{0};
  std::atomic<std::uint64_t> lost{0};
  std::atomic<int> up{0};
  std::shared_ptr<ps_cluster_board> board;  // written by the actor, read by the dashboard
  std::atomic<std::int64_t> connect_retry_ms{200};
  std::atomic<std::int64_t> ps_restart_wait_ms{0};  // 0: a lost ps task is lost for good at once
  // By ps task: while it is awaited after a loss, when the wait ends (steady clock, ns); 0 when
  // it is up. Set by the actor, cleared by the connector once it reached it again or gave up.
  std::unique_ptr<std::atomic<std::int64_t>[]> ps_awaited_until;
  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  std::thread connector;

  void say(const std::string& line) {
    if (log) log(line);
  }
};

struct closure_record {
  std::string function;
  std::string args;
  std::string given_up_on;  // the worker it ran past the stall shutdown bound on, if any
};

struct dispatch_actor_state {
  std::optional<dispatch_state> rules;
  std::optional<heartbeat_state> worker_beats;
  std::optional<heartbeat_state> ps_beats;
  std::optional<closure_watch> watch;  // closures running past the stall bounds
  std::vector<caf::actor> workers;
  std::vector<caf::actor> worker_pulses;
  std::vector<bool> ps_down;  // by ps task: lost and awaited (or lost for good): no beats, no second loss
  std::unordered_map<std::uint64_t, closure_record> closures;
  std::string table;
  bool has_table = false;
  bool leaving = false;  // the chief is done: tasks that stop now are no loss
  // TensorFlow's rules after a closure failed (its ClosureQueue): from the failure until the
  // coordinator raises it, a closure whose worker is lost is cancelled, not run again; while the
  // coordinator raises it, everything queued is cancelled and closures in flight finish.
  bool failed = false;
  bool cancelling = false;
  liveness_policy liveness;  // the settings the tasks hear with every beat
};

using dispatch_self = caf::stateful_actor<dispatch_actor_state>;

/// The dispatch actor (protocol.hpp lists its messages).
caf::behavior dispatch_actor(dispatch_self* self, std::shared_ptr<dispatcher::impl> d);

}  // namespace troupe::actors
