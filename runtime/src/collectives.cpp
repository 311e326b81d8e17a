#include "collectives.hpp"

#include <memory>
#include <stdexcept>
#include <string>

#include "troupe/errors.hpp"

namespace troupe::distribute::detail {

transport::scalar_type to_scalar_type(DType dtype) {
  static_assert(static_cast<int>(DType::f32) == static_cast<int>(transport::scalar_type::f32) &&
                static_cast<int>(DType::i64) == static_cast<int>(transport::scalar_type::i64));
  return static_cast<transport::scalar_type>(dtype);
}

int checked_axis(const char* op, int axis, int rank) {
  if (rank == 0 || axis < -rank || axis >= rank) {
    throw std::invalid_argument(std::string(op) + ": axis " + std::to_string(axis) + " out of range for rank-" +
                                std::to_string(rank) + " tensor (expected " +
                                (rank == 0 ? std::string("a tensor of rank >= 1") : "0.." + std::to_string(rank - 1)) +
                                ")");
  }
  return axis < 0 ? axis + rank : axis;
}

std::vector<Tensor> ShmCollectives::all_reduce(int replica, ReduceOp op, const std::vector<Tensor>& values) {
  const Device& device = devices_[static_cast<std::size_t>(replica)];
  std::vector<Tensor> outputs;
  outputs.reserve(values.size());
  std::vector<transport::buffer> buffers(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const Tensor& v = values[i];
    outputs.push_back(Tensor::empty(v.shape(), v.dtype(), device));
    buffers[i].in = v.raw_data();
    buffers[i].out = outputs.back().raw_mutable_data();
    buffers[i].count = v.num_elements();
    buffers[i].type = to_scalar_type(v.dtype());
    buffers[i].shape = v.shape();
  }
  try {
    group_.all_reduce(replica, std::move(buffers),
                      op == ReduceOp::sum ? transport::reduce_kind::sum : transport::reduce_kind::mean,
                      std::make_shared<const std::vector<Tensor>>(values));
  } catch (const transport::aborted_error& e) {
    throw CollectiveAborted(e.what());
  }
  return outputs;
}

Tensor ShmCollectives::all_gather(int replica, const Tensor& value, int axis) {
  const int ax = checked_axis("all_gather", axis, value.rank());
  const Device& device = devices_[static_cast<std::size_t>(replica)];
  transport::buffer in;
  in.in = value.raw_data();
  in.count = value.num_elements();
  in.type = to_scalar_type(value.dtype());
  in.shape = value.shape();
  Tensor out;
  try {
    group_.all_gather(
        replica, in, ax,
        [&](const std::vector<std::int64_t>& shape) {
          out = Tensor::empty(shape, value.dtype(), device);
          return out.raw_mutable_data();
        },
        std::make_shared<const Tensor>(value));
  } catch (const transport::aborted_error& e) {
    throw CollectiveAborted(e.what());
  }
  return out;
}

std::vector<Tensor> IdentityCollectives::all_reduce(int, ReduceOp, const std::vector<Tensor>& values) {
  return values;
}

Tensor IdentityCollectives::all_gather(int, const Tensor& value, int axis) {
  checked_axis("all_gather", axis, value.rank());
  return value;
}

}  // namespace troupe::distribute::detail
