#pragma once

// The messages between the coordinator and its replica actors. Internal to actors/.

#include <chrono>
#include <cstdint>
#include <string>
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "caf/all.hpp"

namespace troupe::actors {

/// One step for every replica: the function, and a slot per replica for what it threw.
struct step_task {
  std::uint64_t step = 0;
  const std::function<void(int)>* fn = nullptr;   // owned by the caller of run_step, which waits
  std::vector<std::exception_ptr> errors;         // replica r writes only errors[r]
};

using step_task_ptr = std::shared_ptr<step_task>;

using step_atom = caf::atom_constant<caf::atom("step")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;

/// The body of a replica actor: a detached blocking actor that runs step messages until told to
/// stop. Answers (done_atom, step, replica) to the sender of each step.
void replica_actor(caf::blocking_actor* self, int replica, std::chrono::microseconds spin, int pause_spins,
                   std::string thread_name, const void* owner);

/// The coordinator whose replica runs on the calling thread, or nullptr.
const void* replica_thread_owner();

/// Spins until the actor's mailbox has a message or the budget is spent.
void spin_on_mailbox(caf::blocking_actor* self, std::chrono::microseconds spin, int pause_spins);

}  // namespace troupe::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::step_task_ptr)
