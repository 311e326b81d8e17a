#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/transport/ring_link.hpp"

namespace troupe::transport {

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
  friend std::unique_ptr<ring_link> connect_ring(int, int, listener&, const std::vector<endpoint>&,
                                                 std::chrono::milliseconds, std::uint32_t);
  struct impl;  // the Boost.Asio acceptor
  std::unique_ptr<impl> impl_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

/// Forms `rank`'s two connections of a ring of `size` over TCP, all within `timeout` (0: no bound):
///  1. connects to peers[rank+1], retrying while nobody listens there yet (each attempt bounded
///     too: a host that drops SYNs would otherwise hold connect() for minutes);
///  2. accepts on `own` until a connection comes (a connection reset before it is accepted is
///     skipped);
///  3. sends a hello to the successor (troupe's magic, `version`, rank, size) and checks the one
///     from the predecessor: a stranger, another version, or another rank or ring size is a
///     peer_error naming the peer expected there.
/// Both sockets come back non-blocking with Nagle off (a ring step's last segment must not wait
/// for an ACK). A peer that is not there in time is a peer_error naming it. With one rank there is
/// nothing to connect: null.
std::unique_ptr<ring_link> connect_ring(int rank, int size, listener& own, const std::vector<endpoint>& peers,
                                        std::chrono::milliseconds timeout, std::uint32_t version);

}  // namespace troupe::transport
