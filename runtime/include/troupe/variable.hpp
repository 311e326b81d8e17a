#pragma once

#include <memory>
#include <string>
#include <vector>

#include "troupe/device.hpp"
#include "troupe/tensor.hpp"

namespace troupe {

namespace distribute {
class Strategy;
}

/// When the components of a variable are kept in sync (tf.VariableSynchronization).
enum class VariableSynchronization {
  automatic,  ///< on_write
  none,       ///< a single component, never synchronised
  on_write,   ///< every write goes to every replica's component: they stay bit-identical
  on_read,    ///< each replica writes its own component; reads in cross-replica context aggregate
};

/// How replicas' writes (on_write, in replica context) or components (on_read, when read in
/// cross-replica context) are combined (tf.VariableAggregation).
enum class VariableAggregation { none, sum, mean, only_first_replica };

namespace detail {
struct VariableState;
}

/// A variable: a handle to shared state. Created inside strategy.scope() it is mirrored: one
/// component per replica device, all initialised to `initial_value` (under multi-worker, the
/// chief's `initial_value`: creating a variable is then a collective every worker makes). Created
/// outside any scope it has one component. An integer scalar (an optimizer's iterations) keeps
/// its components in host memory even beside GPU replicas, as TensorFlow keeps int32/int64
/// scalars in host memory: reading it never waits for a GPU stream.
///
/// Writes in replica context (inside Strategy::run) are collectives for on_write variables:
/// every replica must make them, and the aggregation decides the value (sum or mean of the
/// replicas' values, or replica 0's); aggregation none is refused there, as in TensorFlow. Writes
/// in cross-replica context set every component.
///
/// Outside every strategy (no scope open, no replica function running: `main` after training), a
/// variable created under a strategy is read and written as in that strategy's cross-replica
/// context, as TensorFlow does: value() is the first replica's component (on_read: the
/// aggregate, over every worker under multi-worker, so every worker must read it), assign sets
/// every component, and checkpoints save and restore it.
class Variable {
 public:
  explicit Variable(Tensor initial_value, std::string name = "",
                    VariableSynchronization synchronization = VariableSynchronization::automatic,
                    VariableAggregation aggregation = VariableAggregation::none);

  /// Replica context: this replica's component. Cross-replica context: the primary component
  /// (replica 0's), or for on_read variables the aggregate of all components.
  Tensor value() const;
  Tensor read_value() const { return value(); }

  /// Sets the value; see the class comment for what replica context means. The new value must
  /// have the variable's shape and dtype (std::invalid_argument otherwise).
  void assign(const Tensor& value);
  void assign_add(const Tensor& delta);
  void assign_sub(const Tensor& delta);

  /// Sets only the calling replica's component, with no collective: for code that has already
  /// made every replica compute the same value (an optimizer after all-reducing gradients).
  /// In cross-replica context it sets every component, like assign.
  void assign_local(const Tensor& value);

  const std::string& name() const;
  const Shape& shape() const;
  DType dtype() const;
  VariableSynchronization synchronization() const;
  VariableAggregation aggregation() const;
  /// One tensor per component, in replica order (what experimental_local_results returns).
  std::vector<Tensor> components() const;
  /// The devices of the components.
  const std::vector<Device>& devices() const;
  /// The strategy the variable was created under (the default strategy outside any scope).
  distribute::Strategy& distribute_strategy() const;
  /// Sets component `replica` only (strategy internals, checkpoint restore).
  void set_component(int replica, const Tensor& value);

 private:
  int component_index() const;
  std::shared_ptr<detail::VariableState> state_;
};

}  // namespace troupe
