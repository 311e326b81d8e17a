#include "distribute/collectives/collectives.hpp"

#include <algorithm>
#include <memory>
#include <vector>
#include <stdexcept>
#include <string>

#include "axis.hpp"
#include "elements.hpp"
#include "troupe/errors.hpp"

namespace troupe::distribute::detail {

namespace {

// Describes `t` for the transport, reusing `b`'s shape capacity.
void describe(transport::buffer& b, const Tensor& t) {
  b.in = t.raw_data();
  b.count = t.num_elements();
  b.type = troupe::detail::to_scalar_type(t.dtype());
  b.shape.assign(t.shape().begin(), t.shape().end());
  b.keepalive = t.storage_handle();
}

// Per replica thread, so that a step's collectives allocate nothing but their outputs.
thread_local std::vector<transport::buffer> tl_buffers;

// While a replica waits in a collective of the group it starts no gradient bucket (see
// GradientBuckets::set_in_collective).
class in_collective {
 public:
  in_collective(GradientBuckets& buckets, int replica) : buckets_(buckets), replica_(replica) {
    buckets_.set_in_collective(replica_, true);
  }
  ~in_collective() { buckets_.set_in_collective(replica_, false); }
  in_collective(const in_collective&) = delete;
  in_collective& operator=(const in_collective&) = delete;

 private:
  GradientBuckets& buckets_;
  int replica_;
};

}  // namespace

void ShmCollectives::run_all_reduce(int replica, ReduceOp op, const Tensor* values, Tensor* outputs,
                                    std::size_t count) {
  const Device& device = devices_[static_cast<std::size_t>(replica)];
  if (tl_buffers.size() < count) tl_buffers.resize(count);
  std::size_t total_bytes = 0;
  for (std::size_t i = 0; i < count; ++i) total_bytes += values[i].nbytes();
  const bool shared = transport::shm_group::fused(total_bytes, group_.size());
  const std::size_t parity = rounds_[static_cast<std::size_t>(replica)]++ & 1;
  std::vector<Tensor> on_host;  // GPU values the replicas of a CPU strategy were given
  for (std::size_t i = 0; i < count; ++i) {
    if (values[i].is_gpu() && on_host.empty()) on_host.reserve(count);
    const Tensor& value = values[i].is_gpu() ? on_host.emplace_back(values[i].to(device)) : values[i];
    describe(tl_buffers[i], value);
    tl_buffers[i].out = nullptr;
    if (!shared || replica == 0) {
      outputs[i] = Tensor::empty(value.shape(), value.dtype(), device);
      tl_buffers[i].out = outputs[i].raw_mutable_data();
    }
  }
  if (shared && replica == 0) published_[parity].assign(outputs, outputs + count);
  const in_collective inside(buckets_, replica);
  try {
    group_.all_reduce(replica, tl_buffers.data(), count,
                      troupe::detail::to_reduce_kind(op), shared);
  } catch (const transport::aborted_error& e) {
    throw CollectiveAborted(e.what());
  }
  if (shared && replica != 0) {
    const std::vector<Tensor>& sums = published_[parity];
    for (std::size_t i = 0; i < count; ++i) outputs[i] = sums[i].with_device(device);
  }
  for (std::size_t i = 0; i < count; ++i) tl_buffers[i].keepalive.reset();
}

std::vector<Tensor> ShmCollectives::all_reduce(int replica, ReduceOp op, const std::vector<Tensor>& values) {
  std::vector<Tensor> outputs(values.size());
  run_all_reduce(replica, op, values.data(), outputs.data(), values.size());
  return outputs;
}

Tensor ShmCollectives::all_reduce(int replica, ReduceOp op, const Tensor& value) {
  Tensor output;
  run_all_reduce(replica, op, &value, &output, 1);
  return output;
}

Tensor ShmCollectives::all_gather(int replica, const Tensor& value, int axis) {
  const int ax = troupe::detail::checked_axis("all_gather", axis, value.rank());
  const Device& device = devices_[static_cast<std::size_t>(replica)];
  const Tensor host = value.is_gpu() ? value.to(device) : value;
  transport::buffer in;
  describe(in, host);
  Tensor out;
  const in_collective inside(buckets_, replica);
  try {
    group_.all_gather(
        replica, in, ax,
        [&](const std::vector<std::int64_t>& shape) {
          out = Tensor::empty(shape, value.dtype(), device);
          return out.raw_mutable_data();
        });
  } catch (const transport::aborted_error& e) {
    throw CollectiveAborted(e.what());
  }
  return out;
}

void ShmCollectives::reset() {
  std::fill(rounds_.begin(), rounds_.end(), 0);
  published_[0].clear();
  published_[1].clear();
  buckets_.reset();
}

std::size_t ShmCollectives::start_all_reduce(int replica, ReduceOp op, std::vector<Tensor> values) {
  if (group_.size() == 1) return ReplicaCollectives::start_all_reduce(replica, op, std::move(values));
  return buckets_.start(replica, op, std::move(values), device(replica));
}

std::vector<Tensor> ShmCollectives::wait_all_reduce(int replica, std::size_t bucket,
                                                    std::chrono::steady_clock::time_point& all_started) {
  if (group_.size() == 1) return ReplicaCollectives::wait_all_reduce(replica, bucket, all_started);
  return buckets_.wait(replica, bucket, device(replica), all_started);
}

namespace {
// Buckets of collectives that reduce at once, per replica thread: the results until waited for.
thread_local std::vector<std::vector<Tensor>> tl_done_buckets;
thread_local std::size_t tl_waited_buckets = 0;
}  // namespace

std::size_t ReplicaCollectives::start_all_reduce(int replica, ReduceOp op, std::vector<Tensor> values) {
  if (tl_waited_buckets == tl_done_buckets.size()) {
    // Every earlier bucket was taken (or a failed step left them): numbering starts again.
    tl_done_buckets.clear();
    tl_waited_buckets = 0;
  }
  tl_done_buckets.push_back(all_reduce(replica, op, values));
  return tl_done_buckets.size() - 1;
}

std::vector<Tensor> ReplicaCollectives::wait_all_reduce(int, std::size_t bucket,
                                                         std::chrono::steady_clock::time_point& all_started) {
  all_started = std::max(all_started, std::chrono::steady_clock::now());
  if (bucket >= tl_done_buckets.size()) {
    throw std::logic_error("wait_all_reduce: bucket " + std::to_string(bucket) + " was not started on this replica");
  }
  ++tl_waited_buckets;
  return std::move(tl_done_buckets[bucket]);
}

void ShmCollectives::merge(int replica, const void* mine,
                           const std::function<void(const std::vector<const void*>&)>& on_first) {
  const in_collective inside(buckets_, replica);
  try {
    group_.merge(replica, mine, on_first);
  } catch (const transport::aborted_error& e) {
    throw CollectiveAborted(e.what());
  }
}

void IdentityCollectives::merge(int, const void* mine,
                                const std::function<void(const std::vector<const void*>&)>& on_first) {
  on_first({mine});
}

std::vector<Tensor> IdentityCollectives::all_reduce(int, ReduceOp, const std::vector<Tensor>& values) {
  return values;
}

Tensor IdentityCollectives::all_reduce(int, ReduceOp, const Tensor& value) { return value; }

Tensor IdentityCollectives::all_gather(int, const Tensor& value, int axis) {
  troupe::detail::checked_axis("all_gather", axis, value.rank());
  return value;
}

}  // namespace troupe::distribute::detail
