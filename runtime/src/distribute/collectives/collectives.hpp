#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distribute/collectives/gradient_buckets.hpp"
#include "troupe/device.hpp"
#include "troupe/distribute/reduce_op.hpp"
#include "troupe/tensor.hpp"
#include "troupe/transport/shm_group.hpp"

namespace troupe::distribute::detail {

/// The collectives behind ReplicaContext, for the replicas of one strategy. float16 and bfloat16
/// tensors are summed in float32 and rounded once, in the one fixed order, on the host (the
/// shared-memory group and the gradient buckets, kernels::reduce_range), across workers (the ring
/// carries them widened to float32) and in the GPU reduce kernel; NCCL reduces them itself
/// (ncclFloat16, ncclBfloat16: 16-bit partial sums), so GPU replicas' 16-bit sums round per step
/// of its ring.
class ReplicaCollectives {
 public:
  virtual ~ReplicaCollectives() = default;
  virtual std::vector<Tensor> all_reduce(int replica, ReduceOp op, const std::vector<Tensor>& values) = 0;
  virtual Tensor all_reduce(int replica, ReduceOp op, const Tensor& value) = 0;
  virtual Tensor all_gather(int replica, const Tensor& value, int axis) = 0;
  /// A rendezvous: replica 0 runs on_first with every replica's `mine` while the others wait.
  virtual void merge(int replica, const void* mine,
                     const std::function<void(const std::vector<const void*>&)>& on_first) = 0;
  /// The result the last merge's on_first left for every replica.
  std::shared_ptr<const void>& merge_result() { return merge_result_; }

  /// Starts the all-reduce of one bucket of gradients and returns its number (from 0 in each step,
  /// in the order every replica starts them: every replica must start the same buckets). Where
  /// the collectives can, the call returns before the other replicas have started the bucket, and
  /// the sums are computed while the replica goes on; here, it reduces at once.
  virtual std::size_t start_all_reduce(int replica, ReduceOp op, std::vector<Tensor> values);
  /// The result of a started bucket: the same bits all_reduce(values) gives. `all_started`
  /// becomes the moment every replica (of this process) had started the bucket, if that is later
  /// (now, where the all-reduce ran at start).
  virtual std::vector<Tensor> wait_all_reduce(int replica, std::size_t bucket,
                                              std::chrono::steady_clock::time_point& all_started);
  /// How much of [from, to] the started buckets' stage across workers spent waiting for another
  /// worker to join a bucket's all-reduce (0 where there is no such stage).
  virtual std::chrono::nanoseconds peer_wait_within(std::chrono::steady_clock::time_point from,
                                                    std::chrono::steady_clock::time_point to) const {
    (void)from;
    (void)to;
    return std::chrono::nanoseconds{0};
  }
  /// The step of replica `replica` is over (it returned from the replica function).
  virtual void end_step(int replica) { (void)replica; }
  /// The step failed: pending bucket waits leave with CollectiveAborted(`why`).
  virtual void abort_buckets(const std::string& why) { (void)why; }

 private:
  std::shared_ptr<const void> merge_result_;
};

/// The replicas of one process, through transport::shm_group.
class ShmCollectives final : public ReplicaCollectives {
 public:
  ShmCollectives(transport::shm_group& group, std::vector<Device> devices,
                 std::chrono::microseconds spin = std::chrono::microseconds(50))
      : group_(group), devices_(std::move(devices)), rounds_(devices_.size(), 0), numbered_(devices_.size(), 0),
        bucket_tickets_(devices_.size()), buckets_(static_cast<int>(devices_.size()), spin) {}
  std::vector<Tensor> all_reduce(int replica, ReduceOp op, const std::vector<Tensor>& values) override;
  Tensor all_reduce(int replica, ReduceOp op, const Tensor& value) override;
  Tensor all_gather(int replica, const Tensor& value, int axis) override;
  void merge(int replica, const void* mine,
             const std::function<void(const std::vector<const void*>&)>& on_first) override;
  /// Buckets are summed while the replicas go on (GradientBuckets).
  std::size_t start_all_reduce(int replica, ReduceOp op, std::vector<Tensor> values) override;
  std::vector<Tensor> wait_all_reduce(int replica, std::size_t bucket,
                                      std::chrono::steady_clock::time_point& all_started) override;
  void end_step(int replica) override { buckets_.finish(replica); }
  void abort_buckets(const std::string& why) override { buckets_.abort(why); }
  /// Between steps (no replica inside a collective): forgets the last step's shared results;
  /// the flight recorder numbers the collectives of `step` from 0.
  void reset(std::uint64_t step = 0);
  /// The flight recorder's view of a bucket started (its entry stays queued until the replica
  /// takes the result) and of its result taken (`ok`) or its failure.
  /// note_bucket_started returns the bucket's number in this step (its order among the replica's).
  std::size_t note_bucket_started(int replica, const std::vector<Tensor>& values);
  void note_bucket_waited(int replica, std::size_t bucket, bool ok);
  /// The buckets of start_all_reduce, for a stage that follows the local sums.
  GradientBuckets& buckets() { return buckets_; }
  const GradientBuckets& buckets() const { return buckets_; }
  const Device& device(int replica) const { return devices_[static_cast<std::size_t>(replica)]; }

 private:
  void run_all_reduce(int replica, ReduceOp op, const Tensor* values, Tensor* outputs, std::size_t count);

  transport::shm_group& group_;
  std::vector<Device> devices_;
  // A fused all-reduce writes its sums once, into replica 0's outputs, which every replica then
  // returns (tensors are immutable: sharing the storage is safe). Replica 0 publishes them before
  // the collective, the others take them after it; double-buffered by the parity of the replica's
  // all-reduce count, since replica 0 may publish the next one while a slow replica still reads.
  // The flight recorder's entry of a collective of `replica`, numbered within the step.
  std::uint64_t next_number(int replica) { return numbered_[static_cast<std::size_t>(replica)]++; }

  std::vector<std::uint64_t> rounds_;  // per replica: all-reduces begun this step
  std::uint64_t step_ = 0;                // the step running, for the flight recorder
  std::vector<std::uint64_t> numbered_;  // per replica: collectives begun this step
  std::vector<std::vector<std::uint64_t>> bucket_tickets_;  // per replica: its buckets' entries
  std::vector<Tensor> published_[2];
  GradientBuckets buckets_;
};

/// One replica alone (the default strategy): every collective returns its input.
class IdentityCollectives final : public ReplicaCollectives {
 public:
  std::vector<Tensor> all_reduce(int replica, ReduceOp op, const std::vector<Tensor>& values) override;
  Tensor all_reduce(int replica, ReduceOp op, const Tensor& value) override;
  Tensor all_gather(int replica, const Tensor& value, int axis) override;
  void merge(int replica, const void* mine,
             const std::function<void(const std::vector<const void*>&)>& on_first) override;
};

}  // namespace troupe::distribute::detail
