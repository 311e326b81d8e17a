#pragma once

// The hosted side of an application actor (app_actors.hpp has the walkthrough): the CAF actor that
// runs an actor_receive, on a task for a remote spawner or in the spawner's own process, and the
// task's actor data port (steps 5 to 8 of the walkthrough). Internal to actors/.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "caf/all.hpp"
#include "troupe/actors/app_actors.hpp"

namespace troupe::actors {

/// Spawns an actor of `type` running `receive`: detached (its own thread), one message at a
/// time; (amsg, name, payload) -> payload, or an error carrying the actor's text; a name or a
/// payload beyond app_message_limits is refused before `receive` sees it. Messages from the
/// actor data port reach it in its mailbox too (one at a time with the others, in order).
caf::actor spawn_hosted(caf::actor_system& system, std::string type, actor_receive receive);

/// A task's actor data port: one listener (from the first spawn that asks for it), its secret,
/// and the hosted actors by their number on it. Each proven connection has a reader thread that
/// hands every message to its actor's mailbox; the actor writes the reply back itself.
class app_data_host {
 public:
  /// `token`: the cluster token (empty: none); `event`: one line per event (may be empty).
  app_data_host(std::string task, std::string host, std::string token, std::chrono::milliseconds timeout,
                std::function<void(const std::string&)> event);
  ~app_data_host();
  app_data_host(const app_data_host&) = delete;
  app_data_host& operator=(const app_data_host&) = delete;

  /// Registers a hosted actor and says how a spawner reaches it: the port (2 bytes,
  /// little-endian), the actor's number (8 bytes, little-endian), then the port's secret; empty
  /// when the port cannot listen (said once through `event`; the spawner uses the control plane).
  std::string add(const caf::actor& a);
  /// A hosted actor ended: messages to its number are refused from now on.
  void remove(const caf::actor_addr& a);
  /// Stops listening and ends every connection (each thread joined).
  void stop();

  struct impl;

 private:
  std::shared_ptr<impl> impl_;
};

}  // namespace troupe::actors
