#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

namespace troupe::transport {

namespace frames {
class frame_mac;  // ring_frames.hpp: one direction's integrity tags
}

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
  /// Whose fault it is, for what the other workers learn.
  enum class fault {
    link,         ///< this link's only (a peer gone, silent or malformed): nothing to tell the others
    out_of_step,  ///< the workers disagree on the collective (skipped, added, reordered, named apart)
    altered,      ///< a frame failed its integrity check: the link between two workers was tampered with
  };
  peer_error(int peer, std::string message) : std::runtime_error(std::move(message)), peer_(peer) {}
  /// `for_everyone`: what every other worker must learn too (see for_everyone()); `kind` is not
  /// fault::link.
  peer_error(int peer, std::string message, std::string for_everyone, fault kind = fault::out_of_step)
      : std::runtime_error(std::move(message)), peer_(peer), for_everyone_(std::move(for_everyone)), kind_(kind) {}
  int peer() const noexcept { return peer_; }
  /// Not empty when the error is the cluster's and not only this link's (workers that disagree
  /// on the collective, or a frame altered on its way): the same facts worded for any worker,
  /// both sides named by rank. The runtime tells every worker through the control plane, since
  /// workers that are not this one's neighbours see only the ring break.
  const std::string& for_everyone() const noexcept { return for_everyone_; }
  /// fault::link unless for_everyone() is set.
  fault kind() const noexcept { return for_everyone_.empty() ? fault::link : kind_; }

 private:
  int peer_;
  std::string for_everyone_;
  fault kind_ = fault::link;
};

/// Which of a rank's two connections: the one to its successor (rank + 1) or the one to its
/// predecessor (rank - 1). Each carries bytes both ways.
enum class ring_side { next, prev };

/// A rank's neighbour on one side, for error messages: "rank 2 (10.0.0.3:4242)".
struct ring_peer {
  int rank = 0;
  std::string name;
};

/// The directions a wait is for.
struct ring_wants {
  bool write_next = false;
  bool read_next = false;
  bool write_prev = false;
  bool read_prev = false;
};

/// The two connections of one rank of a ring, as byte streams: the seam between the ring's
/// algorithms and frames (tcp_ring, ring_frames) and how bytes move (sockets, or memory_ring's
/// in-process double that drops, delays and corrupts frames). Reads and writes never block; a
/// ring waits in wait(). Only shutdown() may be called from another thread.
class ring_link {
 public:
  ring_link(ring_peer next, ring_peer prev) : next_(std::move(next)), prev_(std::move(prev)) {}
  virtual ~ring_link() = default;
  ring_link(const ring_link&) = delete;
  ring_link& operator=(const ring_link&) = delete;

  /// Writes what `side` takes now of the `count` buffers at `iov`; returns the bytes written (0:
  /// it would block). A peer that has gone is a peer_error naming it.
  virtual std::size_t write_some(ring_side side, const iovec* iov, std::size_t count) = 0;
  /// Reads up to `n` bytes that have arrived on `side` into `into`; returns how many (0: none yet).
  /// A peer that has gone is a peer_error naming it.
  virtual std::size_t read_some(ring_side side, void* into, std::size_t n) = 0;
  /// Sleeps until a direction in `wants` may progress or `timeout_ms` passes (-1: no bound);
  /// false when it passed. May return true early (then the caller tries again).
  virtual bool wait(const ring_wants& wants, int timeout_ms) = 0;
  /// Ends both connections: every read and write here and on the neighbours fails from now on.
  virtual void shutdown() noexcept = 0;

  /// The neighbour on `side`.
  const ring_peer& peer(ring_side side) const noexcept { return side == ring_side::next ? next_ : prev_; }

  /// The tags of the frames sent (`out`) and received (`in`) on `side`: set by whoever proved the
  /// connection with a cluster token (connect_ring, memory_ring with a token); null when frames
  /// carry no tag.
  void set_frame_macs(ring_side side, std::shared_ptr<frames::frame_mac> out, std::shared_ptr<frames::frame_mac> in) {
    auto& m = side == ring_side::next ? next_macs_ : prev_macs_;
    m[0] = std::move(out);
    m[1] = std::move(in);
  }
  frames::frame_mac* out_mac(ring_side side) const noexcept {
    return (side == ring_side::next ? next_macs_ : prev_macs_)[0].get();
  }
  frames::frame_mac* in_mac(ring_side side) const noexcept {
    return (side == ring_side::next ? next_macs_ : prev_macs_)[1].get();
  }

  /// The peer_error for a neighbour whose process ended or failed (end of stream, a reset, a
  /// broken pipe: whichever side noticed first, they all say the same to the user).
  [[noreturn]] void throw_gone(ring_side side) const {
    throw peer_error(peer(side).rank, peer(side).name + " closed its connection (the process ended or failed)");
  }

 private:
  ring_peer next_;
  ring_peer prev_;
  std::shared_ptr<frames::frame_mac> next_macs_[2];
  std::shared_ptr<frames::frame_mac> prev_macs_[2];
};

}  // namespace troupe::transport
