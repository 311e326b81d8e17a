#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "troupe/device.hpp"
#include "troupe/distribute/reduce_op.hpp"
#include "troupe/tensor.hpp"
#include "troupe/transport/shm_group.hpp"

namespace troupe::distribute::detail {

/// The collectives behind ReplicaContext, for the replicas of one strategy.
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

 private:
  std::shared_ptr<const void> merge_result_;
};

/// The replicas of one process, through transport::shm_group.
class ShmCollectives final : public ReplicaCollectives {
 public:
  ShmCollectives(transport::shm_group& group, std::vector<Device> devices)
      : group_(group), devices_(std::move(devices)), rounds_(devices_.size(), 0) {}
  std::vector<Tensor> all_reduce(int replica, ReduceOp op, const std::vector<Tensor>& values) override;
  Tensor all_reduce(int replica, ReduceOp op, const Tensor& value) override;
  Tensor all_gather(int replica, const Tensor& value, int axis) override;
  void merge(int replica, const void* mine,
             const std::function<void(const std::vector<const void*>&)>& on_first) override;
  /// Between steps (no replica inside a collective): forgets the last step's shared results.
  void reset();

 private:
  void run_all_reduce(int replica, ReduceOp op, const Tensor* values, Tensor* outputs, std::size_t count);

  transport::shm_group& group_;
  std::vector<Device> devices_;
  // A fused all-reduce writes its sums once, into replica 0's outputs, which every replica then
  // returns (tensors are immutable: sharing the storage is safe). Replica 0 publishes them before
  // the collective, the others take them after it; double-buffered by the parity of the replica's
  // all-reduce count, since replica 0 may publish the next one while a slow replica still reads.
  std::vector<std::uint64_t> rounds_;  // per replica: all-reduces begun this step
  std::vector<Tensor> published_[2];
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

base::scalar_type to_scalar_type(DType dtype);

}  // namespace troupe::distribute::detail
