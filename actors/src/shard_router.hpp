#pragma once

// The router of a worker's (or the chief's) requests to the ps tasks (troupe/actors/cluster_tasks.hpp,
// step 5). Internal to actors/.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "troupe/actors/cluster_task_types.hpp"

namespace troupe::actors {

// Carries a worker's requests to the ps agents and answers each exactly once: with the reply,
// with the request's timeout, or, as soon as that ps agent goes down, with its loss (a request in
// flight to a dead peer would otherwise wait for its whole timeout). It also reaches the ps
// agents for a worker (reach_atom), so that a task that stops can end every wait of a function
// still running at once (cancel_atom): from then on it answers everything with the reason.
/// By ps task: how often its agent went down (or was declared gone) so far, counted by the router
/// for whoever keeps state about that task's connection (a worker's data connections: a ps task
/// restarted since they were made is another process).
using ps_loss_counts = std::vector<std::atomic<std::uint64_t>>;

struct router_state {
  std::vector<caf::actor> agents;
  std::vector<std::map<std::uint64_t, caf::response_promise>> pending;  // by ps task
  std::vector<std::vector<caf::response_promise>> reaching;  // by ps task: waiting for its reach
  std::uint64_t next = 0;
  std::optional<std::string> cancelled;  // why, once the task stops
};

/// (reach, p) -> bool; (wup, p, agent) -> bool; (vread, p, key) -> bytes; (data, p) -> the data
/// port and secret; (vnew, p, key, bytes) -> bool; (vupdate, p, key, op, bytes) -> bool; (gone, p,
/// reason); (cancel, why). `mm` is the middleman it connects through (a control gate's); `losses`
/// (may be null) counts each ps task's losses.
caf::behavior shard_router(caf::stateful_actor<router_state>* self, std::vector<task_endpoint> ps,
                           std::chrono::milliseconds timeout, std::string self_task, caf::io::middleman_actor mm,
                           std::shared_ptr<ps_loss_counts> losses);

}  // namespace troupe::actors
