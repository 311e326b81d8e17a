#include "troupe/distribute/cross_device_ops.hpp"

#include <stdexcept>
#include <string>

#include "distribute/collectives/collectives.hpp"
#include "elements.hpp"
#include "gpu/gpu.hpp"
#include "distribute/collectives/nccl_collectives.hpp"
#include "troupe/kernels/reduce_kernels.hpp"

namespace troupe::distribute {
namespace {

void check_same(const char* who, const std::vector<Tensor>& values) {
  if (values.empty()) throw std::invalid_argument(std::string(who) + ": no values to reduce");
  for (std::size_t r = 1; r < values.size(); ++r) {
    base::check_agree(who, troupe::detail::sent("replica 0", values[0]),
                      troupe::detail::sent("replica " + std::to_string(r), values[r]), -1,
                      " (without an axis, replicas must agree; reduce along an axis to combine a partial batch)");
  }
}

}  // namespace

std::vector<Tensor> CrossDeviceOps::batch_reduce(ReduceOp op, const std::vector<std::vector<Tensor>>& values,
                                                 const Device& destination) {
  std::vector<Tensor> out;
  out.reserve(values.size());
  for (const auto& v : values) out.push_back(reduce(op, v, destination));
  return out;
}

std::vector<Tensor> CrossDeviceOps::broadcast(const Tensor& value, const std::vector<Device>& destinations) {
  std::vector<Tensor> out;
  out.reserve(destinations.size());
  for (const Device& d : destinations) out.push_back(value.with_device(d));
  return out;
}

bool CrossDeviceOps::supports(const std::vector<Device>&) const { return true; }

ReductionToOneDevice::ReductionToOneDevice(std::optional<Device> reduce_to_device)
    : reduce_to_device_(std::move(reduce_to_device)) {}

std::string ReductionToOneDevice::name() const { return "ReductionToOneDevice"; }

Tensor ReductionToOneDevice::reduce(ReduceOp op, const std::vector<Tensor>& per_replica, const Device& destination) {
  check_same("reduce", per_replica);
  const Tensor& first = per_replica[0];
  const Device where = reduce_to_device_.value_or(first.is_gpu() ? first.device() : destination);
  // Every value where the sum is computed (a no-op for values already there).
  std::vector<Tensor> local;
  local.reserve(per_replica.size());
  for (const Tensor& t : per_replica) local.push_back(t.to(where));
  Tensor out = Tensor::empty(first.shape(), first.dtype(), where);
  std::vector<const void*> ins;
  ins.reserve(local.size());
  for (const Tensor& t : local) ins.push_back(t.raw_data());
  const auto kind = troupe::detail::to_reduce_kind(op);
  if (where.is_gpu()) {
    // The same order and arithmetic as the CPU kernel, on the GPU.
    troupe::detail::gpu::reduce_n(where.index(), ins, out.raw_mutable_data(), first.num_elements(),
                                  troupe::detail::to_scalar_type(first.dtype()), kind);
    return out.to(destination);
  }
  void* o = out.raw_mutable_data();
  // The kernel of the in-process all-reduce: the same order, so the same bits as all_reduce.
  kernels::reduce_range(ins.data(), static_cast<int>(ins.size()), &o, 1, 0, first.num_elements(),
                          troupe::detail::to_scalar_type(first.dtype()), kind);
  return out.to(destination);
}

HierarchicalCopyAllReduce::HierarchicalCopyAllReduce(int num_packs) : num_packs_(num_packs) {
  if (num_packs < 1) {
    throw std::invalid_argument("HierarchicalCopyAllReduce: num_packs must be at least 1, got " +
                                std::to_string(num_packs));
  }
}

std::string HierarchicalCopyAllReduce::name() const { return "HierarchicalCopyAllReduce"; }

Tensor HierarchicalCopyAllReduce::reduce(ReduceOp op, const std::vector<Tensor>& per_replica,
                                         const Device& destination) {
  check_same("reduce", per_replica);
  std::vector<Tensor> level = per_replica;
  while (level.size() > 1) {
    std::vector<Tensor> next;
    next.reserve((level.size() + 1) / 2);
    // Each pair meets on the left one's device (a GPU-to-GPU copy between GPUs).
    for (std::size_t i = 0; i + 1 < level.size(); i += 2) next.push_back(level[i] + level[i + 1].to(level[i].device()));
    if (level.size() % 2 == 1) next.push_back(level.back());
    level = std::move(next);
  }
  Tensor total = level[0];
  if (op == ReduceOp::mean) total = total / Scalar(static_cast<std::int64_t>(per_replica.size()));
  return total.with_device(destination);
}

NcclAllReduce::NcclAllReduce(int num_packs) : num_packs_(num_packs) {
  if (num_packs < 1) {
    throw std::invalid_argument("NcclAllReduce: num_packs must be at least 1, got " + std::to_string(num_packs));
  }
}

std::string NcclAllReduce::name() const { return "NcclAllReduce"; }

bool NcclAllReduce::supports(const std::vector<Device>& devices) const {
  for (const Device& d : devices) {
    if (!d.is_gpu()) return false;
  }
  return !devices.empty();
}

Tensor NcclAllReduce::reduce(ReduceOp op, const std::vector<Tensor>& per_replica, const Device& destination) {
  check_same("reduce", per_replica);
  return detail::nccl_reduce(op, per_replica, communicators_, mutex_).to(destination);
}

}  // namespace troupe::distribute
