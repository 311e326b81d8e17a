#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/transport/collective.hpp"

namespace troupe::transport {

/// The collectives of `size` threads of one process (the replicas of a MirroredStrategy), through
/// shared memory: no message per chunk, no copy into a staging buffer.
///
/// Protocol of one collective, the same on every rank:
///   1. post: the rank publishes its buffers in its slot (double-buffered by round parity, so a
///      slow rank still reading round c never sees round c+1 overwrite it) and arrives at the
///      barrier. A completed barrier means every rank has posted.
///   2. check: every rank compares every slot with rank 0's (kind, count, dtype, shape). They all
///      see the same slots, so on a mismatch they all throw the same std::invalid_argument and
///      nobody touches a buffer.
///   3. move: all_reduce of up to `small_bytes` is computed whole by every rank into its own
///      output (one barrier in all); larger ones are a fused reduce-scatter + all-gather: rank r
///      sums elements [r*E/n, (r+1)*E/n) over ranks 0..n-1 in that fixed order and writes the sum
///      into every rank's output (or only rank 0's, for a caller that shares that one result: see
///      all_reduce's shared_output), then all meet at a second barrier. Either way each element is
///      summed in rank order once, so every rank gets bit-identical results on every run.
///      all_gather: every rank concatenates all inputs into its own output.
///   Inputs stay readable after their owner returns because the slot holds each buffer's
///   `keepalive` until the
///   slot is reused two rounds later, when every rank has provably finished reading it.
///
/// Failure: abort(rank, why) or a rank that finish()es while others wait for it releases every
/// waiter with CollectiveAborted naming the cause. reset() re-arms the group; call it only while
/// no rank is inside a collective (between steps).
class shm_group {
 public:
  shm_group(int size, std::chrono::microseconds spin,
            std::chrono::milliseconds timeout = std::chrono::milliseconds{0});
  ~shm_group();
  shm_group(const shm_group&) = delete;
  shm_group& operator=(const shm_group&) = delete;

  int size() const noexcept { return size_; }

  /// Sums (or averages) every rank's buffers into every rank's `out`. All ranks must pass the
  /// same number of buffers with the same counts, types and shapes.
  ///
  /// `shared_output`: when the all-reduce is fused (shares_output(total bytes, size())), the sum
  /// goes to rank 0's `out` only (the others' `out` is not touched and may be null), for callers
  /// that hand every rank that one result: N times less to write. Every rank must pass the same.
  void all_reduce(int rank, const buffer* buffers, std::size_t count, reduce_kind op, bool shared_output = false);

  /// Whether an all-reduce of `total_bytes` in all over `size` ranks is fused (reduce-scatter +
  /// all-gather with a second barrier), so that a shared output is possible.
  static bool fused(std::size_t total_bytes, int size) noexcept { return size > 1 && total_bytes > small_bytes; }

  /// Concatenates every rank's `value.in` along `axis` into this rank's output. Ranks may differ
  /// in the size of `axis` only. `allocate(shape)` is called once with the output shape and
  /// returns where to write it.
  void all_gather(int rank, const buffer& value, int axis,
                  const std::function<void*(const std::vector<std::int64_t>&)>& allocate);

  /// A rendezvous: every rank posts `mine`; once all have, rank 0 calls on_first(every rank's
  /// pointer, in rank order) while the others wait; then all return. An exception from on_first
  /// is rethrown on rank 0, and the others fail with aborted_error carrying its message.
  void merge(int rank, const void* mine, const std::function<void(const std::vector<const void*>&)>& on_first);

  /// Fails every pending and later collective of this step with `reason` (a rank failed).
  void abort(int rank, const std::string& reason);
  /// `rank`'s step is over: any rank waiting for it in a collective fails instead of hanging.
  void finish(int rank);
  /// Re-arms the group after a step; only while no rank is inside a collective.
  void reset();

  /// All-reduces of at most this many bytes in all are computed whole by every rank.
  static constexpr std::size_t small_bytes = 32 * 1024;
  // Fused all-reduces whose inputs and outputs overflow the last-level cache write the outputs
  // with streaming stores (the L3 size from sysfs; 32 MiB when it does not say).

 private:
  struct slot {
    collective_kind kind = collective_kind::all_reduce;
    reduce_kind op = reduce_kind::sum;
    int axis = 0;
    std::vector<buffer> buffers;  // reused from round to round: no allocation once warm
  };

  // Publishes this rank's buffers in its slot for the next round and returns that slot.
  slot& post(int rank, collective_kind kind, const buffer* buffers, std::size_t count);
  void arrive_and_wait(int rank, const char* what);
  void check_slots(int rank, const char* what) const;
  [[noreturn]] void throw_aborted(const char* what);
  std::string missing_ranks(std::uint64_t arrivals) const;

  const int size_;
  const std::chrono::microseconds spin_;
  const std::chrono::milliseconds timeout_;
  std::vector<std::uint64_t> round_;       // per rank: collectives this rank has started
  std::unique_ptr<std::atomic<std::uint64_t>[]> arrivals_;  // per rank: barriers reached
  std::vector<slot> slots_;                // [parity * size + rank]
  const int pause_spins_;

  alignas(64) std::atomic<std::uint32_t> arrived_{0};
  alignas(64) std::atomic<std::uint32_t> generation_{0};  // futex word
  std::atomic<int> sleepers_{0};
  std::atomic<bool> aborted_{false};
  std::atomic<int> finished_first_{-1};    // first rank that finished its step
  mutable std::mutex reason_mutex_;
  std::string abort_reason_;
};

}  // namespace troupe::transport
