#pragma once

// Actors an application spawns on the tasks of its cluster (docs/actors.md), below the runtime's
// tensors: here a message is a name and an opaque payload of bytes, which the runtime encodes and
// decodes (every length checked). The protocol, numbered as it happens:
//   1. A spawner (actor_client, in any process of the cluster) connects to a task's agent through
//      its own control gate, exactly as the chief's dispatcher does (TLS with the token first), and
//      asks (aspawn, its task name, its watch actor, type, arguments). The agent asks its task's
//      handler for the type (registered by name only: a name from the network never reaches a
//      file or dlopen), spawns the actor, monitors it and the watch, and answers the actor's handle
//      or an error naming the type and the task.
//   2. Requests go straight to that handle from the caller's thread, (amsg, token, name, payload)
//      answered by (areply, token, ...), over the same gated connection (BASP routes by node). The
//      hosted actor is detached (a thread of its own: an actor's code may run long), handles one
//      message at a time, and refuses a name or payload beyond app_message_limits before it
//      decodes a byte. One-way messages go in batches (asendv) from the spawner's requester and are
//      acknowledged (send_window): a sender waits once a window's worth is unanswered.
//   3. Supervision: the spawner monitors every actor it spawned; a connection that closes (the
//      host process died) fires the monitor at once, with the cause. The spawner also asks every
//      agent that hosts one of its actors (aping) each heartbeat interval: an agent silent for
//      more than `missed` intervals (a stopped or hung process, whose connection stays open) has
//      its actors reported down, naming the task and the silence.
//   4. A spawner that leaves (its actor_client destroyed, its process ended or its connection
//      lost) has its watch go down on every agent it spawned on: each stops that spawner's actors.
//      A task that stops (its Server destroyed) stops every actor it hosts.
// The data connections (actor_client_options::data_connections, on by default), beside step 2:
//   5. A task that hosts actors opens one actor data port at the first spawn it takes (a
//      transport::bulk_listener on the task's host, a free port) with a fresh random secret, and
//      the spawn's answer over the gated control plane carries the port, the actor's number on it
//      and the secret. The spawner keeps one data connection per task and proves it as the ps
//      tasks' are proven (bulk_channel.hpp: ring_connect's hellos, HMAC under the cluster token,
//      the secret as the incarnation): a peer without the token, or without the secret that only
//      the gate's peers get, is refused and logged before a byte of a message is read. A spawner
//      that cannot connect uses step 2 for that task's actors (said in its log).
//   6. Frames: a 16-byte header (magic, record count 1..256, body bytes), then the records, each
//      a 32-byte header (kind, status, name bytes, request number, the actor's number, payload
//      bytes), its name, its payload; with a token, one AES-256-GCM tag per frame, checked before
//      a record of it is handed on. Every count and length is checked before what it counts is
//      read: a name beyond app_message_limits::max_name_bytes, a payload beyond
//      max_payload_bytes (an error's text beyond 64 KiB), a kind the direction does not carry or
//      records that overrun the body drop the connection, naming the peer. Kinds: to the host a
//      request, a one-way send (its status asks for an acknowledgement: it fills the
//      send_window) and a stop; to the spawner a reply (ok, the actor's error, or no such actor)
//      and a send acknowledgement (the count so far).
//   7. Writes: the caller's thread writes a synchronous request (the payload from where it is,
//      with one writev), after whatever waited to be written; asynchronous requests, sends and
//      stops queue for the connection's writer thread, which writes what gathered as frames. The
//      spawner's reader thread completes each reply's request (a synchronous caller waits on its
//      own state) and ends the asynchronous ones past their deadline. On the host, the
//      connection's reader hands a frame's records for each actor to its mailbox as one message
//      (handled one at a time with those of step 2, in order; a stop after the messages before
//      it); the actor's thread writes the replies back, together once no more of that
//      connection's messages to it wait (at most 256 to a frame).
//   8. A data connection that closes or fails ends its requests in flight at once as down, naming
//      the task and the cause; its actors are reported down one heartbeat interval later unless
//      the control connection said why first (a process that dies closes both), and stopped. The
//      heartbeats of step 3 still watch the host.

#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "troupe/actors/cluster_task_types.hpp"
#include "troupe/actors/liveness_policy.hpp"

namespace troupe::actors {

/// The bounds on one application message, checked by the host before it decodes it.
struct app_message_limits {
  static constexpr std::size_t max_name_bytes = 256;
  static constexpr std::size_t max_payload_bytes = std::size_t{1} << 30;  ///< 1 GiB
};

/// The back-pressure on one actor's one-way messages (actor_client::send): at most max_messages
/// or max_bytes (one message always fits) sent and not yet acknowledged by the actor. It
/// acknowledges every ack_every-th, and the one that fills the window, with its count so far. So a
/// flood of sends waits for the actor instead of queueing without bound ahead of everything else
/// on the connection (the heartbeats among them).
class send_window {
 public:
  static constexpr std::size_t max_messages = 1024;
  static constexpr std::size_t max_bytes = std::size_t{64} << 20;  ///< 64 MiB
  static constexpr std::uint64_t ack_every = 64;

  /// Takes room for a message of `bytes`, waiting at most `wait`; false when it did not fit. `ack`
  /// says whether the message must ask for its acknowledgement (it fills the window).
  bool reserve(std::size_t bytes, bool* ack, std::chrono::milliseconds wait);
  /// The actor acknowledged its first `count` messages.
  void acknowledged(std::uint64_t count);
  /// Messages sent and not yet acknowledged.
  std::size_t outstanding() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable opened_;
  std::deque<std::size_t> sizes_;  // of the unacknowledged messages, in order
  std::size_t outstanding_bytes_ = 0;
  std::uint64_t acked_ = 0;
};

/// What an application actor does with one message: the reply's bytes (ok) or an error's text.
/// Called on the actor's own thread, one message at a time.
using actor_receive = std::function<call_reply(const std::string& name, const std::string& payload)>;

/// What a task's handler makes of a spawn: the actor's receive, or (receive empty) why not.
struct actor_made {
  actor_receive receive;
  std::string error;
};

/// Makes an actor of a registered type from its constructor arguments' bytes (on the task).
using actor_factory = std::function<actor_made(const std::string& type, const std::string& args)>;

/// How an actor ended, as its spawner hears it.
struct actor_down {
  std::uint64_t id = 0;
  std::string type;
  std::string task;   ///< where it ran ("local" for the spawner's own process)
  std::string cause;  ///< why: its host's connection closed, its host went silent, it was stopped
  bool host_lost = false;  ///< its host's process died, went silent or stopped (not: stopped by its spawner)
  bool stopped = false;    ///< stopped by its spawner (stop), not lost
};

/// The outcome of a request.
struct actor_reply {
  enum class status { ok, failed, timed_out, down };
  status what = status::failed;
  std::string payload;  ///< the reply's bytes (ok), else the error's text
};

/// What an actor_client is given.
struct actor_client_options {
  std::string task = "/job:chief/replica:0/task:0";  ///< its own name, said with every spawn
  std::shared_ptr<control_credentials> credentials;  ///< nullptr: plain BASP (loopback only)
  liveness_policy liveness;                          ///< how often hosts are asked, and how long they may be silent
  std::chrono::milliseconds connect_timeout{10000};  ///< reaching a task and its answer to a spawn
  std::function<void(const actor_down&)> on_down;    ///< once per actor that goes down (an actor thread)
  std::function<void(const std::string& line)> log;  ///< one line per event
  /// Messages to an actor on a task with an actor data port go over a data connection to it
  /// (steps 5 to 8); false: over the control plane only.
  bool data_connections = true;
};

class actor_ref;

/// One process's spawner: spawns actors on tasks (or locally), talks to them, and watches them.
class actor_client {
 public:
  actor_client(caf::actor_system& system, actor_client_options options);
  /// Stops the local actors; the remote ones stop as their hosts see this spawner's watch go.
  ~actor_client();
  actor_client(const actor_client&) = delete;
  actor_client& operator=(const actor_client&) = delete;

  /// Spawns `type` with `args` on the task at `where`. A task that is not listening yet (nothing
  /// accepts the connection, or its agent is not published yet) is tried again, with growing
  /// pauses, for up to `wait_listening`. Throws std::runtime_error whose message names the task
  /// and says why (it cannot be reached, or nothing listened there within `wait_listening`; it
  /// refused the connection; it refused the type).
  std::shared_ptr<actor_ref> spawn(const task_endpoint& where, const std::string& type, const std::string& args,
                                   std::chrono::milliseconds wait_listening = std::chrono::milliseconds(0));
  /// Spawns an actor running `receive` in this process.
  std::shared_ptr<actor_ref> spawn_local(const std::string& type, actor_receive receive);

  /// A request and its reply, waiting at most `timeout`; it ends as down once the actor is known
  /// to be down, even when its host died with the request in flight.
  actor_reply request(const actor_ref& to, const std::string& name, const std::string& payload,
                      std::chrono::milliseconds timeout);
  /// The same without waiting: `done` runs once with the outcome, on a runtime thread (or on
  /// this one, at once, for an actor known to be down or a client that is gone). Keep it short.
  void request_async(const actor_ref& to, const std::string& name, std::string payload,
                     std::chrono::milliseconds timeout, std::function<void(actor_reply)> done);
  /// A one-way message; false when the actor is known to be down. Waits while the actor's
  /// send_window is full (until it acknowledges, or is found down).
  bool send(const actor_ref& to, const std::string& name, const std::string& payload);
  /// Stops the actor (its spawner hears it as down: "stopped by its spawner").
  void stop(const actor_ref& to);
  /// Why the actor is down, or nothing while it runs.
  std::optional<std::string> down(const actor_ref& of) const;
  /// The actor's number, type and task.
  static std::uint64_t id(const actor_ref& of);
  static const std::string& type(const actor_ref& of);
  static const std::string& task(const actor_ref& of);

  struct impl;

 private:
  actor_reply request_over_data(const actor_ref& to, const std::string& name, const std::string& payload,
                                std::chrono::milliseconds timeout);
  std::shared_ptr<impl> impl_;
};

}  // namespace troupe::actors
