#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/transport/ring_link.hpp"

namespace troupe::transport {

/// What memory_ring does with one frame on its way.
struct frame_fate {
  enum class action { deliver, drop, delay };
  action what = action::deliver;
  std::chrono::milliseconds delay{0};  // for action::delay

  /// Delivered as it is (or as the hook changed it).
  static frame_fate deliver() { return {}; }
  /// Lost: the receiver never sees it; the stream goes on with the next frame.
  static frame_fate drop() { return {action::drop, {}}; }
  /// Delivered `by` later; the frames behind it wait too, as on a TCP stream.
  static frame_fate delay_by(std::chrono::milliseconds by) { return {action::delay, by}; }
};

/// One frame on its way from rank `from` to rank `to`, the `number`th on that stream (0 first):
/// its bytes as the sender framed them (segment table, then segments), which a hook may change.
struct frame_in_flight {
  int from = 0;
  int to = 0;
  std::uint64_t number = 0;
  std::vector<unsigned char>& bytes;
};

/// Decides each frame's fate; called under memory_ring's lock, from the sending rank's thread.
using fault_hook = std::function<frame_fate(frame_in_flight&)>;

/// An in-process ring for tests: the links of `size` ranks (threads of one process) over memory,
/// with a hook that may drop, delay or corrupt any frame. The ring's algorithms and frame
/// reader/writer run unchanged over it (tcp_ring's constructor that takes a ring_link); only the
/// sockets are replaced. A link that is destroyed or shut down closes its streams like a process
/// that ended: its neighbours' reads and writes fail naming it.
class memory_ring {
 public:
  /// `size` ranks; every frame passes through `hook` (none: all are delivered). With a `token`,
  /// every frame carries its integrity tag as over TCP with a cluster token (a key per connection
  /// derived from it), and the hook sees the tag as the frame's last 16 bytes.
  explicit memory_ring(int size, fault_hook hook = {}, std::string token = {});
  ~memory_ring();
  memory_ring(const memory_ring&) = delete;
  memory_ring& operator=(const memory_ring&) = delete;

  /// Rank `rank`'s link, named "rank N (in-process)" in errors. Each rank's link is taken once.
  std::unique_ptr<ring_link> link(int rank);

  /// The number of ranks.
  int size() const noexcept { return size_; }

  /// What the links share: the streams, the hook and the lock (memory_ring.cpp).
  struct state;

 private:
  int size_;
  std::shared_ptr<state> state_;
};

/// Which collective a chunk frame belongs to: its `kind` on the wire (schema/frame.capnp).
enum class frame_kind : std::uint16_t { all_reduce = 0, broadcast = 1, all_gather = 2, broadcast_close = 3, all_reduce_block = 4 };

/// A chunk frame's fields, for tests that forge one (a wrong kind, offset or length) inside a
/// fault_hook. `type` is the wire's ScalarType number (float32 0, float64 1, int32 2, int64 3,
/// uint8 4).
struct chunk_fields {
  frame_kind kind = frame_kind::all_reduce;
  std::uint64_t step = 0;      ///< tcp_ring::begin_step's
  std::uint64_t sequence = 0;  ///< the collective's number within its step
  std::uint32_t index = 0;
  std::uint16_t type = 0;
  std::uint64_t count = 0;
  std::uint64_t offset = 0;
  std::uint32_t root = 0;
  std::uint64_t total = 0;
  std::vector<unsigned char> data;
};

/// The fields of the chunk frame `frame`; nothing when it is not one (a hello, a malformed frame).
std::optional<chunk_fields> decode_chunk_frame(const std::vector<unsigned char>& frame);
/// A chunk frame with `fields`, framed as the ring's writer frames it.
std::vector<unsigned char> encode_chunk_frame(const chunk_fields& fields);

/// A hello's fields (schema/frame.capnp), for test programs that speak the ring's setup as a
/// stranger would: an old version, a forged rank, a replayed proof.
struct hello_frame_fields {
  std::uint32_t magic = 0x74727570;  ///< "trup"
  std::uint32_t version = 0;
  std::uint32_t rank = 0;
  std::uint32_t size = 0;
  std::vector<unsigned char> nonce;
  std::vector<unsigned char> proof;
};

/// A hello framed as the ring's writer frames it.
std::vector<unsigned char> encode_hello_frame(const hello_frame_fields& fields);
/// The hello in `frame` (segment table and segments); nothing when it is not one.
std::optional<hello_frame_fields> decode_hello_frame(const std::vector<unsigned char>& frame);

}  // namespace troupe::transport
