#include "troupe/distribute/multi_worker_strategy.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <mutex>
#include <string>
#include <thread>

#include "axis.hpp"
#include "collectives.hpp"
#include "env.hpp"
#include "middleman.hpp"
#include "mirrored_backend.hpp"
#include "troupe/actors/rendezvous.hpp"
#include "troupe/errors.hpp"
#include "troupe/transport/tcp_ring.hpp"

namespace troupe::distribute {
namespace {

std::pair<std::string, std::uint16_t> split_address(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) throw std::invalid_argument("address \"" + address + "\" has no port");
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return {host, static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1)))};
}

// Task names of the training tasks in rank order: the chief first, then the workers.
std::vector<std::string> training_tasks(const ClusterSpec& spec) {
  std::vector<std::string> tasks;
  if (spec.has_job("chief")) tasks.push_back("/job:chief/replica:0/task:0");
  if (spec.has_job("worker")) {
    for (int i = 0; i < spec.num_tasks("worker"); ++i) tasks.push_back("/job:worker/replica:0/task:" + std::to_string(i));
  }
  return tasks;
}

transport::scalar_type scalar(DType d) { return detail::to_scalar_type(d); }

// What the cluster watch learnt: the first worker declared gone, and the ring to break so that
// collectives waiting on it fail at once. Shared with the watch's actor thread.
struct FailureBox {
  std::mutex mutex;
  std::string reason;
  transport::tcp_ring* ring = nullptr;

  void report(const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex);
    if (reason.empty()) reason = why;
    if (ring != nullptr) ring->shutdown();
  }
  std::string get() {
    std::lock_guard<std::mutex> lock(mutex);
    return reason;
  }
};

// This worker's part of the cluster: the ring among the workers' leaders.
struct Cluster {
  ~Cluster() {
    watch.reset();  // no more verdicts
    std::lock_guard<std::mutex> lock(failures->mutex);
    failures->ring = nullptr;
  }

  int rank = 0;
  int workers = 1;
  std::vector<actors::member> members;
  std::unique_ptr<transport::listener> data_listener;
  std::unique_ptr<transport::tcp_ring> ring;
  std::shared_ptr<FailureBox> failures = std::make_shared<FailureBox>();
  std::unique_ptr<actors::cluster_watch> watch;  // declared last: destroyed first

  // A fresh host tensor holding `t`'s elements, for the ring to work on in place (tensors that
  // are shared must not change): a GPU tensor's copy to the host is fresh already.
  static Tensor host_copy(const Tensor& t) {
    if (t.is_gpu()) return t.to(Device());
    Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device());
    if (t.nbytes() > 0) std::memcpy(out.raw_mutable_data(), t.raw_data(), t.nbytes());
    return out;
  }

  // Sums `t` (a tensor of this worker's) over the workers.
  Tensor sum(const Tensor& t) {
    Tensor out = host_copy(t);
    ring_all_reduce(out);
    return out.to(t.device());
  }

  // The chief's `t` on every worker: a broadcast on the ring (the workers' tensors must have one
  // size; a worker that disagrees is named).
  Tensor broadcast(const Tensor& t) {
    Tensor out = host_copy(t);
    try {
      ring->broadcast(out.raw_mutable_data(), out.nbytes(), 0);
    } catch (const transport::peer_error& e) {
      throw CollectiveAborted(describe(e));
    }
    return out.to(t.device());
  }

  void ring_all_reduce(Tensor& t) {
    try {
      ring->all_reduce(t.raw_mutable_data(), t.num_elements(), scalar(t.dtype()), transport::reduce_kind::sum);
    } catch (const transport::peer_error& e) {
      throw CollectiveAborted(describe(e));
    }
  }

  void ring_all_gather(const void* mine, std::size_t my_bytes, void* out, const std::vector<std::size_t>& bytes) {
    try {
      ring->all_gather(mine, my_bytes, out, bytes);
    } catch (const transport::peer_error& e) {
      throw CollectiveAborted(describe(e));
    }
  }

  std::string describe(const transport::peer_error& e) const {
    std::string who = "worker " + std::to_string(e.peer());
    if (e.peer() >= 0 && static_cast<std::size_t>(e.peer()) < members.size()) {
      const auto& m = members[static_cast<std::size_t>(e.peer())];
      who = m.task + " (" + m.data_host + ":" + std::to_string(m.data_port) + ")";
    }
    std::string out = std::string("cross-worker collective failed: ") + e.what() + " [peer " + who + "]";
    // What the cluster watch learnt, when it learnt something: often the cause of the broken
    // ring (a worker that stopped or vanished), sometimes only a consequence (the chief left).
    const std::string known = failures->get();
    if (!known.empty()) out += "; cluster watch: " + known;
    return out;
  }

  // Concatenates every worker's `t` along `axis`, in worker order. The workers first learn each
  // other's dtype and shape (an all-gather of one row each) and check that only `axis` differs,
  // then all-gather their elements and join the parts.
  Tensor gather(const Tensor& t_in, int axis) {
    const Tensor t = t_in.to(Device());  // the ring works on host memory
    constexpr int max_rank = 8;
    constexpr int cols = 2 + max_rank;
    if (t.rank() < 1 || t.rank() > max_rank) {
      throw std::invalid_argument("gather across workers: tensors of rank 1.." + std::to_string(max_rank) +
                                  ", got rank " + std::to_string(t.rank()));
    }
    std::int64_t row[cols] = {};
    row[0] = static_cast<std::int64_t>(t.dtype()) + 1;
    row[1] = t.rank();
    for (int d = 0; d < t.rank(); ++d) row[2 + d] = t.shape()[static_cast<std::size_t>(d)];
    Tensor table = Tensor::empty({workers, cols}, DType::i64);
    ring_all_gather(row, sizeof row, table.raw_mutable_data(),
                    std::vector<std::size_t>(static_cast<std::size_t>(workers), sizeof row));
    const auto* all = table.data<std::int64_t>();
    std::vector<Shape> shapes(static_cast<std::size_t>(workers));
    std::vector<std::int64_t> offsets(static_cast<std::size_t>(workers) + 1, 0);
    for (int w = 0; w < workers; ++w) {
      const auto* r = all + w * cols;
      bool same = r[0] == all[0] && r[1] == all[1];
      for (int d = 0; same && d < t.rank(); ++d) same = d == axis || r[2 + d] == all[2 + d];
      if (!same) {
        throw std::invalid_argument("gather across workers: " + members[static_cast<std::size_t>(w)].task +
                                    " sent another dtype or shape than " + members[0].task +
                                    "; only the size of axis " + std::to_string(axis) + " may differ");
      }
      shapes[static_cast<std::size_t>(w)].assign(r + 2, r + 2 + t.rank());
      offsets[static_cast<std::size_t>(w) + 1] =
          offsets[static_cast<std::size_t>(w)] + shape_num_elements(shapes[static_cast<std::size_t>(w)]);
    }
    std::vector<std::size_t> bytes(static_cast<std::size_t>(workers));
    for (std::size_t w = 0; w < bytes.size(); ++w) {
      bytes[w] = static_cast<std::size_t>(offsets[w + 1] - offsets[w]) * dtype_size(t.dtype());
    }
    Tensor flat = Tensor::empty({offsets.back()}, t.dtype());
    ring_all_gather(t.raw_data(), t.nbytes(), flat.raw_mutable_data(), bytes);
    std::vector<Tensor> parts;
    parts.reserve(shapes.size());
    for (std::size_t w = 0; w < shapes.size(); ++w) {
      parts.push_back(flat.slice(offsets[w], offsets[w + 1]).reshape(shapes[w]));
    }
    return troupe::concat(parts, axis).to(t_in.device());
  }
};

// Local shared memory first, the ring among the workers' leaders next, the local replicas last.
class HierarchicalCollectives final : public detail::ReplicaCollectives {
 public:
  HierarchicalCollectives(detail::ShmCollectives& local, Cluster& cluster, int global_replicas,
                          std::size_t bytes_per_pack)
      : local_(local), cluster_(cluster), global_replicas_(global_replicas), bytes_per_pack_(bytes_per_pack) {}

  // The tensors of one call cross the ring in as few operations as possible: those of one dtype
  // are packed into one buffer (of at most bytes_per_pack bytes when that is set; a tensor larger
  // than that travels alone), since every ring operation pays the latency of 2(n-1) hops.
  void ring_all_reduce_packed(std::vector<Tensor>& tensors) {
    std::size_t i = 0;
    while (i < tensors.size()) {
      const DType dtype = tensors[i].dtype();
      std::size_t end = i;
      std::size_t bytes = 0;
      while (end < tensors.size() && tensors[end].dtype() == dtype &&
             (end == i || bytes_per_pack_ == 0 || bytes + tensors[end].nbytes() <= bytes_per_pack_)) {
        bytes += tensors[end].nbytes();
        ++end;
      }
      if (end - i == 1) {
        cluster_.ring_all_reduce(tensors[i]);
      } else {
        Tensor pack = Tensor::empty({static_cast<std::int64_t>(bytes / dtype_size(dtype))}, dtype);
        auto* p = static_cast<char*>(pack.raw_mutable_data());
        for (std::size_t k = i; k < end; ++k) {
          if (tensors[k].nbytes() > 0) std::memcpy(p, tensors[k].raw_data(), tensors[k].nbytes());
          p += tensors[k].nbytes();
        }
        cluster_.ring_all_reduce(pack);
        const auto* q = static_cast<const char*>(pack.raw_data());
        for (std::size_t k = i; k < end; ++k) {
          if (tensors[k].nbytes() > 0) std::memcpy(tensors[k].raw_mutable_data(), q, tensors[k].nbytes());
          q += tensors[k].nbytes();
        }
      }
      i = end;
    }
  }

  std::vector<Tensor> all_reduce(int replica, ReduceOp op, const std::vector<Tensor>& values) override {
    std::vector<Tensor> outs = local_.all_reduce(replica, ReduceOp::sum, values);
    local_.merge(replica, &outs, [&](const std::vector<const void*>& all) {
      // On local replica 0: the ring over the workers, then the sums to the other replicas.
      ring_all_reduce_packed(outs);
      for (std::size_t r = 1; r < all.size(); ++r) {
        auto& theirs = *static_cast<std::vector<Tensor>*>(const_cast<void*>(all[r]));
        for (std::size_t i = 0; i < outs.size(); ++i) {
          // A fused local all-reduce hands every replica one shared result: nothing to copy.
          if (outs[i].nbytes() == 0 || theirs[i].shares_storage_with(outs[i])) continue;
          std::memcpy(theirs[i].raw_mutable_data(), outs[i].raw_data(), outs[i].nbytes());
        }
      }
    });
    if (op == ReduceOp::mean) {
      for (Tensor& t : outs) t = t / Scalar(static_cast<std::int64_t>(global_replicas_));
    }
    return outs;
  }

  Tensor all_reduce(int replica, ReduceOp op, const Tensor& value) override {
    return all_reduce(replica, op, std::vector<Tensor>{value}).at(0);
  }

  Tensor all_gather(int replica, const Tensor& value, int axis) override {
    const int ax = troupe::detail::checked_axis("all_gather", axis, value.rank());
    Tensor mine = local_.all_gather(replica, value, ax);
    local_.merge(replica, &mine, [&](const std::vector<const void*>& all) {
      mine = cluster_.gather(mine, ax);
      for (std::size_t r = 1; r < all.size(); ++r) *static_cast<Tensor*>(const_cast<void*>(all[r])) = mine;
    });
    return mine;
  }

  void merge(int replica, const void* mine,
             const std::function<void(const std::vector<const void*>&)>& on_first) override {
    local_.merge(replica, mine, on_first);
  }

 private:
  detail::ShmCollectives& local_;
  Cluster& cluster_;
  int global_replicas_;
  std::size_t bytes_per_pack_;
};

class MultiWorkerBackend final : public detail::MirroredBackend {
 public:
  MultiWorkerBackend(Runtime& runtime, std::vector<Device> devices, std::unique_ptr<Cluster> cluster,
                     std::size_t bytes_per_pack, detail::NcclWorld world)
      : MirroredBackend(runtime, devices, std::make_shared<ReductionToOneDevice>(), std::move(world)),
        gpu_(devices[0].is_gpu()),
        cluster_(std::move(cluster)),
        local_replicas_(static_cast<int>(devices.size())),
        hierarchical_(shm_collectives(), *cluster_, cluster_->workers * local_replicas_, bytes_per_pack) {}

  int num_replicas_in_sync() const override { return cluster_->workers * local_replicas_; }
  int first_replica_id() const override { return cluster_->rank * local_replicas_; }
  int num_workers() const override { return cluster_->workers; }
  int worker_index() const override { return cluster_->rank; }
  Tensor sum_across_workers(const Tensor& local) override { return cluster_->sum(local); }
  Tensor concat_across_workers(const Tensor& local, int axis) override { return cluster_->gather(local, axis); }
  Tensor broadcast_from_chief(const Tensor& value) override { return cluster_->broadcast(value); }

 protected:
  // GPU replicas meet every worker's through NCCL; CPU replicas locally, then over the TCP ring.
  detail::ReplicaCollectives& replica_collectives() override {
    if (gpu_) return MirroredBackend::replica_collectives();
    return hierarchical_;
  }

 private:
  bool gpu_;
  std::unique_ptr<Cluster> cluster_;
  int local_replicas_;
  HierarchicalCollectives hierarchical_;
};

std::unique_ptr<detail::StrategyBackend> make_multi_worker_backend(Runtime& runtime, const CommunicationOptions& options,
                                                                   const ClusterResolver& resolver) {
  troupe::detail::require_middleman(runtime, "MultiWorkerMirroredStrategy");
  const bool nccl = options.implementation == CommunicationImplementation::nccl;
  const int gpus = Runtime::gpu_count();
  if (nccl && gpus == 0) {
    throw std::invalid_argument(
        "MultiWorkerMirroredStrategy: CommunicationImplementation::NCCL needs GPUs and this machine has none (the "
        "CUDA runtime reports none); use AUTO or RING");
  }
  const ClusterSpec spec = resolver.cluster_spec();
  const std::string task_type = resolver.task_type();
  if (task_type != "chief" && task_type != "worker") {
    throw std::invalid_argument("MultiWorkerMirroredStrategy: task type \"" + task_type +
                                "\" does not train; only chief and worker tasks run the strategy");
  }
  auto cluster = std::make_unique<Cluster>();
  cluster->rank = spec.id_in_cluster(task_type, resolver.task_id());
  const std::vector<std::string> tasks = training_tasks(spec);
  cluster->workers = static_cast<int>(tasks.size());

  // With NCCL every worker runs a replica on each of its GPUs (or the first
  // TROUPE_DEVICES_PER_WORKER); otherwise CPU replicas joined by the TCP ring.
  const int devices_per_worker = troupe::detail::env_int("TROUPE_DEVICES_PER_WORKER", nccl ? gpus : 1, 1, 1024);
  if (nccl && devices_per_worker > gpus) {
    throw std::invalid_argument("MultiWorkerMirroredStrategy: TROUPE_DEVICES_PER_WORKER is " +
                                std::to_string(devices_per_worker) + " but this machine has " + std::to_string(gpus) +
                                " GPU(s)");
  }
  std::vector<Device> devices;
  for (int i = 0; i < devices_per_worker; ++i) devices.emplace_back(nccl ? Device::Type::gpu : Device::Type::cpu, i);

  actors::rendezvous_options ro;
  ro.rank = cluster->rank;
  ro.tasks = tasks;
  std::tie(ro.chief_host, ro.chief_port) = split_address(resolver.coordinator_address());
  ro.devices = devices_per_worker;
  // Where the others reach this worker's data plane: its own cluster address, or its host name
  // when the resolver learns addresses at rendezvous (mpirun).
  const std::string own = resolver.task_address();
  if (own.empty() || own == ClusterSpec::pending_address) {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    ro.data_host = name;
  } else {
    ro.data_host = split_address(own).first;
  }
  cluster->data_listener = std::make_unique<transport::listener>("0.0.0.0", 0);
  ro.data_port = cluster->data_listener->port();
  if (const char* token = std::getenv("TROUPE_CLUSTER_TOKEN")) ro.token = token;
  ro.timeout = std::chrono::milliseconds(troupe::detail::env_int("TROUPE_START_TIMEOUT_MS", 60000, 1, 86400000));
  // The chief makes the NCCL id every worker joins its communicators with.
  if (nccl && cluster->rank == 0) ro.collective_id = detail::nccl_unique_id();
  const auto heartbeat = std::chrono::milliseconds(troupe::detail::env_int("TROUPE_HEARTBEAT_MS", 500, 10, 600000));
  cluster->members = actors::rendezvous(
      runtime.system(), ro, heartbeat,
      [box = cluster->failures](int, const std::string& why) { box->report(why); }, cluster->watch);

  std::vector<transport::endpoint> peers;
  for (const auto& m : cluster->members) peers.push_back({m.data_host, m.data_port});
  try {
    cluster->ring = std::make_unique<transport::tcp_ring>(cluster->rank, cluster->workers, *cluster->data_listener,
                                                          peers, ro.timeout);
  } catch (const transport::peer_error& e) {
    throw std::runtime_error("MultiWorkerMirroredStrategy: " + cluster->describe(e));
  }
  {
    std::lock_guard<std::mutex> lock(cluster->failures->mutex);
    cluster->failures->ring = cluster->ring.get();
    if (!cluster->failures->reason.empty()) cluster->ring->shutdown();  // a verdict came first
  }
  // The start is bounded by the start timeout; collectives after it by options.timeout (0: as long
  // as the peers' connections live).
  const std::chrono::milliseconds collective_timeout =
      options.timeout.count() > 0
          ? options.timeout
          : std::chrono::milliseconds(troupe::detail::env_int("TROUPE_COLLECTIVE_TIMEOUT_MS", 0, 0, 86400000));
  cluster->ring->set_timeout(collective_timeout);
  // Busy-polling pays while the workers have cores of their own; when they all share this host's
  // (a local test cluster larger than the machine), the worker being waited for needs the CPU.
  bool all_local = true;
  for (const auto& m : cluster->members) all_local = all_local && m.data_host == cluster->members[0].data_host;
  const bool crowded = all_local && cluster->workers * devices_per_worker > static_cast<int>(std::thread::hardware_concurrency());
  cluster->ring->set_spin(std::chrono::microseconds(runtime.options().spin_us), crowded);
  detail::NcclWorld world;
  if (nccl) {
    world.id = cluster->members[0].collective_id;
    if (world.id.empty()) {
      throw std::runtime_error(
          "MultiWorkerMirroredStrategy: this worker asked for NCCL but the chief (" + cluster->members[0].task +
          ") sent no NCCL id: every worker must ask for the same CommunicationImplementation");
    }
    world.nranks = cluster->workers * devices_per_worker;
    world.first_rank = cluster->rank * devices_per_worker;
    world.join_timeout = ro.timeout;
  }
  return std::make_unique<MultiWorkerBackend>(runtime, std::move(devices), std::move(cluster), options.bytes_per_pack,
                                              std::move(world));
}

std::shared_ptr<ClusterResolver> default_resolver(std::shared_ptr<ClusterResolver> resolver) {
  if (resolver) return resolver;
  return std::make_shared<TFConfigClusterResolver>();
}

}  // namespace

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(Runtime& runtime, CommunicationOptions options,
                                                         std::shared_ptr<ClusterResolver> resolver)
    : Strategy(make_multi_worker_backend(runtime, options, *(resolver = default_resolver(std::move(resolver))))),
      resolver_(std::move(resolver)) {}

MultiWorkerMirroredStrategy::~MultiWorkerMirroredStrategy() = default;

}  // namespace troupe::distribute
