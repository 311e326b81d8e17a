#pragma once

// What the chief's other parts (sharded checkpoints) reach of a ParameterServerStrategy.

#include <chrono>

#include "troupe/actors/dispatcher.hpp"
#include "troupe/distribute/parameter_server_strategy.hpp"

namespace troupe::distribute::detail {

struct PsAccess {
  /// The chief's dispatcher: its requests to the ps tasks.
  static actors::dispatcher& dispatcher(ParameterServerStrategy& s);
  /// ServerOptions::peer_timeout: the bound of each request.
  static std::chrono::milliseconds timeout(ParameterServerStrategy& s);
};

}  // namespace troupe::distribute::detail
