#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/data/dataset.hpp"
#include "troupe/device.hpp"
#include "troupe/distribute/context.hpp"
#include "troupe/distribute/cross_device_ops.hpp"
#include "troupe/distribute/input.hpp"
#include "troupe/distribute/per_replica.hpp"
#include "troupe/distribute/reduce_op.hpp"
#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe {
class Runtime;
}

namespace troupe::distribute {

class ClusterResolver;
class Strategy;

namespace detail {

class WorkerGroup;
class StepProfile;

/// A variable kept outside this process (ParameterServerStrategy's, on the ps tasks): every read
/// and write of the Variable reaches it.
class RemoteVariable {
 public:
  virtual ~RemoteVariable() = default;
  /// The name it is known by there (the one it was asked for, or a free one when none was given).
  virtual const std::string& name() const = 0;
  virtual Tensor read() = 0;
  /// op 0 sets the value, 1 adds `value`, 2 subtracts it.
  virtual void write(int op, const Tensor& value) = 0;
};

/// What a strategy runs on: implemented by MirroredStrategy's actors and by the default strategy.
/// Its replicas are this worker's devices; what crosses workers goes through workers().
class StrategyBackend {
 public:
  virtual ~StrategyBackend() = default;
  /// This worker's replica devices, in local replica order.
  virtual const std::vector<Device>& devices() const = 0;
  /// Calls fn(r) for every local replica r with that replica's ReplicaContext installed, and
  /// returns once all have finished; a failure throws ReplicaError.
  virtual void execute(Strategy& strategy, const std::function<void(int)>& fn) = 0;
  virtual CrossDeviceOps& cross_device_ops() = 0;
  /// The runtime whose actors run this strategy's replicas and input pipelines; nullptr for the
  /// default strategy, which runs everything on the calling thread.
  virtual Runtime* runtime() { return nullptr; }
  /// The workers this strategy spans (one, for single-process strategies).
  virtual WorkerGroup& workers() const = 0;
  /// Where the strategy keeps its variables when they are not mirrored (one device for every
  /// replica, CentralStorageStrategy); nullptr when each replica holds its own copy.
  virtual const Device* variable_device() const { return nullptr; }
  /// The size of Model::train_step's gradient buckets; 0: one all-reduce after the backward pass.
  virtual std::size_t gradient_bucket_bytes() const { return 0; }
  /// Where a variable created in the strategy's scope lives when it lives outside this process
  /// (ParameterServerStrategy); nullptr: in this process, one component per replica.
  virtual std::shared_ptr<RemoteVariable> make_remote_variable(const std::string& name, const Tensor& initial_value) {
    (void)name;
    (void)initial_value;
    return nullptr;
  }

  /// Replicas over all workers (every worker has as many as this one).
  int num_replicas_in_sync() const;
  /// The global id of this worker's first replica.
  int first_replica_id() const;

  /// Where replicas, collectives and the input record their per-step timings while a Monitor
  /// watches this strategy; nullptr otherwise (the hooks then cost a pointer test).
  StepProfile* step_profile() const noexcept { return step_profile_; }
  void set_step_profile(StepProfile* profile) noexcept { step_profile_ = profile; }

 private:
  StepProfile* step_profile_ = nullptr;
};

/// The argument replica `r` receives for `arg`: its component of a PerReplica, else arg itself.
template <class A>
decltype(auto) component(const A& arg, [[maybe_unused]] int r) {
  if constexpr (is_per_replica_v<A>) {
    return arg[r];
  } else {
    return (arg);
  }
}

}  // namespace detail

/// The RAII guard of Strategy::scope(): while it lives, get_strategy() on this thread is the
/// strategy and the thread is in its cross-replica context.
class Scope {
 public:
  explicit Scope(Strategy& strategy);
  ~Scope();
  Scope(Scope&& other) noexcept;
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  Scope& operator=(Scope&&) = delete;

 private:
  Strategy* strategy_;
};

/// Details of a strategy beyond the common API (tf.distribute.StrategyExtended).
class StrategyExtended {
 public:
  explicit StrategyExtended(Strategy& strategy) : strategy_(&strategy) {}
  /// The devices the replicas of this worker run on, in replica order.
  const std::vector<Device>& worker_devices() const;
  /// The implementation behind Strategy::reduce.
  CrossDeviceOps& cross_device_ops() const;
  /// Cross-replica context: sets every component of `variable` to fn(component), in replica order.
  void update(Variable& variable, const std::function<Tensor(const Tensor&)>& fn) const;
  /// Combines a per-replica value into one tensor on `destination` (default: the host).
  Tensor reduce_to(ReduceOp op, const PerReplica<Tensor>& value, const Device& destination = Device{}) const;
  /// reduce_to for several values at once.
  std::vector<Tensor> batch_reduce_to(ReduceOp op, const std::vector<PerReplica<Tensor>>& values,
                                      const Device& destination = Device{}) const;

 private:
  Strategy* strategy_;
};

/// A way of distributing computation over replicas (tf.distribute.Strategy).
class Strategy {
 public:
  virtual ~Strategy();
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  /// Replicas taking part in each step, over all workers.
  int num_replicas_in_sync() const { return backend_->num_replicas_in_sync(); }
  /// Replicas of this worker (the components of a PerReplica value here).
  int num_local_replicas() const { return static_cast<int>(backend_->devices().size()); }

  /// Calls fn once per replica, on that replica's thread, as fn(args...) where a PerReplica
  /// argument is replaced by that replica's component and any other argument is passed as is
  /// (shared, read-only). Returns a PerReplica of the results (nothing when fn returns void).
  /// When a replica's function throws, the whole step fails with ReplicaError naming it.
  template <class Fn, class... Args>
  auto run(Fn&& fn, const Args&... args) {
    using R = std::decay_t<std::invoke_result_t<Fn&, decltype(detail::component(args, 0))...>>;
    if constexpr (std::is_void_v<R>) {
      execute([&]([[maybe_unused]] int r) { fn(detail::component(args, r)...); });
    } else {
      std::vector<std::optional<R>> slots(static_cast<std::size_t>(num_local_replicas()));
      execute([&]([[maybe_unused]] int r) {
        auto& slot = slots[static_cast<std::size_t>(r)];
        slot.emplace(fn(detail::component(args, r)...));
        if constexpr (std::is_same_v<R, Tensor>) {
          // A result lives on its replica's device, as in TensorFlow.
          const Device& device = replica_device(r);
          if (slot->device() != device) *slot = slot->with_device(device);
        }
      });
      std::vector<R> values;
      values.reserve(slots.size());
      for (auto& s : slots) values.push_back(std::move(*s));
      return PerReplica<R>(std::move(values));
    }
  }

  /// Combines the replicas' values. axis unset: elementwise across replicas (shapes must match);
  /// axis set: also across that dimension of each value, and MEAN divides by the total number of
  /// elements along it over all replicas (a partial last batch gets the right denominator).
  Tensor reduce(ReduceOp op, const PerReplica<Tensor>& value, std::optional<int> axis);
  Tensor reduce(std::string_view op, const PerReplica<Tensor>& value, std::optional<int> axis);
  /// A value that is not per-replica: MEAN, or any op with one replica, returns it (reduced along
  /// axis if given); SUM over several replicas throws std::invalid_argument, as in TensorFlow.
  Tensor reduce(ReduceOp op, const Tensor& value, std::optional<int> axis);

  /// The replicas' values concatenated along `axis` in replica order; only that dimension may
  /// differ between replicas.
  Tensor gather(const PerReplica<Tensor>& value, int axis);

  /// The components of a per-replica value in replica order; a plain value gives itself once.
  template <class T>
  std::vector<T> experimental_local_results(const PerReplica<T>& value) const {
    return value.values();
  }
  template <class T, std::enable_if_t<!is_per_replica_v<T> && !std::is_same_v<T, Variable>, int> = 0>
  std::vector<T> experimental_local_results(const T& value) const {
    return {value};
  }
  /// A variable's components, one per replica.
  std::vector<Tensor> experimental_local_results(const Variable& variable) const { return variable.components(); }

  /// Calls value_fn(ValueContext) once per local replica and gathers the results.
  template <class Fn>
  auto experimental_distribute_values_from_function(Fn&& value_fn) {
    using R = std::decay_t<std::invoke_result_t<Fn&, const ValueContext&>>;
    std::vector<R> values;
    const int n = num_local_replicas();
    values.reserve(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      if constexpr (std::is_same_v<R, Tensor>) {
        // On a GPU replica the value goes to the GPU, as TensorFlow places it on the replica's device.
        Tensor t = value_fn(value_context(r));
        const Device& device = replica_device(r);
        values.push_back(device.is_gpu() ? t.to(device) : std::move(t));
      } else {
        values.push_back(value_fn(value_context(r)));
      }
    }
    return PerReplica<R>(std::move(values));
  }

  /// Distributes a dataset batched by the global batch size: each global batch is split over the
  /// local replicas (the first B % N replicas get one row more; a last partial batch fills the
  /// replicas in order; a replica left without data gets an empty batch). An input pipeline
  /// actor keeps options.experimental_prefetch_to_device steps ready ahead.
  DistributedDataset experimental_distribute_dataset(data::Dataset dataset, InputOptions options = {});
  /// Calls dataset_fn once per input pipeline with its InputContext; its dataset is batched per
  /// replica. per_worker: one pipeline whose consecutive elements go to the replicas in turn;
  /// per_replica: one pipeline per replica. Iteration ends when every pipeline has ended; a
  /// replica whose data ended first gets empty batches meanwhile, so no element is dropped.
  DistributedDataset distribute_datasets_from_function(
      std::function<data::Dataset(const InputContext&)> dataset_fn, InputOptions options = {});

  /// TF1 names: make_dataset_iterator(d) is experimental_distribute_dataset(d).make_iterator().
  DistributedIterator make_dataset_iterator(data::Dataset dataset);
  /// TF1 name of distribute_datasets_from_function(...).make_iterator().
  DistributedIterator make_input_fn_iterator(std::function<data::Dataset(const InputContext&)> input_fn,
                                             InputReplicationMode mode = InputReplicationMode::per_worker);
  /// TF1: a dataset slicing host arrays along axis 0 (from_tensor_slices).
  data::Dataset experimental_make_numpy_dataset(std::vector<Tensor> arrays);
  /// TF1 (deprecated): run(fn, iterator.get_next()).
  template <class Fn>
  auto experimental_run(Fn&& fn, DistributedIterator& iterator) {
    return run(std::forward<Fn>(fn), iterator.get_next());
  }

  /// Makes this the current strategy of the calling thread until the Scope is destroyed.
  Scope scope() { return Scope(*this); }

  /// The cluster this strategy spans; nullptr for single-worker strategies.
  virtual ClusterResolver* cluster_resolver() { return nullptr; }

  StrategyExtended& extended() { return extended_; }

  /// The runs-on-replica-threads primitive behind run(): fn(r) on every replica.
  void execute(const std::function<void(int)>& fn);

  detail::StrategyBackend& backend() { return *backend_; }

  /// The device of local replica `replica`.
  const Device& replica_device(int replica) const {
    return backend_->devices()[static_cast<std::size_t>(replica)];
  }

 protected:
  explicit Strategy(std::unique_ptr<detail::StrategyBackend> backend);

 private:
  ValueContext value_context(int replica) const;

  std::unique_ptr<detail::StrategyBackend> backend_;
  StrategyExtended extended_;
};

}  // namespace troupe::distribute
