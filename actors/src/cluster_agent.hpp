#pragma once

// The chief's cluster agent as rendezvous.cpp and elastic_join.cpp share it: the agent's state,
// the checks every handler makes on a sender, and a worker's way to the chief. rendezvous.cpp
// holds the start (join, await, the watch, faults); elastic_join.cpp the joins into a running
// cluster (enlist, admit, refuse) and a joiner's side. Internal to actors/.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "caf/all.hpp"
#include "control_gate.hpp"
#include "control_tls.hpp"
#include "troupe/actors/cluster_health.hpp"
#include "troupe/actors/rendezvous.hpp"
#include "troupe/actors/rendezvous_state.hpp"
#include "troupe/actors/stall_inspector.hpp"
#include "troupe/actors/worker_report.hpp"

namespace troupe::actors {

using table_promise = caf::typed_response_promise<std::vector<member>>;

// The chief's agent: rendezvous_state decides, this actor delivers.
struct chief_agent_state {
  std::optional<rendezvous_state> rules;
  std::vector<table_promise> waiting;  // joined workers and the chief, until the table or a failure
  std::vector<caf::actor> watchers;    // by rank, once watching
  // A member's beat before the watch began: its watcher, its peer, and its last report (which
  // may carry lines that will not travel again).
  struct early_beat {
    caf::actor watcher;
    std::string peer;
    std::optional<worker_report> report;
  };
  std::map<std::int32_t, early_beat> early;
  std::uint64_t refused = 0;           // messages refused, for the log's bound
  std::shared_ptr<cluster_health> health;  // may be null
  stall_options stall;                     // the inspector's bounds
  std::optional<stall_inspector> stalls;   // once the watch began
  // Elastic membership: the joins waiting for a step boundary, by key, with their answers.
  std::shared_ptr<join_queue> joins;
  struct pending_join {
    caf::typed_response_promise<join_answer> answer;
    std::string peer;
  };
  std::map<std::int64_t, pending_join> pending;
  std::int64_t next_key = 1;
};

struct cluster_watch::impl {
  caf::actor_system* system = nullptr;
  std::shared_ptr<control_credentials> credentials;  // kept while the chief's agent listens
  std::unique_ptr<control_gate> gate;                // the chief's listener goes through it
  caf::actor agent;      // the chief's agent (kept published on the chief)
  bool chief = false;
  std::uint16_t port = 0;
  caf::actor beat;       // this worker's heartbeat actor
  std::int32_t rank = 0;
};

// Who sent the message being handled: its node, or a name no member has when it came without a
// sender.
std::string peer_of(caf::local_actor* self);

// A refusal goes to the log with the sender's address (the BASP broker knows which connection a
// node came through); a flood of them is logged at powers of two only, so the log stays bounded
// too.
void log_refusal(caf::stateful_actor<chief_agent_state>* self, const std::string& what);

// A failed request's message: ours as the chief wrote it, CAF's rendered.
std::string describe(caf::actor_system& system, const caf::error& e);

// Whether the system was configured with troupe's message types (add_rendezvous_types).
bool knows_rendezvous_types(const caf::actor_system& system);

// A worker's connection to the chief's agent, retried until options.timeout.
caf::actor reach_chief(caf::actor_system& system, const rendezvous_options& options, control_gate& gate, bool tls);

// A worker's heartbeat actor (rendezvous.hpp's cluster_watch): beats to `agent` as `rank` every
// `interval`, watches the chief, and reports each lost rank once to on_failure.
caf::actor spawn_heartbeat(caf::actor_system& system, const caf::actor& agent, std::int32_t rank,
                           std::chrono::milliseconds interval, const rendezvous_options& options,
                           std::function<void(int, const std::string&)> on_failure);

// The agent's handlers for joins into a running elastic cluster (elastic_join.cpp): enlist from a
// joiner, admit and refuse from the chief's own training loop.
caf::message_handler join_handlers(caf::stateful_actor<chief_agent_state>* self);

}  // namespace troupe::actors
