#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "troupe/transport/shm_group.hpp"

namespace troupe::transport {

/// A peer's data-plane address.
struct endpoint {
  std::string host;
  std::uint16_t port = 0;
  std::string to_string() const { return host + ":" + std::to_string(port); }
};

/// A failure of the data plane that names the peer: it closed its connection, sent a malformed,
/// truncated or oversized frame, spoke another protocol version, or did not answer in time.
class peer_error : public std::runtime_error {
 public:
  peer_error(int peer, std::string message) : std::runtime_error(std::move(message)), peer_(peer) {}
  int peer() const noexcept { return peer_; }

 private:
  int peer_;
};

/// A listening TCP socket; port 0 picks a free one.
class listener {
 public:
  listener(const std::string& host, std::uint16_t port);
  ~listener();
  listener(const listener&) = delete;
  listener& operator=(const listener&) = delete;
  std::uint16_t port() const noexcept { return port_; }
  int fd() const noexcept { return fd_; }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

/// Ring collectives between `size` processes over TCP: rank r connects to rank r+1 and accepts
/// rank r-1. Every frame is a Cap'n Proto message whose tensor bytes are an external segment:
/// referenced from the sender's buffer (gathered by sendmsg, no copy) and read in place on the
/// receiver, which reduces straight from its receive buffer.
///
/// all_reduce of E elements: the buffer is cut into `size` chunks; a reduce-scatter of size-1
/// steps (each rank sends one chunk to its successor while it receives and adds another from its
/// predecessor) leaves rank r with the full sum of chunk r+1, which an all-gather of size-1 steps
/// passes around. Chunks travel in 1 MiB segments: a rank reduces one segment while the socket
/// already receives the next. Two ranks with at most 64 KiB swap whole buffers in one step
/// instead (half the latency; a + b == b + a, so both still get the same bits). Every byte crosses each link 2(size-1)/size times, the minimum. The order of the
/// additions is fixed by the ring, so results are identical on every rank and every run.
///
/// Peer bytes are untrusted: sizes are checked before anything is allocated, Cap'n Proto traversal
/// limits are set per frame, and every problem is a peer_error naming the peer. Every wait is
/// bounded by `timeout` (0: no bound).
class tcp_ring {
 public:
  tcp_ring(int rank, int size, listener& own, const std::vector<endpoint>& peers, std::chrono::milliseconds timeout);
  ~tcp_ring();
  tcp_ring(const tcp_ring&) = delete;
  tcp_ring& operator=(const tcp_ring&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  /// The bound of later waits (0: none).
  void set_timeout(std::chrono::milliseconds timeout);
  /// How long a wait busy-polls its sockets before it sleeps in poll() (default 50 us). `yield`:
  /// give the CPU away between polls, for ranks that share too few cores (the rank being waited
  /// for needs the CPU).
  void set_spin(std::chrono::microseconds spin, bool yield = false);

  /// Shuts both connections down: a collective in progress, here or on the neighbours, fails at
  /// once. Safe to call from another thread; the ring is unusable afterwards.
  void shutdown();

  /// Sums (or averages) `data` in place over every rank.
  void all_reduce(void* data, std::int64_t count, scalar_type type, reduce_kind op);

  static constexpr std::uint32_t protocol_version = 2;

 private:
  struct impl;
  int rank_;
  int size_;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::transport
