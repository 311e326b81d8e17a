#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

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

/// How float32 gradients cross workers (Horovod's hvd.Compression).
enum class Compression {
  none,  ///< float32 on the wire
  fp16,  ///< IEEE binary16: half the bytes, 11 significant bits, |x| up to 65504 (larger: inf)
  bf16,  ///< bfloat16: half the bytes, 8 significant bits, float32's range
};

/// "none", "fp16", "bf16".
const char* compression_name(Compression c) noexcept;

/// tf.distribute.experimental.CommunicationOptions.
struct CommunicationOptions {
  CommunicationImplementation implementation = CommunicationImplementation::automatic;
  /// The tensors of one all_reduce call cross workers packed by dtype into collectives of at most
  /// this many bytes (0: one pack per dtype; a tensor larger than the limit travels alone). When
  /// set, it is also the size of Model::train_step's gradient buckets (in place of
  /// RuntimeOptions::gradient_bucket_bytes): each bucket crosses the ring as soon as its local sum
  /// exists, while the replicas still differentiate earlier layers. With 2 workers the weights do
  /// not depend on it; with more, the ring's order of additions follows the packs, so the bits
  /// may (every worker still gets the same ones).
  std::size_t bytes_per_pack = 0;
  /// The longest any cross-worker collective waits for a peer; 0 takes the runtime's
  /// RuntimeOptions::collective_timeout_ms (TROUPE_COLLECTIVE_TIMEOUT_MS), and when that is 0 too waits as long as the peer's connection is alive (a dead worker is
  /// noticed as soon as its sockets close, a hung one only through a timeout).
  std::chrono::milliseconds timeout{0};
  /// The format of float32 tensors on the TCP ring of all_reduce in replica context (the
  /// cross-worker stage of the hierarchical all-reduce); every other tensor, collective and stage
  /// is unchanged. Each worker rounds its local sum to the format (nearest even), the ring sums in
  /// float32 and rounds each partial sum again, and every replica of every worker receives the
  /// same bits, widened back to float32. Every worker must choose the same setting (a mismatch
  /// fails the first all_reduce on every worker). A value outside the enum is std::invalid_argument.
  Compression compression = Compression::none;
};

/// The settings of a multi-worker cluster beyond tf.distribute's CommunicationOptions, with named
/// defaults. from_environment() reads them from TROUPE_* variables (a malformed value throws
/// std::invalid_argument naming the variable and its valid range).
struct MultiWorkerOptions {
  static constexpr std::chrono::milliseconds default_start_timeout{60000};
  static constexpr std::chrono::milliseconds default_heartbeat_interval{500};
  static constexpr int default_missed_heartbeats = 6;
  static constexpr std::chrono::seconds default_stall_warning{60};

  /// TROUPE_START_TIMEOUT_MS: how long the rendezvous and the ring's set-up may take (1..86400000).
  std::chrono::milliseconds start_timeout = default_start_timeout;
  /// TROUPE_HEARTBEAT_MS: how often every worker tells the chief it lives (10..600000).
  std::chrono::milliseconds heartbeat_interval = default_heartbeat_interval;
  /// TROUPE_MISSED_HEARTBEATS: heartbeat intervals a worker may stay silent before the chief
  /// declares it gone (1..1000). A check that comes more than two intervals late (this process was
  /// stopped or starved) blames nobody, on the chief and on the workers alike.
  int missed_heartbeats = default_missed_heartbeats;
  /// TROUPE_STALL_WARNING_S: when a worker has waited in a cross-worker collective longer than
  /// this, the chief prints one line naming the collective, the workers waiting and where every
  /// other worker is (its stall inspector, docs/when_training_stalls.md), repeated at a back-off,
  /// and shows it on the dashboard (1 s..7 days; the variable in whole seconds, 1..604800).
  std::chrono::milliseconds stall_warning = default_stall_warning;
  /// TROUPE_STALL_SHUTDOWN_S: past this wait the chief ends the cluster, every worker failing with
  /// the stall line as the error (0: never, the default; else 1 s..7 days).
  std::chrono::milliseconds stall_shutdown{0};
  /// TROUPE_DEVICES_PER_WORKER: local replicas (1..1024); 0 means every GPU under NCCL, else one
  /// CPU replica.
  int devices_per_worker = 0;
  /// TROUPE_CLUSTER_TOKEN: the secret every worker shares. With one, the control plane
  /// (rendezvous, heartbeats, goodbyes) is mutual TLS from a certificate the token derives, so only
  /// its holders reach it. Empty: plain, unauthenticated control messages, allowed only on a
  /// cluster whose every address is loopback, or with `insecure`.
  std::string cluster_token;
  /// TROUPE_INSECURE=1: lets a cluster that spans more than loopback start without a token (a
  /// trusted, isolated network only: anyone who reaches the chief's port can stall or exhaust it).
  bool insecure = false;
  /// TROUPE_RESTART_COUNT: how many times this cluster was started again before this start
  /// (0..1000000; troupe-launch --max-restarts sets it). The chief's dashboard shows it, with the
  /// cluster's incarnation.
  int restart_count = 0;
  /// TROUPE_ELASTIC=1: elastic membership (opt-in; CPU replicas over the TCP ring). Under
  /// Model::fit a worker lost (its process died, or it went silent) is dropped: the others roll
  /// back to their last in-memory commit, re-form the ring without it and go on, the global batch
  /// the same (docs/multi-worker.md, "Elastic membership"). The chief lost, or fewer than
  /// min_workers left, ends the cluster as without elasticity, naming why. A process started with
  /// TROUPE_JOIN=1 joins the running cluster at a step boundary and receives its state.
  bool elastic = false;
  /// TROUPE_MIN_WORKERS: the fewest workers an elastic cluster trains with (1..65536); below it
  /// the cluster ends, as a non-elastic one does. At most the cluster's size at start.
  int min_workers = 1;
  /// TROUPE_MAX_WORKERS: the most workers an elastic cluster may grow to (0: its size at start;
  /// else min_workers..65536, at least its size at start): a join beyond it is refused.
  int max_workers = 0;
  /// TROUPE_COMMIT_EVERY_STEPS: an elastic cluster commits its training state in memory at every
  /// this many step boundaries (1..1000000; 1 suits small models, whose commit costs little beside
  /// a step: bench/elastic_commit_bench.cpp).
  int commit_every_steps = 1;

  /// The defaults with the TROUPE_* environment applied.
  static MultiWorkerOptions from_environment();
};

/// Synchronous training over several workers, each with the same local devices
/// (tf.distribute.MultiWorkerMirroredStrategy). Every worker runs the same program; the cluster
/// resolver (TF_CONFIG by default) says who is who. Construction blocks until every worker has
/// joined (bounded by MultiWorkerOptions::start_timeout), then num_replicas_in_sync() is workers x
/// local devices. Local devices: MultiWorkerOptions::devices_per_worker CPU replicas (default 1).
///
/// Collectives are hierarchical: the replicas of a worker all-reduce through shared memory, their
/// leader (local replica 0) joins a TCP ring with the other workers' leaders, and the result is
/// copied back to the local replicas. run, reduce, all_reduce in replica context and
/// experimental_distribute_dataset work across workers; gather and all_gather across workers
/// concatenate along axis 0; merge_call spans the local replicas only.
class MultiWorkerMirroredStrategy : public Strategy {
 public:
  /// With MultiWorkerOptions::from_environment().
  explicit MultiWorkerMirroredStrategy(Runtime& runtime, CommunicationOptions options = {},
                                       std::shared_ptr<ClusterResolver> resolver = nullptr);
  MultiWorkerMirroredStrategy(Runtime& runtime, CommunicationOptions options, std::shared_ptr<ClusterResolver> resolver,
                              MultiWorkerOptions settings);
  ~MultiWorkerMirroredStrategy() override;
  ClusterResolver* cluster_resolver() override { return resolver_.get(); }
  /// Under MultiWorkerOptions::elastic: the changes of membership the cluster went through (a
  /// lost worker dropped, a worker joined); 0 otherwise.
  int membership_changes();

 private:
  std::shared_ptr<ClusterResolver> resolver_;
};

}  // namespace troupe::distribute
