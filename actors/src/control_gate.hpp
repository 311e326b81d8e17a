#pragma once

// The gate in front of the control plane. CAF 0.17's BASP reserves whatever payload a message
// header declares (up to 4 GiB) before it reads a byte of it, so a middleman must never face a
// stranger unguarded. The gate is a middleman actor of its own, beside CAF's, whose connections
// (the chief's accepted ones and a worker's own to the chief) read through one policy:
//   1. With a cluster token, TLS first (CAF's OpenSSL session, with control_tls's credentials):
//      no BASP byte is parsed before the peer proved the token in the handshake. A handshake that
//      fails, or a connection that closes before it finished, is logged with the peer's address.
//   2. Every BASP header is read by the gate before CAF sees it: a payload larger than
//      gate_limits::max_payload_bytes closes the connection, logged with the peer's address.
//   3. The chief holds at most gate_limits::max_connections connections that have not proven the
//      token (with TLS: whose handshake has not finished; without a token: all of them) at a
//      time. With a token one more pushes out the oldest still in its handshake; without one it
//      is closed at once. Either is logged.
//   4. With a token every handshake has a deadline (gate_limits::handshake_timeout), and a
//      session still in its handshake when the gate goes is closed: neither a member's connection
//      nor the process's exit ever waits on a connection that has not proven itself.
// So strangers make a troupe process hold at most max_connections x (max_payload_bytes or a TLS
// session's buffers) for control messages, token or not. Internal to actors/.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <mutex>

#include "caf/actor.hpp"
#include "caf/expected.hpp"
#include "caf/fwd.hpp"
#include "caf/io/middleman_actor.hpp"

namespace troupe::actors {

/// What one control-plane peer may make a process hold.
struct gate_limits {
  /// The largest BASP payload accepted (the peer table of a big cluster is well under it).
  std::uint32_t max_payload_bytes = 64 * 1024;
  /// Connections the chief's listener holds at once before they proved the token (all of them
  /// without a token). With a token a new one pushes out the oldest still in its TLS handshake;
  /// without one, a new one is refused.
  int max_connections = 64;
  /// With a token, the longest a TLS handshake may take, either way; a session still in its
  /// handshake then (or when the gate goes) is closed and logged.
  std::chrono::milliseconds handshake_timeout{5000};
  /// The limits for a cluster of `workers`: 64 KiB plus 1 KiB per worker, 16 + 4 per worker
  /// connections.
  static gate_limits for_cluster(int workers);
  /// The limits of the cluster tasks (Server, the coordinator's connections): their messages
  /// carry tensors and variable shards, so a payload may be as large as BASP carries (4 GiB);
  /// with a token that is only after the peer proved it. 64 unproven connections at once.
  static gate_limits for_tasks();
};

struct gate_shared;
class cluster_health;

/// A middleman actor whose connections go through the gate; publishes, connects and unpublishes
/// like CAF's (the connections join the same BASP broker). Destroying it stops its actor; the
/// connections it made live on in the broker.
/// Asks a middleman (CAF's own, its OpenSSL one, or a gate's) for the actor published at
/// host:port, waiting at most `wait`: CAF's remote_actor waits for the peer's handshake without a
/// bound, so a peer that accepts and says nothing would hold the caller forever.
caf::expected<caf::actor> connect_bounded(caf::actor_system& system, const caf::io::middleman_actor& middleman,
                                          const std::string& host, std::uint16_t port, std::chrono::milliseconds wait);

class control_gate {
 public:
  /// `tls`: every connection is mutual TLS with the credentials installed in `system`'s config
  /// (control_credentials::install) first. Every refusal the log shows is recorded in `health`
  /// too (when set), with the peer's address.
  control_gate(caf::actor_system& system, bool tls, gate_limits limits,
               std::shared_ptr<cluster_health> health = nullptr);
  ~control_gate();
  control_gate(const control_gate&) = delete;
  control_gate& operator=(const control_gate&) = delete;

  /// Publishes `whom` at host:port (0: any free port); the port, or the error.
  caf::expected<std::uint16_t> publish(const caf::actor& whom, std::uint16_t port, const std::string& host);
  /// Connects to the actor published at host:port, waiting at most `wait`.
  caf::expected<caf::actor> remote_actor(const std::string& host, std::uint16_t port, std::chrono::milliseconds wait);
  /// Stops publishing `whom` at `port` (waits at most 1 s for the middleman).
  void unpublish(const caf::actor& whom, std::uint16_t port);

  /// Connections refused or failed before they proved themselves, so far.
  std::uint64_t refused() const;
  /// The gate's middleman actor, for connect_bounded and requests of one's own.
  const caf::io::middleman_actor& actor() const noexcept { return actor_; }

 private:
  caf::actor_system& system_;
  std::shared_ptr<gate_shared> shared_;
  caf::io::middleman_actor actor_;
  // With a token: closes the sessions whose handshake outlived its deadline.
  std::thread watchdog_;
  std::mutex watchdog_mutex_;
  std::condition_variable watchdog_cv_;
  bool stopping_ = false;
};

}  // namespace troupe::actors
