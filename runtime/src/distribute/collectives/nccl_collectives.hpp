#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distribute/collectives/collectives.hpp"

namespace troupe::distribute::detail {

/// The collectives of GPU replicas in one process: one NCCL communicator per GPU
/// (ncclCommInitAll), each replica enqueuing its calls on its own CUDA stream. The replicas first
/// meet on the host (through the shared-memory group) to check that they agree on what they
/// reduce, so a mismatch fails with an error naming both replicas instead of corrupting memory.
///
/// Failure: when a replica fails, the others may already wait inside an NCCL kernel. fail() aborts
/// the communicators (ncclCommAbort), which releases them; drain() waits for a replica's stream
/// with a bound (`timeout`, 0: none) and aborts in the same way when it runs out. The next step
/// starts with new communicators (prepare()).
/// Communicators spanning several processes (MultiWorkerMirroredStrategy with NCCL): this
/// process's replicas are ranks first_rank.. of nranks, joined by the chief's id.
struct NcclWorld {
  int nranks = 0;  ///< 0: this process's GPUs alone (ncclCommInitAll)
  int first_rank = 0;
  std::string id;  ///< nccl_unique_id_hex() of the chief
  std::chrono::milliseconds join_timeout{0};
};

/// A new NCCL unique id as hex, for the chief to hand every worker (throws without CUDA).
std::string nccl_unique_id();

class NcclCollectives final : public ReplicaCollectives {
 public:
  using World = NcclWorld;

  NcclCollectives(transport::shm_group& group, std::vector<Device> devices, std::chrono::milliseconds timeout,
                  NcclWorld world = NcclWorld());
  ~NcclCollectives() override;

  std::vector<Tensor> all_reduce(int replica, ReduceOp op, const std::vector<Tensor>& values) override;
  Tensor all_reduce(int replica, ReduceOp op, const Tensor& value) override;
  Tensor all_gather(int replica, const Tensor& value, int axis) override;
  void merge(int replica, const void* mine,
             const std::function<void(const std::vector<const void*>&)>& on_first) override;

  /// Before step `step`: new communicators if the last step aborted them (in one process; across
  /// processes the cluster has to start again, and this throws CollectiveAborted saying so). The
  /// flight recorder numbers the step's collectives from 0; each is recorded when enqueued and
  /// ended by drain() (done, or failed when the step fails or the wait runs out).
  void prepare(std::uint64_t step = 0);
  /// A replica failed: releases every replica waiting inside NCCL.
  void fail() noexcept;
  /// Waits, bounded, for everything replica `replica` enqueued; throws CollectiveAborted when the
  /// step was failed or the wait ran out.
  void drain(int replica);

 private:
  void drain_stream(int replica);
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// NcclAllReduce's reduce: the values (one per GPU, distinct GPUs) summed by NCCL onto the first
/// value's GPU, divided for MEAN. `cache` keeps the communicators between calls.
Tensor nccl_reduce(ReduceOp op, const std::vector<Tensor>& values, std::shared_ptr<void>& cache,
                   std::mutex& cache_mutex);

}  // namespace troupe::distribute::detail
