#pragma once

// The hosted side of an application actor (app_actors.hpp has the walkthrough): the CAF actor that
// runs an actor_receive, on a task for a remote spawner or in the spawner's own process.
// Internal to actors/.

#include <string>

#include "caf/all.hpp"
#include "troupe/actors/app_actors.hpp"

namespace troupe::actors {

/// Spawns an actor of `type` running `receive`: detached (its own thread), one message at a
/// time; (amsg, name, payload) -> payload, or an error carrying the actor's text; a name or a
/// payload beyond app_message_limits is refused before `receive` sees it.
caf::actor spawn_hosted(caf::actor_system& system, std::string type, actor_receive receive);

}  // namespace troupe::actors
