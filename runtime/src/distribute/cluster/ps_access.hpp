#pragma once

// What the chief's other parts (sharded checkpoints) reach of a ParameterServerStrategy.

#include <chrono>
#include <functional>
#include <vector>

#include "troupe/actors/dispatcher.hpp"
#include "troupe/distribute/parameter_server_strategy.hpp"

namespace troupe::distribute::detail {

struct PsAccess {
  /// The chief's dispatcher: its requests to the ps tasks.
  static actors::dispatcher& dispatcher(ParameterServerStrategy& s);
  /// ServerOptions::peer_timeout: the bound of each request.
  static std::chrono::milliseconds timeout(ParameterServerStrategy& s);
  /// Calls `hook` with each function's result that arrives from now on, and the index of the
  /// worker that ran it (the cluster's worker order, as the dispatcher's board counts them), on
  /// the dispatcher's thread before the RemoteValue is ready; an empty function stops it.
  static void on_result(ParameterServerStrategy& s, std::function<void(int, const std::vector<Tensor>&)> hook);
};

}  // namespace troupe::distribute::detail
