#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <type_traits>
#include <vector>

#include "troupe/device.hpp"
#include "troupe/distribute/per_replica.hpp"
#include "troupe/distribute/reduce_op.hpp"
#include "troupe/tensor.hpp"

namespace troupe::distribute {

class Strategy;

class ReplicaContext;

namespace detail {
class ReplicaCollectives;
/// The collectives behind a replica context (the library's own bucketed gradient all-reduce).
ReplicaCollectives& collectives_of(const ReplicaContext& context);
}

/// The context of one replica while its function runs inside Strategy::run: who it is, and the
/// collectives that synchronise it with the other replicas. Every replica must call the same
/// collectives in the same order with tensors of the same shapes and dtypes; a mismatch fails
/// the step with an error naming both replicas, a replica that returns while others wait for it
/// fails it too, never a hang.
class ReplicaContext {
 public:
  ReplicaContext(Strategy& strategy, int replica_id, int num_replicas, Device device,
                 detail::ReplicaCollectives* collectives, int local_index = -1);

  /// This replica's index, 0..num_replicas_in_sync()-1.
  int replica_id_in_sync_group() const noexcept { return replica_id_; }
  /// This replica's index among the replicas of its own worker (replica_id_in_sync_group() with
  /// one worker).
  int local_replica_index() const noexcept { return local_index_; }
  /// Replicas taking part in each step, over all workers.
  int num_replicas_in_sync() const noexcept { return num_replicas_; }
  /// The device this replica runs on.
  const Device& device() const noexcept { return device_; }
  /// The strategy running this replica.
  Strategy& strategy() const noexcept { return *strategy_; }

  /// Sum or mean of `value` over all replicas; every replica gets the same bits.
  Tensor all_reduce(ReduceOp op, const Tensor& value);
  Tensor all_reduce(std::string_view op, const Tensor& value);
  /// Several tensors reduced in one collective (one synchronisation for all of them).
  std::vector<Tensor> all_reduce(ReduceOp op, const std::vector<Tensor>& values);
  /// Every replica's `value` concatenated along `axis`, in replica order; only the size along
  /// `axis` may differ between replicas.
  Tensor all_gather(const Tensor& value, int axis);

  /// Runs fn(strategy, values) once, on replica 0's thread in cross-replica context, with every
  /// replica's `value`; every replica waits for it and gets its result (a copy). It is a
  /// collective: every replica must call it. An exception from fn fails the step.
  template <class Fn, class T>
  auto merge_call(Fn&& fn, const T& value);

  /// The untyped core of merge_call.
  void merge_call_erased(const void* mine, const std::function<void(const std::vector<const void*>&)>& on_first);
  /// What the last merge_call's function returned, type-erased.
  std::shared_ptr<const void> merge_result() const;

 private:
  friend detail::ReplicaCollectives& detail::collectives_of(const ReplicaContext& context);
  std::shared_ptr<const void>& collectives_result();

  Strategy* strategy_;
  int replica_id_;
  int local_index_;
  int num_replicas_;
  Device device_;
  detail::ReplicaCollectives* collectives_;
};

template <class Fn, class T>
auto ReplicaContext::merge_call(Fn&& fn, const T& value) {
  using R = std::decay_t<std::invoke_result_t<Fn&, Strategy&, const PerReplica<T>&>>;
  auto gather = [](const std::vector<const void*>& all) {
    std::vector<T> values;
    values.reserve(all.size());
    for (const void* p : all) values.push_back(*static_cast<const T*>(p));
    return PerReplica<T>(std::move(values));
  };
  if constexpr (std::is_void_v<R>) {
    merge_call_erased(&value, [&](const std::vector<const void*>& all) { fn(*strategy_, gather(all)); });
  } else {
    merge_call_erased(&value, [&](const std::vector<const void*>& all) {
      collectives_result() = std::make_shared<const R>(fn(*strategy_, gather(all)));
    });
    return R(*static_cast<const R*>(merge_result().get()));
  }
}

/// Given to the function of experimental_distribute_values_from_function.
struct ValueContext {
  int replica_id_in_sync_group = 0;
  int num_replicas_in_sync = 1;
};

/// Given to the function of distribute_datasets_from_function, once per input pipeline.
struct InputContext {
  int num_input_pipelines = 1;
  int input_pipeline_id = 0;
  int num_replicas_in_sync = 1;
  /// global_batch_size / num_replicas_in_sync; a global batch that does not divide evenly throws
  /// std::invalid_argument.
  std::int64_t get_per_replica_batch_size(std::int64_t global_batch_size) const;
};

/// The current replica's context inside Strategy::run; nullptr in cross-replica context (inside a
/// strategy's scope but outside run). Outside any strategy it is the default replica context
/// (replica 0 of 1), as in TensorFlow.
ReplicaContext* get_replica_context();
/// The strategy of the current replica or scope, else the default strategy (one replica, run on
/// the calling thread).
Strategy& get_strategy();
/// True inside a strategy's scope or replica function.
bool has_strategy();
/// True inside a strategy's scope and outside its replica functions.
bool in_cross_replica_context();

}  // namespace troupe::distribute
