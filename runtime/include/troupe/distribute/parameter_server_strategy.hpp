#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/distribute/cluster_resolver.hpp"
#include "troupe/distribute/multi_worker_strategy.hpp"
#include "troupe/distribute/remote_function.hpp"
#include "troupe/distribute/server.hpp"
#include "troupe/distribute/strategy.hpp"
#include "troupe/runtime.hpp"
#include "troupe/tensor.hpp"

namespace troupe::nn::detail {
class PsFitLoop;
}  // namespace troupe::nn::detail

namespace troupe::distribute {

/// How a variable is split into shards along axis 0 (tf.distribute.experimental.partitioners).
class Partitioner {
 public:
  virtual ~Partitioner() = default;
  /// Partitions per axis, as TensorFlow returns them: {n, 1, 1, ...}, n at most shape[0].
  virtual std::vector<int> operator()(const Shape& shape, DType dtype) const = 0;
};

/// Exactly num_shards shards (fewer when axis 0 has fewer rows).
class FixedShardsPartitioner : public Partitioner {
 public:
  explicit FixedShardsPartitioner(int num_shards);  ///< < 1: std::invalid_argument
  std::vector<int> operator()(const Shape& shape, DType dtype) const override;

 private:
  int num_shards_;
};

/// As many shards as keep each at least min_shard_bytes, at most max_shards.
class MinSizePartitioner : public Partitioner {
 public:
  explicit MinSizePartitioner(std::int64_t min_shard_bytes = 256 << 10, int max_shards = 1);
  std::vector<int> operator()(const Shape& shape, DType dtype) const override;

 private:
  std::int64_t min_shard_bytes_;
  int max_shards_;
};

/// The fewest shards that keep each at most max_shard_bytes (at most max_shards; 0: no limit).
class MaxSizePartitioner : public Partitioner {
 public:
  explicit MaxSizePartitioner(std::int64_t max_shard_bytes, int max_shards = 0);
  std::vector<int> operator()(const Shape& shape, DType dtype) const override;

 private:
  std::int64_t max_shard_bytes_;
  int max_shards_;
};

/// A variable of a ParameterServerStrategy: shards of rows on the ps tasks (tf ShardedVariable).
struct ShardedVariable {
  struct Shard {
    int ps = 0;              ///< the ps task that holds it
    std::int64_t rows = 0;   ///< its rows of axis 0
    std::string key;         ///< its name there: "<name>/part_<i>"
  };
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  std::vector<Shard> shards;
};

namespace detail {
struct PsState;
struct PsAccess;
struct CoordinatorState;
struct RemoteValueState;
}  // namespace detail

/// Asynchronous training with parameter servers (tf.distribute.ParameterServerStrategy): the
/// variables live on the cluster's "ps" tasks, sharded by the partitioner; a ClusterCoordinator
/// on the chief schedules functions onto the "worker" tasks, which read the variables and send
/// updates. Construct it on the chief; the workers and ps tasks run a Server.
///
/// A troupe::Variable created in its scope() lives on the ps tasks, as TensorFlow's
/// ShardedVariable: its shards are placed round-robin, reading it (value()) from the chief reads
/// every shard, and assign/assign_add/assign_sub write them; the workers' functions reach it by
/// its name (FunctionContext), which name() returns. A variable given no name is named
/// "Variable", "Variable_1"...; a name already taken gets the first free suffix ("kernel_1", as
/// TensorFlow makes names unique), so that layers made in the scope (each unnamed Dense makes a
/// "kernel") live side by side. A scalar is kept as one row of shape {1}. A Model made in the
/// scope trains with Model::fit(DatasetCreator, ...) (troupe/nn/model.hpp).
/// As in TensorFlow, the chief has one replica (CPU:0): run() on the chief runs the function
/// there, once, after a warning that functions meant for the workers go through
/// ClusterCoordinator::schedule.
class ParameterServerStrategy : public Strategy {
 public:
  /// Connects to every ps task (each within ServerOptions::peer_timeout, else std::runtime_error
  /// naming it), and to the workers in the background (retried while they are down). The cluster
  /// must have "ps" and "worker" jobs (std::invalid_argument otherwise); beyond loopback it needs
  /// the cluster token, as Server does. partitioner nullptr: one shard per variable.
  ParameterServerStrategy(Runtime& runtime, std::shared_ptr<ClusterResolver> resolver,
                          std::shared_ptr<Partitioner> partitioner = nullptr,
                          ServerOptions options = ServerOptions::from_environment());
  ~ParameterServerStrategy() override;
  ParameterServerStrategy(const ParameterServerStrategy&) = delete;
  ParameterServerStrategy& operator=(const ParameterServerStrategy&) = delete;

  /// Creates a variable on the ps tasks, its shards placed round-robin; a name already taken is
  /// std::invalid_argument. Create variables before scheduling functions that use them. The
  /// TensorFlow form, a Variable made in scope(), does the same and returns a Variable.
  ShardedVariable create_variable(const std::string& name, const Tensor& initial_value);
  /// A variable's value, its shards read from the ps tasks (std::runtime_error naming a ps task
  /// that fails).
  Tensor read_variable(const std::string& name) const;
  /// Every variable, in creation order.
  std::vector<ShardedVariable> variables() const;

  ClusterResolver* cluster_resolver() override { return resolver_.get(); }
  int num_workers() const;
  int num_ps() const;

 private:
  friend class ClusterCoordinator;
  friend struct detail::PsAccess;
  std::shared_ptr<ClusterResolver> resolver_;
  std::shared_ptr<detail::PsState> state_;
};

/// The result of a scheduled function, ready once it ran (tf.distribute.experimental.coordinator
/// .RemoteValue). A handle: copies share the value.
class RemoteValue {
 public:
  /// Waits for the function and returns what it returned; if it raised, throws troupe::Error with
  /// the worker's name and the cause; if it was cancelled (another function failed before it
  /// ran), throws troupe::Cancelled naming it.
  std::vector<Tensor> fetch() const;
  std::vector<Tensor> get() const { return fetch(); }
  /// Whether it finished (with a value or an error).
  bool is_ready() const;

  explicit RemoteValue(std::shared_ptr<detail::RemoteValueState> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<detail::RemoteValueState> state_;
};

/// Each worker's iterator over its own dataset, made by a dataset function it runs itself; passed
/// to schedule, the function reads it with FunctionContext::next.
struct PerWorkerIterator {
  std::uint64_t id = 0;
  std::string dataset_function;
};

/// A dataset on every worker (the value create_per_worker_dataset returns).
class PerWorkerDataset {
 public:
  /// A new iterator on every worker, each starting at its dataset's beginning.
  PerWorkerIterator make_iterator();

  PerWorkerDataset(std::string dataset_function, std::shared_ptr<detail::CoordinatorState> owner)
      : dataset_function_(std::move(dataset_function)), owner_(std::move(owner)) {}

 private:
  std::string dataset_function_;
  std::shared_ptr<detail::CoordinatorState> owner_;
};

/// One argument of a scheduled function: a tensor (numbers become scalars) or a per-worker
/// iterator.
struct ScheduleArgument {
  ScheduleArgument(Tensor t) : tensor(std::move(t)) {}  // NOLINT: implicit on purpose
  ScheduleArgument(PerWorkerIterator it) : iterator(std::move(it)) {}  // NOLINT
  template <class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
  ScheduleArgument(T value) : tensor(Tensor::scalar<T>(value)) {}  // NOLINT
  Tensor tensor;
  PerWorkerIterator iterator;
};

/// Settings of a ClusterCoordinator. from_environment() reads TROUPE_HEARTBEAT_MS, TROUPE_MISSED_HEARTBEATS,
/// TROUPE_STALL_WARNING_S and TROUPE_STALL_SHUTDOWN_S as MultiWorkerOptions does: both cluster stacks
/// beat at the same interval, forgive as many missed beats and watch stalls with the same bounds.
struct ClusterCoordinatorOptions {
  /// Functions in flight on each worker (queued there): more hides the network's latency.
  int closures_per_worker = 16;
  /// How often a worker that is down (or refused us) is tried again.
  std::chrono::milliseconds reconnect_interval{200};
  /// join() fails when no worker has been reachable for this long while functions wait.
  std::chrono::milliseconds no_worker_timeout{60000};
  /// TROUPE_HEARTBEAT_MS: how often the chief beats every worker and ps task (10..600000 ms)...
  std::chrono::milliseconds heartbeat_interval = MultiWorkerOptions::default_heartbeat_interval;
  /// ...and how many beats in a row a task may miss (1..1000) before it is lost: a worker's
  /// functions go to the others (it is taken back when it answers again), a ps task fails join().
  /// The tasks hear both with each beat and watch the chief with the same limit. A check that
  /// comes more than two intervals late (that process was stopped or starved) blames nobody.
  int missed_heartbeats = MultiWorkerOptions::default_missed_heartbeats;
  /// TROUPE_STALL_WARNING_S: a function that has run on a worker longer than this is reported by
  /// the chief in one line naming the worker, the function and how long it has run, repeated at
  /// a back-off and cleared when it finishes (1 s..7 days; docs/when_training_stalls.md).
  std::chrono::milliseconds stall_warning = MultiWorkerOptions::default_stall_warning;
  /// TROUPE_STALL_SHUTDOWN_S: past this (0: never, the default; else 1 s..7 days) the function is
  /// given up on that worker, as if the worker were lost: it runs again on another worker, and
  /// that worker takes no function until the stuck one returns. A function given up a second
  /// time (on another worker) fails, naming both, and join() raises it.
  std::chrono::milliseconds stall_shutdown{0};
  /// TROUPE_PS_RESTART_WAIT_S: how long a lost ps task is awaited at its address (0: not at all,
  /// the default; else 1 s..1 day; troupe-launch --max-restarts sets it when it restarts a lost
  /// ps task alone). While it is awaited the functions that needed it fail as usual; once it is
  /// reached again (with the cluster's token, as at the start) Model::fit makes its shards again
  /// and restores every ps task's shards from the last sharded checkpoint (docs/clusters.md).
  /// Past the wait it is lost for good, as with 0.
  std::chrono::milliseconds ps_restart_wait{0};

  /// The defaults with the TROUPE_* environment applied (malformed: std::invalid_argument).
  static ClusterCoordinatorOptions from_environment();
};

/// Schedules functions onto the workers of a ParameterServerStrategy and survives losing them
/// (tf.distribute.experimental.coordinator.ClusterCoordinator):
/// - a function running on a worker that dies runs again on another (at-least-once); the lost
///   worker is logged and tried again until it comes back;
/// - an exception inside a function reaches its RemoteValue (naming the worker and the cause)
///   and, as in TensorFlow, the next schedule(), join() or done() raises it, once: that call
///   first waits for the functions in flight to finish, and cancels every function still queued
///   (and the one being scheduled): their RemoteValues throw troupe::Cancelled. Between the
///   failure and that call, queued functions keep running, and a function whose worker is lost
///   is cancelled rather than run again. join() returns at once when a function fails;
/// - a lost ps task makes join() fail at once, naming it (with ps_restart_wait, once it has not
///   come back within that wait).
class ClusterCoordinator {
 public:
  /// One per strategy (a second one shares the first's queue and counters). The strategy must
  /// outlive it; destroying the strategy tells every worker and ps task that the chief leaves.
  explicit ClusterCoordinator(ParameterServerStrategy& strategy,
                              ClusterCoordinatorOptions options = ClusterCoordinatorOptions::from_environment());
  ~ClusterCoordinator();
  ClusterCoordinator(const ClusterCoordinator&) = delete;
  ClusterCoordinator& operator=(const ClusterCoordinator&) = delete;

  /// Queues `function` (a name the workers' registries know) and returns at once; raises a
  /// function's error not raised yet (see the class comment).
  template <class... Args>
  RemoteValue schedule(const std::string& function, Args&&... args) {
    return schedule_arguments(function, {ScheduleArgument(std::forward<Args>(args))...});
  }
  RemoteValue schedule_arguments(const std::string& function, std::vector<ScheduleArgument> args);
  /// Waits until every scheduled function finished. Throws the first error of a function since
  /// it was last raised (troupe::Error naming the worker; see the class comment), or the loss of
  /// a ps task.
  void join();
  /// Whether every scheduled function finished (throws like join when one failed).
  bool done();
  /// remote_value.fetch().
  std::vector<Tensor> fetch(const RemoteValue& remote_value) { return remote_value.fetch(); }
  /// A dataset on every worker, made there by the registered dataset function.
  PerWorkerDataset create_per_worker_dataset(const std::string& dataset_function);

  /// Functions that completed (each counted once; with a value or an error), cancelled, ran again
  /// after their worker was lost, and workers lost, so far.
  std::uint64_t closures_done() const;
  std::uint64_t closures_cancelled() const;
  std::uint64_t closures_retried() const;
  std::uint64_t workers_lost() const;
  /// Lost ps tasks reached again after their restart (ClusterCoordinatorOptions::ps_restart_wait).
  std::uint64_t ps_tasks_restarted() const;

 private:
  friend class troupe::nn::detail::PsFitLoop;
  explicit ClusterCoordinator(std::shared_ptr<detail::CoordinatorState> state) : state_(std::move(state)) {}
  // The strategy's coordinator as one made earlier configured it (from the environment when none
  // was made): what Model::fit schedules through.
  static std::unique_ptr<ClusterCoordinator> attach(ParameterServerStrategy& strategy);
  std::shared_ptr<detail::CoordinatorState> state_;
};

}  // namespace troupe::distribute
