#pragma once

#include <memory>
#include <string>

namespace caf {
class actor_system;
class actor_system_config;
}

namespace troupe {

/// Settings of a Runtime. The defaults can be changed through the environment:
/// TROUPE_SCHEDULER_THREADS (threads of the actor scheduler, default 2),
/// TROUPE_SPIN_US (how long a waiting replica spins before it sleeps, default 50),
/// TROUPE_COLLECTIVE_TIMEOUT_MS (the longest a GPU replica waits for its NCCL collectives, and a
/// cross-worker collective for its peers, unless CommunicationOptions::timeout says; default 0,
/// no bound), TROUPE_GRADIENT_BUCKET_BYTES (the size of Model::train_step's gradient buckets,
/// unset: 0, one all-reduce after the backward pass), TROUPE_FLIGHT_RECORDER_ENTRIES,
/// TROUPE_FLIGHT_RECORDER_DIR and TROUPE_FLIGHT_RECORDER_DUMP_AT_EXIT (the flight recorder,
/// docs/diagnosis.md).
struct RuntimeOptions {
  static constexpr int default_scheduler_threads = 2;
  static constexpr int default_spin_us = 50;
  static constexpr int default_collective_timeout_ms = 0;
  static constexpr int default_gradient_bucket_bytes = 256 * 1024;
  static constexpr int automatic_gradient_bucket_bytes = -2;
  static constexpr int default_flight_recorder_entries = 2000;

  int scheduler_threads = 0;       ///< 0: TROUPE_SCHEDULER_THREADS, else default_scheduler_threads
  int spin_us = -1;                ///< -1: TROUPE_SPIN_US, else default_spin_us
  int collective_timeout_ms = -1;  ///< -1: TROUPE_COLLECTIVE_TIMEOUT_MS, else 0 (no bound)
  /// Model::train_step all-reduces its gradients in buckets of about this many bytes, in reverse
  /// layer order, each started as soon as the backward pass has produced it, so that the sums
  /// run while earlier layers are still differentiated (a tensor larger than this is a bucket of
  /// its own). 0: every gradient in one all-reduce after the backward pass. Among the replicas of
  /// one process, and across two workers, the results are the same bits either way; across more
  /// workers the ring adds in an order that follows the buckets (the same bits on every worker).
  /// MultiWorkerMirroredStrategy's CommunicationOptions::bytes_per_pack, when set, takes its place;
  /// GPU replicas (NCCL) ignore it. -1: TROUPE_GRADIENT_BUCKET_BYTES, else automatic.
  /// automatic_gradient_bucket_bytes (-2): 0 for now. Measured on 2 cores (bench/README.md), the
  /// buckets cost throughput: about 5 % among the replicas of one process (their sums compete
  /// with backward for the same cores), no gain for the 784-256-256-10 MLP across 2 workers, and
  /// 35-40 % for multi_worker_trainer's small model across 2 workers (the ring thread's hand-offs
  /// cost more than the little they hide). default_gradient_bucket_bytes is the size to start
  /// from where the backward pass is long enough to hide them.
  int gradient_bucket_bytes = -1;

  /// The flight recorder keeps the process's last this many collectives and steps (op, dtype,
  /// bytes, step and collective number, times, state, the peer waited on, the call site label),
  /// with no lock and no allocation on the step's path, and dumps them as JSON on a collective's
  /// failure (into flight_recorder_dir), on SIGUSR1, at the dashboard's /api/flight_recorder and
  /// at exit when asked (docs/diagnosis.md). The first Runtime of a process creates it with its
  /// settings; later ones share it. 0: off (no SIGUSR1 handler either); 16..10000000 entries.
  /// -1: TROUPE_FLIGHT_RECORDER_ENTRIES, else default_flight_recorder_entries.
  int flight_recorder_entries = -1;
  /// Where dumps are written, one file per worker (flight_recorder.rankR.json; in one process
  /// flight_recorder.pidP.json). Empty: TROUPE_FLIGHT_RECORDER_DIR; when that is unset too, a
  /// failure writes no dump and SIGUSR1 or the exit dump writes into the temporary directory.
  std::string flight_recorder_dir = {};
  /// 1: the last Runtime of the process writes a dump when it ends. -1:
  /// TROUPE_FLIGHT_RECORDER_DUMP_AT_EXIT (0 or 1), else 0.
  int flight_recorder_dump_at_exit = -1;

  /// The defaults, with the TROUPE_* environment applied; a malformed value throws
  /// std::invalid_argument naming the variable.
  static RuntimeOptions from_environment();
};

/// Owns the actor system that replicas, coordinators and input pipelines run in. One per process
/// is typical; every Strategy must be destroyed before its Runtime.
class Runtime {
 public:
  /// A runtime with its own actor system, configured from the TROUPE_* environment.
  Runtime();
  explicit Runtime(RuntimeOptions options);
  /// Embeds troupe into an application's own actor system, which must outlive the Runtime. For
  /// MultiWorkerMirroredStrategy, that system's config must have been through configure().
  explicit Runtime(caf::actor_system& system);
  /// Prepares an application's actor system config for troupe, before the system is built: loads
  /// CAF's middleman (do not load it a second time) and announces troupe's message types, which
  /// multi-worker strategies exchange between processes.
  static void configure(caf::actor_system_config& config);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// The actor system the runtime's actors live in.
  caf::actor_system& system();
  const RuntimeOptions& options() const;

  /// Number of GPUs the CUDA runtime reports; 0 when troupe was built without CUDA, no driver
  /// or device is present, or TROUPE_FORCE_CPU=1. A TROUPE_FORCE_CPU other than 0 or 1 throws
  /// std::invalid_argument naming it.
  static int gpu_count();

  /// The instruction-set path the CPU kernels (matrix products, layers, optimizer updates) run on
  /// in this process: "baseline" (x86-64), "avx2" (AVX2 + FMA) or "avx512". TROUPE_CPU picks one;
  /// unset, it is the widest this CPU runs. A Runtime names it in troupe's log (LogLevel::info,
  /// troupe/log.hpp) when first constructed.
  /// A TROUPE_CPU that names no path, or one this CPU lacks, throws std::invalid_argument (from
  /// here and from the Runtime constructor).
  static std::string cpu_kernel_path();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe
