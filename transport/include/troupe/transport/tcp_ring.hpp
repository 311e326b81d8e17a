#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "troupe/transport/ring_connect.hpp"
#include "troupe/transport/ring_link.hpp"
#include "troupe/transport/collective.hpp"

namespace troupe::transport {

/// tcp_ring's settings, with named defaults.
struct tcp_ring_options {
  /// 1 MiB: large enough that a step's frames cost little beside their bytes, small enough that a
  /// rank adds one segment while the next arrives.
  static constexpr std::size_t default_segment_bytes = std::size_t{1} << 20;
  /// The smallest segment: one 64-byte line (16 f32 elements).
  static constexpr std::size_t min_segment_bytes = 64;
  /// The largest segment, well under Cap'n Proto's 512 MiB per blob.
  static constexpr std::size_t max_segment_bytes = std::size_t{64} << 20;
  /// Every wait is bounded; the runtime passes its own bound.
  static constexpr std::chrono::milliseconds default_timeout{60 * 1000};
  /// A loopback round trip is a few microseconds; a thread asleep in poll() takes tens to wake.
  static constexpr std::chrono::microseconds default_spin{50};

  /// The unit a ring step pipelines: a rank receives the next segment while it handles (adds,
  /// copies, forwards) the last one. A multiple of 8 in [min_segment_bytes, max_segment_bytes];
  /// an all-reduce segment holds at least 16 elements.
  std::size_t segment_bytes = default_segment_bytes;
  /// The bound of connection setup and of every later wait (0: none).
  std::chrono::milliseconds timeout = default_timeout;
  /// How long a wait busy-polls its connections before it sleeps in poll().
  std::chrono::microseconds spin = default_spin;
  /// Give the CPU away between polls, for ranks that share too few cores (the rank being waited
  /// for needs the CPU).
  bool yield_while_spinning = false;
  /// What every connection proves at setup (the cluster token and incarnation; ring_connect.hpp).
  ring_auth auth;
  /// With a token: where a rank hashes its large frames' tags (ring_connect.hpp).
  tag_hashing hash_tags = tag_hashing::automatic;
  /// In an all-reduce's ring steps, start writing the next segment before handling the one just
  /// received (the successor receives while this rank adds); false: strictly one segment at a time.
  bool send_ahead = true;
};

/// Ring collectives between `size` processes over TCP: rank r connects to rank r+1 and accepts
/// rank r-1. Every frame is a Cap'n Proto message whose tensor bytes are an external segment:
/// referenced from the sender's buffer (gathered by sendmsg, no copy) and read in place on the
/// receiver, which reduces straight from its receive buffer. Data travels in segments
/// (tcp_ring_options::segment_bytes, 1 MiB by default), so a rank receives the next segment while
/// it handles (adds, copies, forwards) the last one.
///
/// Connection setup is connect_ring's (ring_connect.hpp): the connections, then three hellos that
/// check the protocol version, rank and size and prove the cluster token and incarnation both
/// ways (tcp_ring_options::auth); a stranger on the listening port is refused and logged, never
/// taken for a rank. The collectives run over a ring_link: the
/// connected sockets' native handles with sendmsg/read and a busy-poll before poll(), tuned for
/// latency, or memory_ring's in-process double in tests. Frames are written and read in one place
/// (ring_frames), and the index arithmetic shared by every algorithm is ring_index's.
///
/// all_reduce of E elements:
///  1. The buffer is cut into `size` chunks.
///  2. Reduce-scatter, size-1 steps: each rank sends one chunk to its successor while it receives
///     and adds another from its predecessor; rank r then holds the full sum of chunk r+1.
///  3. All-gather, size-1 steps, passes the finished chunks around.
/// Two ranks with at most 64 KiB swap whole buffers in one step instead (half the latency;
/// a + b == b + a, so both still get the same bits). Every byte crosses each link 2(size-1)/size
/// times, the minimum. The order of the additions is fixed by the ring, so results are identical
/// on every rank and every run.
///
/// all_reduce of at most small_all_reduce_bytes over more than 2 ranks trades bandwidth for
/// latency: ceil((size-1)/2) steps instead of 2(size-1), each a wait for a neighbour that may be
/// descheduled. It uses both directions of both connections:
///  1. Step 1: each rank sends its whole buffer to its successor and to its predecessor, and
///     receives theirs.
///  2. Step k: it forwards to its successor the block that came from its predecessor in step k-1,
///     and to its predecessor the one that came from its successor. After step k it holds the
///     blocks of the ranks within distance k either way.
///  3. Blocks flow from the predecessor for size/2 steps and from the successor for (size-1)/2:
///     when size is even the last step runs one way only, so that no block arrives twice and no
///     frame is left unread.
///  4. Every rank adds the size blocks in rank order 0..size-1 (then divides for mean): the same
///     additions in the same order everywhere, so every rank gets the same bits.
/// Each frame names the operation and the rank whose block it carries; the receiver checks both
/// and the block's size.
///
/// broadcast of B bytes from root t, a pipelined chain along the ring:
///  1. t sends its segments to t+1.
///  2. Every other rank but t-1 forwards segment k to its successor while it receives segment
///     k+1; t-1 only receives. Every byte crosses each link but (t-1, t) once.
///  3. Meanwhile t-1 sends t one frame without data naming the broadcast (its root and size), so
///     that the root checks the collective too and no frame is left in a socket when ranks
///     disagree; the root returns once its segments are sent and that frame is checked.
///
/// all_gather of blocks of uneven sizes: size-1 steps; in step k rank r sends block r-k (its own
/// first, then the one it received last) to its successor while it receives block r-k-1, segment
/// by segment. Each block crosses size-1 links once. A block of 0 bytes still travels as one
/// empty frame, so that every rank checks every block's size.
///
/// Every rank must call the same collectives in the same order with the same sizes; each frame
/// carries the step (begin_step's), the collective's number within that step, its kind, root and
/// sizes, and a peer whose frame disagrees is a peer_error naming it and both views: a rank that
/// skipped, added or reordered a collective is named with both steps and both numbers, and no
/// value of one step is ever added to another's.
///
/// Peer bytes are untrusted: sizes are checked before anything is allocated, Cap'n Proto traversal
/// limits are set per frame, every field of a frame (collective, operation, chunk or block, type,
/// offset, count, data length) is checked against what the receiver expects, and every problem is
/// a peer_error naming the peer. Frames carry no checksum of their data: TCP's guards the bytes in
/// transit. Every wait is bounded by `timeout` (0: no bound).
class tcp_ring {
 public:
  /// Connects to peers[rank+1], accepts rank-1 on `own` and runs the proof both ways with an empty
  /// token and incarnation, all within `timeout` (0: no bound); a peer that is not there in time is
  /// a peer_error naming it. The other options keep their defaults.
  tcp_ring(int rank, int size, listener& own, const std::vector<endpoint>& peers, std::chrono::milliseconds timeout);
  /// The same with every option given; `options.timeout` bounds the setup and later waits.
  tcp_ring(int rank, int size, listener& own, const std::vector<endpoint>& peers, const tcp_ring_options& options);
  /// Runs over connections already formed: `link` is rank's (null when size is 1). A bad rank,
  /// size or segment size is std::invalid_argument.
  tcp_ring(int rank, int size, std::unique_ptr<ring_link> link, const tcp_ring_options& options = {});
  ~tcp_ring();
  tcp_ring(const tcp_ring&) = delete;
  tcp_ring& operator=(const tcp_ring&) = delete;

  /// This process's place in the ring.
  int rank() const noexcept { return rank_; }
  /// The number of ranks.
  int size() const noexcept { return size_; }

  /// The options in force.
  const tcp_ring_options& options() const noexcept;

  /// The bound of later waits (0: none).
  void set_timeout(std::chrono::milliseconds timeout);
  /// How long a wait busy-polls its connections before it sleeps (default 50 us). `yield`:
  /// give the CPU away between polls, for ranks that share too few cores (the rank being waited
  /// for needs the CPU).
  void set_spin(std::chrono::microseconds spin, bool yield = false);

  /// Starts training step `step`: later frames carry it, and collectives are numbered from 0 again
  /// (the runtime calls it once per Strategy::run on every rank; collectives before the first
  /// call are step 0). Only between collectives.
  void begin_step(std::uint64_t step);
  /// The step begun last (0 before any).
  std::uint64_t step() const noexcept;
  /// The number the next collective of this step gets (the one its frames carry; from 0 at each
  /// begin_step).
  std::uint64_t next_collective() const noexcept;

  /// Names the next collective (all_reduce, broadcast or all_gather) `key`: its frames carry it,
  /// and a rank whose frames name another collective in the same place fails naming both (the
  /// ranks run their collectives in different orders). Without names (0), collectives are told
  /// apart by their step, number, kind, root, element type and sizes only: two of the same kind,
  /// type and size swapped within a step are summed together unnoticed.
  void name_next_collective(std::uint64_t key);

  /// Shuts both connections down: a collective in progress, here or on the neighbours, fails at
  /// once. Safe to call from another thread; the ring is unusable afterwards.
  void shutdown();

  /// Sums (or averages) `data` in place over every rank.
  void all_reduce(void* data, std::int64_t count, scalar_type type, reduce_kind op);

  /// Where the last all_reduce waited for another rank: from its start until the first byte from
  /// the predecessor arrived (`first_from_prev == begin` when it was there at once). That is the
  /// predecessor's lateness in entering the collective (Horovod's NEGOTIATE: a rank not ready yet),
  /// plus one hop's latency; the rest of the call is the all-reduce itself.
  struct peer_wait {
    std::chrono::steady_clock::time_point begin;
    std::chrono::steady_clock::time_point first_from_prev;
  };
  /// The last all_reduce's peer_wait (on the thread that ran it, or after it).
  peer_wait last_all_reduce_wait() const noexcept;

  /// What a collective in progress waits on, safe to read from any thread (the stall inspector
  /// reads it beside the heartbeat): the neighbour's rank (-1: no collective waits now), and when
  /// the ring last moved a byte (the epoch: never).
  struct progress_view {
    int peer = -1;
    std::chrono::steady_clock::time_point last{};
    /// Bytes sent to the successor and received from the predecessor since the ring began: a
    /// link whose sender counts more than its receiver, while nothing moves, lost them on the way.
    std::uint64_t sent_next = 0;
    std::uint64_t received_prev = 0;
  };
  progress_view progress() const noexcept;

  /// Copies root's `bytes` bytes at `data` into `data` on every other rank. Every rank passes the
  /// same `bytes` and `root`; 0 bytes returns at once on every rank. A `root` outside
  /// [0, size) is std::invalid_argument.
  void broadcast(void* data, std::size_t bytes, int root);

  /// Gathers every rank's block into `out` in rank order: rank r's `bytes_per_rank[r]` bytes at
  /// offset bytes_per_rank[0] + ... + bytes_per_rank[r-1]. `out` holds the sum of
  /// `bytes_per_rank`; `mine` (this rank's block) may lie inside it. Blocks may differ in size
  /// and be empty. Every rank passes the same `bytes_per_rank`, with one entry per rank and
  /// `my_bytes == bytes_per_rank[rank()]` (std::invalid_argument otherwise).
  void all_gather(const void* mine, std::size_t my_bytes, void* out, const std::vector<std::size_t>& bytes_per_rank);

  /// all_reduce over more than 2 ranks of at most this many bytes exchanges whole buffers both
  /// ways around the ring (ceil((size-1)/2) steps); larger ones run the reduce-scatter ring.
  static constexpr std::size_t small_all_reduce_bytes = 64 * 1024;

  /// Version 6: the accepting side acknowledges a proven connection (a fourth hello), and the
  /// connecting side tries again when it is closed before that; with a cluster token every frame
  /// carries an integrity tag (AES-256-GCM as a MAC, ring_frames.hpp); frames carry the
  /// collective's name.
  /// Version 5: every connection proves the cluster token both ways (three hellos with nonces and
  /// HMAC proofs, ring_connect.hpp); every frame carries its step and its number within the step.
  /// Version 4: small all-reduce blocks (allReduceBlock frames, also sent to the predecessor).
  /// Version 3: broadcast and all-gather frames (a collective kind, root and total per frame).
  static constexpr std::uint32_t protocol_version = 6;

 private:
  struct impl;
  int rank_;
  int size_;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::transport
