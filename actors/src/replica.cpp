#include <pthread.h>

#include "protocol.hpp"
#include "troupe/transport/spin.hpp"

namespace troupe::actors {
namespace {
thread_local const void* tl_owner = nullptr;
}

const void* replica_thread_owner() { return tl_owner; }

void spin_on_mailbox(caf::blocking_actor* self, std::chrono::microseconds spin, int pause_spins) {
  transport::spin_until([self] { return !self->mailbox().empty(); }, spin, pause_spins);
}

void replica_actor(caf::blocking_actor* self, int replica, std::chrono::microseconds spin, int pause_spins,
                   std::string thread_name, const void* owner) {
  thread_name.resize(std::min<std::size_t>(thread_name.size(), 15));  // the kernel's limit
  pthread_setname_np(pthread_self(), thread_name.c_str());
  tl_owner = owner;
  bool running = true;
  while (running) {
    spin_on_mailbox(self, spin, pause_spins);
    self->receive(
        [&](step_atom, const step_task_ptr& task) {
          // Nothing may escape a handler: an exception would kill the actor and lose the step.
          try {
            (*task->fn)(replica);
          } catch (...) {
            task->errors[static_cast<std::size_t>(replica)] = std::current_exception();
          }
          self->send(caf::actor_cast<caf::actor>(self->current_sender()), done_atom::value, task->step,
                     static_cast<std::int32_t>(replica));
        },
        [&](stop_atom) { running = false; },
        [&](caf::exit_msg&) { running = false; });
  }
  tl_owner = nullptr;
}

}  // namespace troupe::actors
