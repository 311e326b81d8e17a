#pragma once

#include <atomic>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

#include "distribute/collectives/collectives.hpp"
#include "distribute/collectives/worker_group.hpp"
#include "troupe/distribute/multi_worker_strategy.hpp"

namespace troupe::distribute::detail {

/// The collectives of CPU replicas spread over several workers, in three stages: the local
/// replicas meet through shared memory, local replica 0 (the worker's leader) joins the ring among
/// the workers' leaders, and the result goes back to the local replicas.
class HierarchicalCollectives final : public ReplicaCollectives {
 public:
  /// `global_replicas`: replicas over every worker (MEAN's divisor). `bytes_per_pack` and
  /// `compression`: see CommunicationOptions.
  HierarchicalCollectives(ShmCollectives& local, RingWorkerGroup& workers, int global_replicas,
                          std::size_t bytes_per_pack, Compression compression = Compression::none)
      : local_(local),
        workers_(workers),
        global_replicas_(global_replicas),
        bytes_per_pack_(bytes_per_pack),
        compression_(compression) {}
  ~HierarchicalCollectives() override;
  HierarchicalCollectives(const HierarchicalCollectives&) = delete;
  HierarchicalCollectives& operator=(const HierarchicalCollectives&) = delete;

  std::vector<Tensor> all_reduce(int replica, ReduceOp op, const std::vector<Tensor>& values) override;
  Tensor all_reduce(int replica, ReduceOp op, const Tensor& value) override;
  Tensor all_gather(int replica, const Tensor& value, int axis) override;
  void merge(int replica, const void* mine,
             const std::function<void(const std::vector<const void*>&)>& on_first) override;

  /// A bucket is summed locally while the replicas go on (GradientBuckets); a thread of its own
  /// then all-reduces it across workers on the ring, bucket after bucket in the order started
  /// (the same on every worker), while the replicas still differentiate. Collectives that use the
  /// ring from a replica first wait for the started buckets.
  std::size_t start_all_reduce(int replica, ReduceOp op, std::vector<Tensor> values) override;
  std::vector<Tensor> wait_all_reduce(int replica, std::size_t bucket,
                                      std::chrono::steady_clock::time_point& all_started) override;
  std::chrono::nanoseconds peer_wait_within(std::chrono::steady_clock::time_point from,
                                            std::chrono::steady_clock::time_point to) const override {
    return local_.buckets().peer_wait_within(from, to);
  }
  void end_step(int replica) override;
  void abort_buckets(const std::string& why) override { local_.abort_buckets(why); }

 private:
  // `on_wait(begin, first_from_prev)` after each ring operation, when given.
  void ring_all_reduce_packed(
      std::vector<Tensor>& tensors,
      const std::function<void(std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point)>& on_wait =
          nullptr);
  // The ring stage of the buckets: runs on ring_thread_.
  void ring_stage();

  ShmCollectives& local_;
  RingWorkerGroup& workers_;
  int global_replicas_;
  std::size_t bytes_per_pack_;
  Compression compression_;
  std::once_flag ring_thread_started_;
  std::atomic<bool> in_ring_{false};  // the ring thread is inside a ring operation
  std::thread ring_thread_;
};

}  // namespace troupe::distribute::detail
