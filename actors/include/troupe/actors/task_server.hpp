#pragma once

// One task of a cluster listening for its peers: its agent, its ps shards and their data port
// (cluster_tasks.hpp has the walkthrough: steps 1, 3, 5, 5a, 5b and 6).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/app_actors.hpp"
#include "troupe/actors/cluster_task_types.hpp"

namespace troupe::actors {

/// What a task agent does with what it receives. `call` runs on the task's function thread, one
/// call at a time; the others on the agent's actor (layout and combine also on a data
/// connection's thread, or a shard actor's), so they may run while a function does.
struct task_handlers {
  /// Runs a function (worker tasks).
  std::function<call_reply(const std::string& function, const std::string& args)> call;
  /// Takes the variables' layout (worker tasks).
  std::function<void(const std::string& blob)> table;
  /// Applies an update to a shard's bytes in place; an error message, or nothing (ps tasks).
  std::function<std::optional<std::string>(std::string& value, update_op op, const std::string& delta)> update;
  /// Where a shard's elements lie (ps tasks; an error message when its bytes are malformed). Set:
  /// the task listens on a data port.
  std::function<std::optional<shard_layout>(const std::string& value)> layout;
  /// Applies `nbytes` bytes of raw elements of `dtype` at `delta` to `value`; the caller checked
  /// dtype and size against the shard's layout, and the op byte the peer sent. An error message,
  /// or nothing.
  std::function<std::optional<std::string>(char* value, const char* delta, std::size_t nbytes, std::uint8_t dtype,
                                           update_op op)>
      combine;
  /// Applies an optimizer update to `nbytes` of elements of `dtype` at `value` (a whole shard, or
  /// one row of it), with the gradient's elements at `grad` and the shard's slots at slots[0..
  /// slot_count(p.kind)) (the same size, zeros before the first update); `step` numbers the
  /// optimizer updates of this shard from 1 (Adam's bias correction). The caller checked dtype
  /// and size against the shard's layout. An error message, or nothing (ps tasks).
  std::function<std::optional<std::string>(char* value, char* const* slots, const char* grad, std::size_t nbytes,
                                           std::uint8_t dtype, const apply_params& p, std::int64_t step)>
      apply;
  /// Writes `shards` and `step` to the file `path` of a sharded checkpoint (ps tasks; the agent
  /// checked the path with check_shard_checkpoint_target); sets the file's size and its XXH64.
  /// An error message, or nothing.
  std::function<std::optional<std::string>(const std::string& path, std::int64_t step,
                                           const std::vector<shard_snapshot>& shards, std::uint64_t& file_bytes,
                                           std::uint64_t& file_hash)>
      save;
  /// Makes an application actor of a registered type from its arguments' bytes (app_actors.hpp);
  /// unset: the task hosts no actors. Runs on the agent's actor: it only looks the type up and
  /// constructs the actor.
  actor_factory spawn_actor;
  /// One line per event: a peer connected, left or was lost.
  std::function<void(const std::string& line)> event;
  /// A chief connected.
  std::function<void()> chief_came;
  /// The chief that connected has left or was lost.
  std::function<void()> chief_gone;
  /// The task stops: a function still running should give up what it waits for, now (worker
  /// tasks). Called once, from the task server's destructor, while the function may still run.
  std::function<void()> cancel;
};

/// A task server's data port (ps tasks: where the shards' bytes travel).
struct task_server_options {
  std::uint16_t data_port = 0;                   ///< 0: a free port the system picks
  std::chrono::milliseconds data_timeout{60000};  ///< a data connection silent mid-frame this long is dropped
};

/// One task of a cluster listening for its peers: the task agent, published through the
/// middleman (CAF's OpenSSL module with a token). Destruction unpublishes it and stops it.
class task_server {
 public:
  /// Listens on host:port (port 0: any free port), and a ps task (one whose handlers have layout
  /// and combine) on its data port too. Throws std::runtime_error naming the address when it
  /// cannot listen.
  task_server(caf::actor_system& system, std::string task, std::string host, std::uint16_t port,
              std::shared_ptr<control_credentials> credentials, task_handlers handlers,
              task_server_options options = {});
  ~task_server();
  task_server(const task_server&) = delete;
  task_server& operator=(const task_server&) = delete;

  /// The port it listens on.
  std::uint16_t port() const noexcept;

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::actors
