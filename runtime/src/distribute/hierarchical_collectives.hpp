#pragma once

#include <cstddef>
#include <vector>

#include "distribute/collectives.hpp"
#include "distribute/worker_group.hpp"
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

  std::vector<Tensor> all_reduce(int replica, ReduceOp op, const std::vector<Tensor>& values) override;
  Tensor all_reduce(int replica, ReduceOp op, const Tensor& value) override;
  Tensor all_gather(int replica, const Tensor& value, int axis) override;
  void merge(int replica, const void* mine,
             const std::function<void(const std::vector<const void*>&)>& on_first) override;

 private:
  void ring_all_reduce_packed(std::vector<Tensor>& tensors);

  ShmCollectives& local_;
  RingWorkerGroup& workers_;
  int global_replicas_;
  std::size_t bytes_per_pack_;
  Compression compression_;
};

}  // namespace troupe::distribute::detail
