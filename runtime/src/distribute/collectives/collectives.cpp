#include "distribute/collectives/collectives.hpp"

#include <algorithm>
#include <memory>
#include <vector>
#include <stdexcept>
#include <string>

#include "axis.hpp"
#include "elements.hpp"
#include "flight_recorder.hpp"
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

using troupe::detail::flight_collective;
using troupe::detail::flight_group;
using troupe::detail::flight_op;
using troupe::detail::flight_scope;
using troupe::detail::FlightRecorder;

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
  flight_collective what;
  what.step = step_;
  what.collective = static_cast<std::int64_t>(next_number(replica));
  what.op = flight_op::all_reduce;
  what.participants = group_.size();
  what.replica = replica;
  what.bytes = total_bytes;
  what.has_dtype = count > 0;
  if (count > 0) what.dtype = troupe::detail::to_scalar_type(values[0].dtype());
  flight_scope recorded(FlightRecorder::process(), what);
  const in_collective inside(buckets_, replica);
  try {
    group_.all_reduce(replica, tl_buffers.data(), count,
                      troupe::detail::to_reduce_kind(op), shared);
  } catch (const transport::aborted_error& e) {
    throw CollectiveAborted(e.what());
  }
  recorded.done();
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
  flight_collective what;
  what.step = step_;
  what.collective = static_cast<std::int64_t>(next_number(replica));
  what.op = flight_op::all_gather;
  what.participants = group_.size();
  what.replica = replica;
  what.bytes = host.nbytes();
  what.has_dtype = true;
  what.dtype = troupe::detail::to_scalar_type(value.dtype());
  flight_scope recorded(FlightRecorder::process(), what);
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
  recorded.done();
  return out;
}

void ShmCollectives::reset(std::uint64_t step) {
  step_ = step;
  std::fill(rounds_.begin(), rounds_.end(), 0);
  std::fill(numbered_.begin(), numbered_.end(), 0);
  for (auto& tickets : bucket_tickets_) tickets.clear();  // keeps their capacity: no allocation per step
  published_[0].clear();
  published_[1].clear();
  buckets_.reset();
}

std::size_t ShmCollectives::note_bucket_started(int replica, const std::vector<Tensor>& values) {
  auto& tickets = bucket_tickets_[static_cast<std::size_t>(replica)];
  const std::size_t bucket = tickets.size();
  FlightRecorder* recorder = FlightRecorder::process();
  if (recorder == nullptr) {
    tickets.push_back(~std::uint64_t{0});
    return bucket;
  }
  flight_collective what;
  what.step = step_;
  what.collective = static_cast<std::int64_t>(next_number(replica));
  what.op = flight_op::bucket_all_reduce;
  what.participants = group_.size();
  what.replica = replica;
  for (const Tensor& v : values) what.bytes += v.nbytes();
  what.has_dtype = !values.empty();
  if (!values.empty()) what.dtype = troupe::detail::to_scalar_type(values[0].dtype());
  tickets.push_back(recorder->enqueue(what));
  return bucket;
}

void ShmCollectives::note_bucket_waited(int replica, std::size_t bucket, bool ok) {
  FlightRecorder* recorder = FlightRecorder::process();
  const auto& tickets = bucket_tickets_[static_cast<std::size_t>(replica)];
  if (recorder == nullptr || bucket >= tickets.size() || tickets[bucket] == ~std::uint64_t{0}) return;
  recorder->end(tickets[bucket], ok);
}

std::size_t ShmCollectives::start_all_reduce(int replica, ReduceOp op, std::vector<Tensor> values) {
  if (group_.size() == 1) return ReplicaCollectives::start_all_reduce(replica, op, std::move(values));
  const std::size_t next = note_bucket_started(replica, values);
  try {
    return buckets_.start(replica, op, std::move(values), device(replica));
  } catch (...) {
    note_bucket_waited(replica, next, false);
    throw;
  }
}

std::vector<Tensor> ShmCollectives::wait_all_reduce(int replica, std::size_t bucket,
                                                    std::chrono::steady_clock::time_point& all_started) {
  if (group_.size() == 1) return ReplicaCollectives::wait_all_reduce(replica, bucket, all_started);
  bool ok = false;
  struct ending {
    ShmCollectives& self;
    int replica;
    std::size_t bucket;
    bool& ok;
    ~ending() { self.note_bucket_waited(replica, bucket, ok); }
  } end_entry{*this, replica, bucket, ok};
  std::vector<Tensor> out = buckets_.wait(replica, bucket, device(replica), all_started);
  ok = true;
  return out;
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
  flight_collective what;
  what.step = step_;
  what.collective = static_cast<std::int64_t>(next_number(replica));
  what.op = flight_op::merge_call;
  what.participants = group_.size();
  what.replica = replica;
  flight_scope recorded(FlightRecorder::process(), what);
  const in_collective inside(buckets_, replica);
  try {
    group_.merge(replica, mine, on_first);
  } catch (const transport::aborted_error& e) {
    throw CollectiveAborted(e.what());
  }
  recorded.done();
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
