#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "troupe/device.hpp"
#include "troupe/distribute/reduce_op.hpp"
#include "troupe/tensor.hpp"

namespace troupe::distribute::detail {

/// Asynchronous all-reduces of gradient buckets between the CPU replicas of one process, so that
/// a bucket is summed while the replicas still differentiate earlier layers.
///
/// start() deposits a replica's tensors of the next bucket and returns at once; the replica that
/// deposits last splits the bucket into chunks and starts reducing them, and every replica that
/// waits (wait()) or starts a later bucket claims chunks of any bucket whose inputs are complete,
/// so the reduction runs on whichever replica threads have nothing else to do. Each element is
/// summed over the replicas in order 0..N-1 by kernels::reduce_range, as the shared-memory
/// all-reduce does, so a bucket's sums have the same bits as that all-reduce's, whatever the
/// buckets and whoever reduces. Every replica receives the same output tensors (immutable, shared).
///
/// `after_local`: where a further stage follows (the ring across workers), a bucket whose local
/// sum is complete is handed to it instead of being finished; the stage calls complete() or
/// fail(). Buckets are numbered from 0 in each step, in the order every replica starts them.
class GradientBuckets {
 public:
  GradientBuckets(int replicas, std::chrono::microseconds spin);

  /// Deposits `replica`'s tensors of its next bucket (CPU tensors; every replica the same count,
  /// dtypes and shapes) and returns the bucket's number.
  std::size_t start(int replica, ReduceOp op, std::vector<Tensor> values, const Device& device);
  /// The bucket's results, once complete (the calling replica helps reducing meanwhile). Throws
  /// CollectiveAborted when the step failed, std::invalid_argument when replicas disagree.
  /// `all_started` becomes the moment every replica had started the bucket, if that is later.
  std::vector<Tensor> wait(int replica, std::size_t bucket, const Device& device,
                           std::chrono::steady_clock::time_point& all_started);

  /// The local sums of bucket `bucket` (valid once handed to the after-local stage).
  std::vector<Tensor>& sums(std::size_t bucket);
  /// Waits until bucket `bucket` of step `generation` has its local sums (true), or the step
  /// moved on or the stage is shut down (false); an aborted step waits for the next one.
  bool wait_local(std::uint64_t generation, std::size_t bucket);
  /// Finishes a bucket handed to the after-local stage (nothing when the step moved on).
  void complete(std::uint64_t generation, std::size_t bucket);
  /// The after-local stage of step `generation` waited for another worker from `begin` to `end`.
  void note_peer_wait(std::uint64_t generation, std::chrono::steady_clock::time_point begin,
                      std::chrono::steady_clock::time_point end);
  /// How much of [from, to] this step's after-local stage spent waiting for another worker
  /// (note_peer_wait's intervals, which do not overlap: the stage is one thread).
  std::chrono::nanoseconds peer_wait_within(std::chrono::steady_clock::time_point from,
                                            std::chrono::steady_clock::time_point to) const;
  void fail(std::uint64_t generation, std::size_t bucket, std::exception_ptr error);
  /// Waits, helping, until every bucket started in this step is complete or failed. Throws
  /// CollectiveAborted when the step failed or a replica left without starting a bucket.
  void settle();
  /// The step's number, from 0; reset() advances it.
  std::uint64_t generation() const;
  /// Releases wait_local for good (the stage's thread is ending).
  void shut_down();

  void set_after_local(bool enabled) { after_local_ = enabled; }

  /// The step failed: every waiter leaves with CollectiveAborted(`why`).
  void abort(const std::string& why);
  /// `replica` left its step: a bucket it never started can no longer complete.
  void finish(int replica);
  /// `replica` waits in another collective (`inside`) or left it: while it waits there it starts no
  /// bucket, so a bucket it has not started cannot complete until the others join that collective,
  /// and a replica waiting for the bucket instead would never get there: such a wait fails.
  void set_in_collective(int replica, bool inside);
  /// Between steps (no replica inside start or wait).
  void reset();

 private:
  struct chunk {
    std::size_t tensor;
    std::int64_t begin;
    std::int64_t end;
  };
  struct bucket {
    ReduceOp op = ReduceOp::sum;
    std::vector<std::vector<Tensor>> inputs;  // [replica][tensor]
    std::vector<Tensor> outputs;
    int deposited = 0;
    std::vector<chunk> chunks;
    std::atomic<std::size_t> next_chunk{0};
    std::atomic<std::size_t> chunks_done{0};
    // 0: collecting inputs, 1: reducing, 2: local sums done (handed on), 3: complete, 4: failed
    std::atomic<int> state{0};
    // The collectives its first replica had entered this step when it opened the bucket: a
    // replica in a collective past that many has moved on without starting it; one still
    // leaving the collective before has not.
    std::uint64_t collectives_before = 0;
    std::chrono::steady_clock::time_point all_started;
    std::exception_ptr error;
  };

  bucket& at(std::size_t index);
  // Reduces one claimable chunk of any bucket; false when there was none.
  bool help();
  void run_chunk(bucket& b, const chunk& c);
  void finish_local(bucket& b);
  void notify();
  [[noreturn]] void throw_aborted();
  // Under the lock: aborts when a replica left without starting bucket `index`.
  void check_missing(std::unique_lock<std::mutex>& lock, const bucket& b, std::size_t index);

  const int replicas_;
  const std::chrono::microseconds spin_;
  bool after_local_ = false;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::unique_ptr<bucket>> buckets_;  // grows during a step, cleared by reset
  std::atomic<std::size_t> first_open_{0};       // buckets before it need no help
  std::atomic<std::size_t> count_{0};            // buckets_.size(), readable without the lock
  std::vector<std::size_t> next_;                // per replica: its next bucket's number
  std::vector<bool> finished_;
  std::vector<bool> in_collective_;  // per replica: waiting in another collective (a merge, ...)
  std::vector<std::uint64_t> entered_;  // per replica: the collectives it entered this step
  std::atomic<bool> aborted_{false};
  bool stopping_ = false;
  std::string reason_;
  std::uint64_t generation_ = 0;
  std::vector<std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point>> peer_waits_;
};

}  // namespace troupe::distribute::detail
