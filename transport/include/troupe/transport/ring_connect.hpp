#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/transport/ring_link.hpp"

namespace troupe::transport {

/// Where a rank hashes the integrity tags of its large frames (64 KiB and up; with a token):
/// `beside`: on a thread of its own beside the rank's, while the frame's bytes move; `in_line`:
/// on the rank's thread, as the bytes go out and come in; `automatic`: beside where the machine
/// has two cores for each rank of the ring, else in line (on loopback the ranks' threads keep
/// the cores busy, and the hashing thread would take a core from another rank; between
/// machines the link, not the CPU, is the bound).
enum class tag_hashing { automatic, beside, in_line };

/// What every ring connection proves, both ways, before a frame is trusted.
struct ring_auth {
  /// The cluster token (TROUPE_CLUSTER_TOKEN); never sent. Empty: the proof still binds the
  /// incarnation, which keeps out strangers who do not know it, but not those who can learn it
  /// (anyone who can join an untokened rendezvous).
  std::string token;
  /// This start of the cluster: the chief's random value, handed out by the rendezvous with the
  /// peer table. A hello made for another incarnation fails the proof.
  std::string incarnation;
};

/// A listening TCP socket (IPv4, SO_REUSEADDR); port 0 picks a free one. `host` is an IPv4
/// address ("0.0.0.0": every interface); anything else is std::invalid_argument.
class listener {
 public:
  listener(const std::string& host, std::uint16_t port);
  ~listener();
  listener(const listener&) = delete;
  listener& operator=(const listener&) = delete;
  /// The port it listens on (the one picked when 0 was asked for).
  std::uint16_t port() const noexcept { return port_; }
  /// The listening socket's descriptor, owned by the listener.
  int fd() const noexcept { return fd_; }

 private:
  struct impl;  // the Boost.Asio acceptor
  std::unique_ptr<impl> impl_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

/// Forms `rank`'s two connections of a ring of `size` over TCP, all within `timeout` (0: no bound):
///  1. connects to peers[rank+1], retrying while nobody listens there yet (each attempt bounded
///     too: a host that drops SYNs would otherwise hold connect() for minutes);
///  2. meanwhile accepts every connection that comes to `own` and runs the proof with each at
///     once, until one proves to be rank-1; the others are refused;
///  3. the proof, three hellos (troupe's magic, `version`, the sender's rank and the ring size in
///     each):
///     a. the connecting rank c sends a fresh 16-byte nonce Nc;
///     b. the accepting rank a checks the hello (version, c == a-1, size) and answers with its own
///        fresh nonce Na and P_a = HMAC-SHA256(token, "accepting" | version | incarnation | size |
///        c | a | Nc | Na);
///     c. c checks P_a and answers with P_c, the same over "connecting"; a checks it;
///     d. a acknowledges (a hello with neither nonce nor proof). c counts the connection as made
///        only then: one that a closes first (pushed out by strangers while it proved itself) is
///        tried again until the deadline.
///     Each side's nonce makes the other's proof fresh: a hello recorded from another connection
///     or another incarnation of the cluster fails, and the two sides' proofs differ, so neither
///     can be reflected back. The token itself never travels.
/// A connection to `own` that fails the proof (a stranger, another version, a replayed hello,
/// bytes that are no hello, a wrong rank) is refused and logged on stderr with its remote
/// address, one line, and the ring goes on waiting for rank-1 until the deadline; one that says
/// nothing is closed, and logged, once the ring is formed. At most 32 prove themselves at once: a
/// newer one pushes out the oldest (rank-1, if pushed out, connects again). A stranger is never
/// named as a rank.
/// When the listener at peers[rank+1] fails the proof, the connection is logged, dropped and tried
/// again until the deadline.
/// Both sockets come back non-blocking with Nagle off (a ring step's last segment must not wait
/// for an ACK). A peer that is not there or has not proven itself in time is a peer_error naming
/// it. With one rank there is nothing to connect: null.
/// With a token, `hashing` says where a rank hashes its large frames' tags (tag_hashing).
std::unique_ptr<ring_link> connect_ring(int rank, int size, listener& own, const std::vector<endpoint>& peers,
                                        std::chrono::milliseconds timeout, std::uint32_t version,
                                        const ring_auth& auth = {}, tag_hashing hashing = tag_hashing::automatic);

}  // namespace troupe::transport
