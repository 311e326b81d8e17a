#pragma once

// A task's agent (troupe/actors/cluster_tasks.hpp, steps 1 to 6 on the task's side), the pulse
// that answers its chief's heartbeats, and the thread that runs a worker task's functions.
// Internal to actors/.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "app_host.hpp"
#include "caf/all.hpp"
#include "ps_shards.hpp"
#include "troupe/actors/heartbeat_state.hpp"
#include "troupe/actors/task_server.hpp"

namespace troupe::actors {

// Answers the chief's heartbeats apart from the agent (whose thread may be running a function for
// minutes) and watches them: a chief silent for longer than its liveness policy allows (stopped,
// hung) is gone, as if its connection had closed. The chief says its settings in every beat.
struct pulse_state {
  std::optional<heartbeat_state> chief;
  bool ticking = false;
};

/// The pulse: (beat, interval ms, missed) -> bool from the chief; (hello) and (leave) from the agent.
caf::behavior pulse_actor(caf::stateful_actor<pulse_state>* self, std::shared_ptr<const task_handlers> handlers);

// The functions of a worker task: run one at a time, in the order their calls arrived, on a thread
// of their own that the task server owns (a function may run for minutes: never on a scheduler
// thread). The agent queues each call; the thread answers the call's sender in the agent's name.
// The agent itself is an ordinary scheduled actor: CAF 0.17 cannot end an actor system while a
// detached actor is still referenced from anywhere, and a task's agent is referenced from the
// network.
struct function_runner {
  struct call {
    std::uint64_t id = 0;
    std::string function;
    std::string args;
    caf::actor reply_to;
  };
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<call> calls;
  bool stopping = false;
  bool finished = false;          // the thread has returned
  std::string running;            // the function running now, for the stop's message
  caf::actor_addr agent;          // the identity its answers carry
  std::thread thread;

  // Runs calls until stopping; then says finished.
  void run(const task_handlers& handlers);
};

struct agent_state {
  std::string task;
  std::shared_ptr<shard_store> store;  // the shards' cells, shared with the data connections
  std::shared_ptr<std::atomic<std::uint16_t>> data_port;  // 0 or null: no data port (yet)
  std::string data_secret;
  caf::actor pulse;
  std::shared_ptr<const task_handlers> handlers;
  std::map<std::string, caf::actor> shards;
  std::map<caf::actor_addr, std::string> peers;  // who said hello, by the address they said it from
  caf::actor_addr chief;
  std::shared_ptr<function_runner> runner;  // worker tasks: where calls go
  std::uint64_t refused = 0;  // checkpoint messages refused (from anyone but the chief)
  std::uint64_t chiefs_refused = 0;  // hellos as a chief from another process than the chief's
  // Application actors hosted here, by the watch of the spawner that asked for them: a spawner
  // whose watch goes down has its actors stopped.
  std::map<caf::actor_addr, std::vector<caf::actor>> hosted;
  std::map<caf::actor_addr, std::string> spawners;     // a watch, the spawner's task name
  std::map<caf::actor_addr, caf::actor_addr> spawned_for;  // a hosted actor, its spawner's watch
  std::shared_ptr<app_data_host> app_data;  // the actor data port, or null (no actors hosted)
};

/// The agent: hello, leave, table, call, cancel from the chief; vnew, vread, vupdate, data, aspawn
/// and aping from anyone (protocol.hpp lists them).
caf::behavior task_agent(caf::stateful_actor<agent_state>* self, std::string task,
                         std::shared_ptr<const task_handlers> handlers, caf::actor pulse,
                         std::shared_ptr<shard_store> store, std::shared_ptr<std::atomic<std::uint16_t>> data_port,
                         std::string data_secret, std::shared_ptr<function_runner> runner,
                         std::shared_ptr<app_data_host> app_data = nullptr);

}  // namespace troupe::actors
