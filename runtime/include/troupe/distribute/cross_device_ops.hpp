#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "troupe/device.hpp"
#include "troupe/distribute/reduce_op.hpp"
#include "troupe/tensor.hpp"

namespace troupe::distribute {

/// How a strategy combines per-replica values in cross-replica context (Strategy::reduce). Each
/// implementation sums in a fixed order, so the result is the same on every run.
class CrossDeviceOps {
 public:
  virtual ~CrossDeviceOps() = default;
  /// "ReductionToOneDevice", "HierarchicalCopyAllReduce", "NcclAllReduce".
  virtual std::string name() const = 0;
  /// Combines one value per replica (same shape and dtype, else std::invalid_argument naming
  /// both replicas) into one tensor placed on `destination`.
  virtual Tensor reduce(ReduceOp op, const std::vector<Tensor>& per_replica, const Device& destination) = 0;
  /// reduce() for several values at once.
  virtual std::vector<Tensor> batch_reduce(ReduceOp op, const std::vector<std::vector<Tensor>>& values,
                                           const Device& destination);
  /// One copy of `value` per destination device.
  virtual std::vector<Tensor> broadcast(const Tensor& value, const std::vector<Device>& destinations);
  /// Whether this implementation can serve replicas on `devices` (NCCL needs GPUs; the others
  /// serve CPU and GPU replicas alike).
  virtual bool supports(const std::vector<Device>& devices) const;
};

/// Copies every value to one device and sums them there, in replica order.
class ReductionToOneDevice : public CrossDeviceOps {
 public:
  /// `reduce_to_device`: where the sum is computed; by default the first value's GPU for GPU
  /// values (one result crosses to the destination, not every value), else the destination.
  explicit ReductionToOneDevice(std::optional<Device> reduce_to_device = std::nullopt);
  std::string name() const override;
  Tensor reduce(ReduceOp op, const std::vector<Tensor>& per_replica, const Device& destination) override;

 private:
  std::optional<Device> reduce_to_device_;
};

/// Sums in a fixed binary tree (pairs of neighbouring replicas, then pairs of pairs), the shape of
/// the hierarchical copy TensorFlow uses on multi-GPU hosts; on CPU devices the copies are free.
class HierarchicalCopyAllReduce : public CrossDeviceOps {
 public:
  explicit HierarchicalCopyAllReduce(int num_packs = 1);
  std::string name() const override;
  Tensor reduce(ReduceOp op, const std::vector<Tensor>& per_replica, const Device& destination) override;

 private:
  int num_packs_;
};

/// NCCL between GPU replicas (the default on GPUs): the values, one per GPU, are reduced by NCCL
/// onto the first replica's GPU and the result copied to the destination. Only GPU devices are
/// supported; a MirroredStrategy over CPU devices given this one fails at construction with an
/// error saying so.
class NcclAllReduce : public CrossDeviceOps {
 public:
  explicit NcclAllReduce(int num_packs = 1);
  std::string name() const override;
  Tensor reduce(ReduceOp op, const std::vector<Tensor>& per_replica, const Device& destination) override;
  bool supports(const std::vector<Device>& devices) const override;

 private:
  int num_packs_;
  std::shared_ptr<void> communicators_;  // NCCL communicators for the last set of GPUs
  std::mutex mutex_;
};

}  // namespace troupe::distribute
