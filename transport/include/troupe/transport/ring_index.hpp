#pragma once
// The ring's index arithmetic, written once: which rank is where, which chunk or block a rank
// sends and receives in step k, and where a segment lies. Every algorithm of tcp_ring uses these.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace troupe::transport::ring_index {

/// `r` taken around a ring of `size`: -1 is size-1, size is 0.
inline int wrap(int r, int size) { return ((r % size) + size) % size; }
/// The rank after `rank`: the one it sends to.
inline int next_rank(int rank, int size) { return wrap(rank + 1, size); }
/// The rank before `rank`: the one it receives from.
inline int prev_rank(int rank, int size) { return wrap(rank - 1, size); }

/// Chunk c of `count` elements over `size` ranks: [begin, end), its bounds on multiples of 16
/// elements (64 bytes of f32); the last chunk takes what is left.
inline std::pair<std::int64_t, std::int64_t> chunk_bounds(std::int64_t count, int size, int c) {
  auto at = [&](int k) {
    if (k <= 0) return std::int64_t{0};
    if (k >= size) return count;
    std::int64_t b = count * k / size;
    return b - b % 16;
  };
  return {at(c), at(c + 1)};
}

/// Step k (0-based) of a ring pass that starts from `first`: the chunk (or block) a rank sends,
/// first - k, and the one it receives, first - k - 1. The reduce-scatter starts from the rank's
/// own index; the all-gather that follows from the chunk it finished, rank + 1.
inline int ring_send_index(int first, int k, int size) { return wrap(first - k, size); }
inline int ring_recv_index(int first, int k, int size) { return wrap(first - k - 1, size); }

/// The chunk a rank holds complete after the reduce-scatter.
inline int owned_chunk(int rank, int size) { return next_rank(rank, size); }

/// Segments of `bytes` bytes in units of `segment`: at least one, so that an empty block still
/// travels as one (empty) frame and its size is checked.
inline std::size_t segments_of(std::size_t bytes, std::size_t segment) {
  return std::max<std::size_t>(1, (bytes + segment - 1) / segment);
}
/// Segment j of a buffer of `bytes` bytes: [begin, begin + size) in bytes.
inline std::size_t segment_begin(std::size_t j, std::size_t segment) { return j * segment; }
inline std::size_t segment_size(std::size_t j, std::size_t bytes, std::size_t segment) {
  return std::min(bytes, (j + 1) * segment) - std::min(bytes, j * segment);
}

/// A broadcast rank's place in the chain from `root`: 0 is the root, size-1 the rank before it.
inline int chain_position(int rank, int root, int size) { return wrap(rank - root, size); }

/// The small all-reduce's step k (1-based): the rank whose block goes to the successor (own block
/// first) and to the predecessor, and the ranks whose blocks arrive from each.
inline int small_forward_owner(int rank, int k, int size) { return wrap(rank - (k - 1), size); }
inline int small_backward_owner(int rank, int k, int size) { return wrap(rank + (k - 1), size); }
inline int small_from_prev_owner(int rank, int k, int size) { return wrap(rank - k, size); }
inline int small_from_next_owner(int rank, int k, int size) { return wrap(rank + k, size); }
/// Steps that bring blocks from the predecessor (size/2) and from the successor ((size-1)/2): when
/// size is even the last step runs one way only, so that no block arrives twice.
inline int small_steps_from_prev(int size) { return size / 2; }
inline int small_steps_from_next(int size) { return (size - 1) / 2; }

}  // namespace troupe::transport::ring_index
