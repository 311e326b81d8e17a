#include "distribute/collectives/nccl_collectives.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <stdexcept>
#include <string>
#include <thread>

#include "axis.hpp"
#include "elements.hpp"
#include "flight_recorder.hpp"
#include "gpu/gpu.hpp"
#include "nccl_group.hpp"
#include "troupe/errors.hpp"

namespace troupe::distribute::detail {
namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::f16: return ncclFloat16;  // NCCL's own 16-bit sums (collectives.hpp)
    case DType::bf16: return ncclBfloat16;
  }
  return ncclFloat32;
}

void check(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(rc));
}

// What one replica brings to a collective, compared on the host before NCCL sees anything.
struct signature {
  const char* op;
  const std::vector<Tensor>* values;
  int axis;  // all_gather: the dimension that may differ; -1 for all_reduce
};

void compare(const std::vector<const void*>& all) {
  const auto& first = *static_cast<const signature*>(all[0]);
  for (std::size_t r = 1; r < all.size(); ++r) {
    const auto& other = *static_cast<const signature*>(all[r]);
    if (other.op != first.op || other.values->size() != first.values->size()) {
      throw std::invalid_argument(std::string("collective mismatch: replica 0 called ") + first.op + " with " +
                                  std::to_string(first.values->size()) + " tensor(s), replica " + std::to_string(r) +
                                  " called " + other.op + " with " + std::to_string(other.values->size()));
    }
    for (std::size_t i = 0; i < first.values->size(); ++i) {
      base::check_agree(first.op, troupe::detail::sent("replica 0", (*first.values)[i]),
                        troupe::detail::sent("replica " + std::to_string(r), (*other.values)[i]), first.axis,
                        first.axis < 0 ? std::string(" (replicas must agree on shape and dtype)")
                                       : "; only dimension " + std::to_string(first.axis) + " may differ");
    }
  }
}

}  // namespace

struct NcclCollectives::impl {
  transport::shm_group& group;
  std::vector<Device> devices;
  std::chrono::milliseconds timeout;
  World world;
  std::mutex mutex;  // guards comms between a failing replica and prepare()
  std::unique_ptr<transport::cuda::nccl_group> comms;
  std::atomic<bool> failed{false};
  // The flight recorder's view: the step, and per replica its collectives' numbers and the
  // entries enqueued and not yet drained (capacity kept between steps: no allocation per step).
  std::uint64_t step = 0;
  std::vector<std::uint64_t> numbered;
  std::vector<std::vector<std::uint64_t>> tickets;

  void record(int replica, troupe::detail::flight_op op, const std::vector<Tensor>& values) {
    troupe::detail::FlightRecorder* recorder = troupe::detail::FlightRecorder::process();
    if (recorder == nullptr) return;
    const auto r = static_cast<std::size_t>(replica);
    troupe::detail::flight_collective what;
    what.step = step;
    what.collective = static_cast<std::int64_t>(numbered[r]++);
    what.op = op;
    what.group = troupe::detail::flight_group::nccl;
    what.participants = nranks();
    what.replica = replica;
    for (const Tensor& v : values) what.bytes += v.nbytes();
    what.has_dtype = !values.empty();
    if (!values.empty()) what.dtype = troupe::detail::to_scalar_type(values[0].dtype());
    tickets[r].push_back(recorder->begin(what));
  }
  void finish(int replica, bool ok) noexcept {
    troupe::detail::FlightRecorder* recorder = troupe::detail::FlightRecorder::process();
    auto& mine = tickets[static_cast<std::size_t>(replica)];
    if (recorder != nullptr) {
      for (const std::uint64_t t : mine) recorder->end(t, ok);
    }
    mine.clear();
  }

  std::vector<int> indices() const {
    std::vector<int> out;
    for (const Device& d : devices) out.push_back(d.index());
    return out;
  }

  std::unique_ptr<transport::cuda::nccl_group> make_comms() const {
    if (world.nranks == 0) return std::make_unique<transport::cuda::nccl_group>(indices());
    return std::make_unique<transport::cuda::nccl_group>(indices(), world.nranks, world.first_rank, world.id,
                                                         world.join_timeout);
  }

  ncclComm_t comm(int replica) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!comms || comms->aborted()) throw CollectiveAborted("NCCL communicators were aborted: another replica failed");
    return static_cast<ncclComm_t>(comms->communicator(replica));
  }

  int nranks() const { return world.nranks == 0 ? static_cast<int>(devices.size()) : world.nranks; }
  int global_rank(int replica) const { return world.first_rank + replica; }

  // After an NCCL call or group: a non-blocking communicator may still be issuing it.
  void settle(int replica, ncclResult_t rc, const char* what) {
    if (rc == ncclInProgress) {
      std::lock_guard<std::mutex> lock(mutex);
      if (comms) comms->settle(replica);
      return;
    }
    check(rc, what);
  }

  void end_group(int replica) { settle(replica, ncclGroupEnd(), "ncclGroupEnd"); }

  void check_agreement(int replica, const signature& mine, NcclCollectives& self) {
    if (devices.size() < 2) return;
    self.merge(replica, &mine, compare);
  }

  Tensor on_device(const Tensor& t, int replica) const {
    const Device& d = devices[static_cast<std::size_t>(replica)];
    return t.is_gpu() && t.device().index() == d.index() ? t : t.to(d);
  }
};

NcclCollectives::NcclCollectives(transport::shm_group& group, std::vector<Device> devices,
                                 std::chrono::milliseconds timeout, World world)
    : impl_(new impl{group, std::move(devices), timeout, std::move(world), {}, nullptr, {}, 0, {}, {}}) {
  impl_->comms = impl_->make_comms();
}

NcclCollectives::~NcclCollectives() = default;

void NcclCollectives::prepare(std::uint64_t step) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->step = step;
  impl_->numbered.assign(impl_->devices.size(), 0);
  impl_->tickets.resize(impl_->devices.size());
  for (auto& t : impl_->tickets) t.clear();
  if (impl_->comms && !impl_->comms->aborted() && !impl_->failed.load()) return;
  if (impl_->world.nranks > 0) {
    throw CollectiveAborted(
        "the NCCL communicators across workers were aborted by an earlier failure; every worker has to start "
        "again (a new MultiWorkerMirroredStrategy)");
  }
  impl_->comms.reset();
  impl_->comms = impl_->make_comms();
  impl_->failed = false;
}

void NcclCollectives::fail() noexcept {
  impl_->failed = true;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->comms) impl_->comms->abort();
}

void NcclCollectives::drain(int replica) {
  try {
    drain_stream(replica);
  } catch (...) {
    impl_->finish(replica, false);
    throw;
  }
  impl_->finish(replica, true);
}

void NcclCollectives::drain_stream(int replica) {
  const int device = impl_->devices[static_cast<std::size_t>(replica)].index();
  auto stream = static_cast<cudaStream_t>(troupe::detail::gpu::stream(device));
  if (impl_->timeout.count() == 0) {
    // Unbounded: the driver's own wait wakes the moment the stream is done. A replica that fails
    // aborts the communicators (fail()), which ends any NCCL kernel this stream waits on.
    const cudaError_t rc = cudaStreamSynchronize(stream);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      if (impl_->failed.load()) throw CollectiveAborted("released: another replica failed");
      throw std::runtime_error("GPU:" + std::to_string(device) + ": " + cudaGetErrorString(rc));
    }
    if (impl_->failed.load()) throw CollectiveAborted("released: another replica failed");
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t rc = cudaStreamQuery(stream);
    if (rc == cudaSuccess) break;
    if (rc != cudaErrorNotReady) {
      (void)cudaGetLastError();
      throw std::runtime_error("GPU:" + std::to_string(device) + ": " + cudaGetErrorString(rc));
    }
    const auto waited = std::chrono::steady_clock::now() - start;
    if (impl_->timeout.count() > 0 && waited >= impl_->timeout) {
      fail();
      throw CollectiveAborted("GPU:" + std::to_string(device) + ": the replica's NCCL collectives did not complete within " +
                              std::to_string(impl_->timeout.count()) + " ms; the communicators were aborted");
    }
    // Poll without sleeping for the first 20 ms (a sleep overshoots by tens of microseconds, which
    // a step would pay), then gently.
    if (waited < std::chrono::milliseconds(20)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  if (impl_->failed.load()) throw CollectiveAborted("released: another replica failed");
}

void NcclCollectives::merge(int replica, const void* mine,
                            const std::function<void(const std::vector<const void*>&)>& on_first) {
  try {
    impl_->group.merge(replica, mine, on_first);
  } catch (const transport::aborted_error& e) {
    throw CollectiveAborted(e.what());
  }
}

std::vector<Tensor> NcclCollectives::all_reduce(int replica, ReduceOp op, const std::vector<Tensor>& values) {
  std::vector<Tensor> inputs;
  inputs.reserve(values.size());
  for (const Tensor& v : values) inputs.push_back(impl_->on_device(v, replica));
  impl_->check_agreement(replica, signature{"all_reduce", &inputs, -1}, *this);
  const Device& device = impl_->devices[static_cast<std::size_t>(replica)];
  auto stream = static_cast<cudaStream_t>(troupe::detail::gpu::stream(device.index()));
  std::vector<Tensor> outputs;
  outputs.reserve(inputs.size());
  for (const Tensor& v : inputs) outputs.push_back(Tensor::empty(v.shape(), v.dtype(), device));
  impl_->record(replica, troupe::detail::flight_op::all_reduce, inputs);
  ncclComm_t comm = impl_->comm(replica);
  auto enqueue = [&](std::size_t i) {
    return ncclAllReduce(inputs[i].raw_data(), outputs[i].raw_mutable_data(),
                         static_cast<std::size_t>(inputs[i].num_elements()), nccl_type(inputs[i].dtype()), ncclSum,
                         comm, stream);
  };
  if (inputs.size() == 1) {
    // One tensor: a plain call, without a group's bookkeeping.
    if (inputs[0].num_elements() > 0) impl_->settle(replica, enqueue(0), "ncclAllReduce");
  } else {
    // A packed list is one NCCL group: one launch for every tensor in it.
    check(ncclGroupStart(), "ncclGroupStart");
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].num_elements() == 0) continue;
      const ncclResult_t rc = enqueue(i);
      if (rc != ncclSuccess) {
        (void)ncclGroupEnd();
        check(rc, "ncclAllReduce");
      }
    }
    impl_->end_group(replica);
  }
  if (op == ReduceOp::mean) {
    // The sum divided by the replica count, as the CPU path does (integer types truncate).
    const auto n = static_cast<std::int64_t>(impl_->nranks());
    for (Tensor& t : outputs) t = t / Scalar(n);
  }
  return outputs;
}

Tensor NcclCollectives::all_reduce(int replica, ReduceOp op, const Tensor& value) {
  return all_reduce(replica, op, std::vector<Tensor>{value})[0];
}

Tensor NcclCollectives::all_gather(int replica, const Tensor& value, int axis) {
  const int ax = troupe::detail::checked_axis("all_gather", axis, value.rank());
  std::vector<Tensor> mine{impl_->on_device(value, replica)};
  const int n = impl_->nranks();
  if (n == 1) return mine[0];
  // The local replicas check that they agree on everything but the gathered dimension; then every
  // rank learns every rank's length along it (an NCCL all-gather of one number each), and each
  // rank's tensor is broadcast from it to all, in one NCCL group, and the parts are joined.
  impl_->check_agreement(replica, signature{"all_gather", &mine, ax}, *this);
  impl_->record(replica, troupe::detail::flight_op::all_gather, mine);
  const Device& device = impl_->devices[static_cast<std::size_t>(replica)];
  auto stream = static_cast<cudaStream_t>(troupe::detail::gpu::stream(device.index()));
  ncclComm_t comm = impl_->comm(replica);
  const auto ax_index = static_cast<std::size_t>(ax);
  Tensor my_length = Tensor::full({1}, mine[0].shape()[ax_index], DType::i64, device);
  Tensor lengths = Tensor::empty({n}, DType::i64, device);
  check(ncclGroupStart(), "ncclGroupStart");
  ncclResult_t rc = ncclAllGather(my_length.raw_data(), lengths.raw_mutable_data(), 1, ncclInt64, comm, stream);
  if (rc != ncclSuccess) {
    (void)ncclGroupEnd();
    check(rc, "ncclAllGather");
  }
  impl_->end_group(replica);
  const std::vector<std::int64_t> all = lengths.to_vector<std::int64_t>();  // waits for the stream
  const int me = impl_->global_rank(replica);
  std::vector<Tensor> parts(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    Shape shape = mine[0].shape();
    shape[ax_index] = all[static_cast<std::size_t>(r)];
    parts[static_cast<std::size_t>(r)] = r == me ? mine[0] : Tensor::empty(shape, value.dtype(), device);
  }
  check(ncclGroupStart(), "ncclGroupStart");
  for (int r = 0; r < n; ++r) {
    Tensor& part = parts[static_cast<std::size_t>(r)];
    if (part.num_elements() == 0) continue;
    void* buffer = part.raw_mutable_data();
    rc = ncclBroadcast(buffer, buffer, static_cast<std::size_t>(part.num_elements()), nccl_type(value.dtype()), r,
                       comm, stream);
    if (rc != ncclSuccess) {
      (void)ncclGroupEnd();
      check(rc, "ncclBroadcast");
    }
  }
  impl_->end_group(replica);
  return concat(parts, ax);
}

namespace {

struct reduce_cache {
  std::vector<int> devices;
  std::unique_ptr<transport::cuda::nccl_group> comms;
};

}  // namespace

std::string nccl_unique_id() { return transport::cuda::nccl_unique_id_hex(); }

Tensor nccl_reduce(ReduceOp op, const std::vector<Tensor>& values, std::shared_ptr<void>& cache,
                   std::mutex& cache_mutex) {
  std::vector<int> devices;
  for (std::size_t r = 0; r < values.size(); ++r) {
    const Tensor& t = values[r];
    if (!t.is_gpu()) {
      throw std::invalid_argument("NcclAllReduce: replica " + std::to_string(r) + "'s value is on " +
                                  t.device().to_string() +
                                  "; NCCL reduces GPU tensors only (use ReductionToOneDevice or "
                                  "HierarchicalCopyAllReduce for CPU replicas)");
    }
    for (int d : devices) {
      if (d == t.device().index()) {
        throw std::invalid_argument("NcclAllReduce: two values are on GPU:" + std::to_string(d) +
                                    "; NCCL needs one value per GPU");
      }
    }
    devices.push_back(t.device().index());
  }
  std::lock_guard<std::mutex> lock(cache_mutex);
  auto* c = static_cast<reduce_cache*>(cache.get());
  if (c == nullptr || c->devices != devices || c->comms->aborted()) {
    auto fresh = std::make_shared<reduce_cache>();
    fresh->devices = devices;
    fresh->comms = std::make_unique<transport::cuda::nccl_group>(devices);
    cache = fresh;
    c = fresh.get();
  }
  const Tensor& first = values[0];
  Tensor out = Tensor::empty(first.shape(), first.dtype(), first.device());
  if (first.num_elements() > 0) {
    check(ncclGroupStart(), "ncclGroupStart");
    for (std::size_t r = 0; r < values.size(); ++r) {
      auto stream = static_cast<cudaStream_t>(troupe::detail::gpu::stream(devices[r]));
      ncclResult_t rc = ncclReduce(values[r].raw_data(), r == 0 ? out.raw_mutable_data() : nullptr,
                                   static_cast<std::size_t>(first.num_elements()), nccl_type(first.dtype()), ncclSum, 0,
                                   static_cast<ncclComm_t>(c->comms->communicator(static_cast<int>(r))), stream);
      if (rc != ncclSuccess) {
        (void)ncclGroupEnd();
        check(rc, "ncclReduce");
      }
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
    for (int d : devices) troupe::detail::gpu::synchronize(d);
  }
  if (op == ReduceOp::mean) out = out / Scalar(static_cast<std::int64_t>(values.size()));
  return out;
}

}  // namespace troupe::distribute::detail
