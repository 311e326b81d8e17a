#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "troupe/distribute/cluster_resolver.hpp"
#include "troupe/distribute/strategy.hpp"
#include "troupe/runtime.hpp"

namespace troupe::distribute {

/// Which collective implementation crosses workers.
enum class CommunicationImplementation {
  automatic,  ///< ring on CPUs (NCCL once GPU replicas exist)
  ring,       ///< troupe's TCP ring
  nccl,       ///< NCCL: needs GPUs, so a clear error on this build
};

/// tf.distribute.experimental.CommunicationOptions.
struct CommunicationOptions {
  CommunicationImplementation implementation = CommunicationImplementation::automatic;
  /// The tensors of one all_reduce call cross workers packed by dtype into collectives of at most
  /// this many bytes (0: one pack per dtype; a tensor larger than the limit travels alone).
  std::size_t bytes_per_pack = 0;
  /// The longest any cross-worker collective waits for a peer; 0 takes TROUPE_COLLECTIVE_TIMEOUT_MS,
  /// and when that is unset too waits as long as the peer's connection is alive (a dead worker is
  /// noticed as soon as its sockets close, a hung one only through a timeout).
  std::chrono::milliseconds timeout{0};
};

/// Synchronous training over several workers, each with the same local devices
/// (tf.distribute.MultiWorkerMirroredStrategy). Every worker runs the same program; the cluster
/// resolver (TF_CONFIG by default) says who is who. Construction blocks until every worker has
/// joined (bounded by TROUPE_START_TIMEOUT_MS, default 60000), then num_replicas_in_sync() is
/// workers x local devices. Local devices: TROUPE_DEVICES_PER_WORKER CPU replicas (default 1).
///
/// Collectives are hierarchical: the replicas of a worker all-reduce through shared memory, their
/// leader (local replica 0) joins a TCP ring with the other workers' leaders, and the result is
/// copied back to the local replicas. run, reduce, all_reduce in replica context and
/// experimental_distribute_dataset work across workers; gather and all_gather across workers
/// concatenate along axis 0; merge_call spans the local replicas only.
class MultiWorkerMirroredStrategy : public Strategy {
 public:
  explicit MultiWorkerMirroredStrategy(Runtime& runtime, CommunicationOptions options = {},
                                       std::shared_ptr<ClusterResolver> resolver = nullptr);
  ~MultiWorkerMirroredStrategy() override;
  ClusterResolver* cluster_resolver() override { return resolver_.get(); }

 private:
  std::shared_ptr<ClusterResolver> resolver_;
};

}  // namespace troupe::distribute
