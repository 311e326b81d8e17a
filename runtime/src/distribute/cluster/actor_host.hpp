#pragma once

// What a task (a Server) or a spawner's own process makes of a spawn: the registered type's
// factory run on the decoded arguments, and a receive that decodes each message's tensors and
// encodes the reply (actors/app_actors.hpp has the protocol, docs/actors.md the API).

#include <string>

#include "troupe/actors/app_actors.hpp"
#include "troupe/distribute/remote_function.hpp"

namespace troupe::distribute::detail {

/// The actor of `type` from `registry` made with the arguments' bytes `args`, hosted on `task`;
/// or (receive empty) an error naming the type and the task: a type the registry lacks (with the
/// types it has), malformed arguments, a factory that threw or returned no actor.
actors::actor_made make_actor(const FunctionRegistry& registry, const std::string& task, const std::string& type,
                              const std::string& args);

}  // namespace troupe::distribute::detail
