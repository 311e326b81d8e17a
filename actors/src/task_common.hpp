#pragma once

// What every part of a cluster of tasks uses (troupe/actors/cluster_tasks.hpp has the
// walkthrough): errors as values, a task's address in messages, the check of a task's answer to
// hello, and connections through the control gate. Internal to actors/.

#include <chrono>
#include <cstdint>
#include <string>

#include "caf/all.hpp"
#include "control_gate.hpp"
#include "troupe/actors/cluster_task_types.hpp"

namespace troupe::actors {

/// An error's own message when it carries one (ours do), else CAF's rendering.
std::string error_text(caf::actor_system& system, const caf::error& e);

/// A caf::error carrying `text` as its message (error_text gives it back).
caf::error runtime_error(std::string text);

/// "host:port", for messages.
std::string address_of(const std::string& host, std::uint16_t port);

/// What a task's answer to hello says about it: nothing wrong, or why it is not the task meant.
caf::error check_hello(const task_endpoint& t, const std::string& name, const caf::actor& pulse);

/// Connects to a task's agent through `gate` (every connection of the cluster tasks, made or
/// accepted, goes through a control gate: control_gate.hpp), within `wait`.
caf::expected<caf::actor> connect_to_task(caf::actor_system& system, const control_gate& gate, const std::string& host,
                                          std::uint16_t port, std::chrono::milliseconds wait);

}  // namespace troupe::actors
