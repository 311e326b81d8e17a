#include "troupe/distribute/strategy.hpp"

#include <stdexcept>
#include <string>

#include "axis.hpp"
#include "distribute/collectives/collectives.hpp"
#include "distribute/strategies/context_state.hpp"
#include "distribute/strategies/one_replica_backend.hpp"
#include "distribute/collectives/worker_group.hpp"
#include "elements.hpp"
#include "troupe/errors.hpp"

namespace troupe::distribute {
namespace detail {
namespace {

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "a non-standard exception";
  }
}

bool is_abandoned_collective(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const CollectiveAborted&) {
    return true;
  } catch (...) {
    return false;
  }
}

class DefaultStrategy final : public Strategy {
 public:
  DefaultStrategy() : Strategy(std::make_unique<OneReplicaBackend>()) {}
};

}  // namespace

Strategy& default_strategy() {
  static auto* s = new DefaultStrategy;  // never destroyed: thread-locals may refer to it at exit
  return *s;
}

void rethrow_step_failure(const std::vector<std::exception_ptr>& errors, const std::vector<Device>& devices,
                          const std::string& note) {
  int first = -1;
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    if (first < 0) first = static_cast<int>(r);
    if (!is_abandoned_collective(errors[r])) {
      first = static_cast<int>(r);
      break;
    }
  }
  if (first < 0) return;
  const std::size_t f = static_cast<std::size_t>(first);
  std::string where = "replica " + std::to_string(first);
  if (f < devices.size()) where += " (" + devices[f].to_string() + ")";
  throw ReplicaError(first, "run: " + where + " failed: " + message_of(errors[f]) + note, errors[f]);
}

}  // namespace detail

Scope::Scope(Strategy& strategy) : strategy_(&strategy) { detail::push_scope(strategy_); }
Scope::Scope(Scope&& other) noexcept : strategy_(other.strategy_) { other.strategy_ = nullptr; }
Scope::~Scope() {
  if (strategy_ == nullptr) return;
  try {
    detail::pop_scope(strategy_);
  } catch (...) {
    // Closing scopes out of order is a bug in the caller; a destructor must not throw.
  }
}

const std::vector<Device>& StrategyExtended::worker_devices() const { return strategy_->backend().devices(); }
CrossDeviceOps& StrategyExtended::cross_device_ops() const { return strategy_->backend().cross_device_ops(); }

void StrategyExtended::update(Variable& variable, const std::function<Tensor(const Tensor&)>& fn) const {
  if (!in_cross_replica_context() && get_replica_context() != nullptr && has_strategy()) {
    throw std::logic_error("update: call it in cross-replica context (the strategy's scope or merge_call), not "
                           "inside a replica function");
  }
  const auto components = variable.components();
  for (std::size_t r = 0; r < components.size(); ++r) variable.set_component(static_cast<int>(r), fn(components[r]));
}

Tensor StrategyExtended::reduce_to(ReduceOp op, const PerReplica<Tensor>& value, const Device& destination) const {
  return cross_device_ops().reduce(op, value.values(), destination);
}

std::vector<Tensor> StrategyExtended::batch_reduce_to(ReduceOp op, const std::vector<PerReplica<Tensor>>& values,
                                                      const Device& destination) const {
  std::vector<std::vector<Tensor>> raw;
  raw.reserve(values.size());
  for (const auto& v : values) raw.push_back(v.values());
  return cross_device_ops().batch_reduce(op, raw, destination);
}

namespace detail {

int StrategyBackend::num_replicas_in_sync() const { return static_cast<int>(devices().size()) * workers().size(); }
int StrategyBackend::first_replica_id() const { return workers().rank() * static_cast<int>(devices().size()); }

}  // namespace detail

Strategy::Strategy(std::unique_ptr<detail::StrategyBackend> backend)
    : backend_(std::move(backend)), extended_(*this) {}

Strategy::~Strategy() = default;

void Strategy::execute(const std::function<void(int)>& fn) { backend_->execute(*this, fn); }

ValueContext Strategy::value_context(int replica) const {
  return ValueContext{backend_->first_replica_id() + replica, num_replicas_in_sync()};
}

namespace {

void check_components(const char* op, const PerReplica<Tensor>& value, int expected) {
  if (value.num_replicas() != expected) {
    throw std::invalid_argument(std::string(op) + ": the value has " + std::to_string(value.num_replicas()) +
                                " components, the strategy has " + std::to_string(expected) + " replicas");
  }
}

}  // namespace

Tensor Strategy::reduce(ReduceOp op, const PerReplica<Tensor>& value, std::optional<int> axis) {
  check_components("reduce", value, num_local_replicas());
  detail::WorkerGroup& workers = backend_->workers();
  CrossDeviceOps& local = backend_->cross_device_ops();
  if (!axis) return workers.reduce(op, value.values(), local);
  // Along an axis: the sums along it, over every replica of every worker, and the count of rows
  // they came from (replicas may hold partial batches).
  std::vector<Tensor> partial;
  partial.reserve(value.values().size());
  std::int64_t count = 0;
  for (const Tensor& t : value.values()) {
    const int ax = troupe::detail::checked_axis("reduce", *axis, t.rank());
    count += t.shape()[static_cast<std::size_t>(ax)];
    partial.push_back(reduce_sum(t, ax));
  }
  Tensor total = workers.sum(local.reduce(ReduceOp::sum, partial, Device{}));
  count = workers.sum(Tensor::scalar<std::int64_t>(count)).item<std::int64_t>();
  if (op == ReduceOp::sum) return total;
  if (count == 0 && (total.dtype() == DType::i32 || total.dtype() == DType::i64)) {
    throw std::invalid_argument("reduce: MEAN along axis " + std::to_string(*axis) +
                                " of integer values with no elements along it");
  }
  return total / Scalar(count);
}

Tensor Strategy::reduce(std::string_view op, const PerReplica<Tensor>& value, std::optional<int> axis) {
  return reduce(parse_reduce_op(op), value, axis);
}

Tensor Strategy::reduce(ReduceOp op, const Tensor& value, std::optional<int> axis) {
  if (op == ReduceOp::sum && num_replicas_in_sync() > 1) {
    throw std::invalid_argument(
        "reduce: a value that is not per-replica cannot be summed over " + std::to_string(num_replicas_in_sync()) +
        " replicas (pass the PerReplica result of run, or use MEAN)");
  }
  if (!axis) return value.with_device(Device{});
  const int ax = troupe::detail::checked_axis("reduce", *axis, value.rank());
  Tensor total = reduce_sum(value, ax).with_device(Device{});
  if (op == ReduceOp::sum) return total;
  return total / Scalar(value.shape()[static_cast<std::size_t>(ax)]);
}

Tensor Strategy::gather(const PerReplica<Tensor>& value, int axis) {
  check_components("gather", value, num_local_replicas());
  const auto& parts = value.values();
  const Tensor& first = parts.at(0);
  const int ax = troupe::detail::checked_axis("gather", axis, first.rank());
  for (std::size_t r = 1; r < parts.size(); ++r) {
    base::check_agree("gather", troupe::detail::sent("replica 0", first),
                      troupe::detail::sent("replica " + std::to_string(r), parts[r]), ax,
                      "; only dimension " + std::to_string(ax) + " may differ");
  }
  // Parts on several GPUs meet on the first one's before they are joined.
  std::vector<Tensor> together;
  together.reserve(parts.size());
  for (const Tensor& p : parts) together.push_back(p.to(first.device()));
  return backend_->workers().concat(concat(together, ax).with_device(Device{}), ax);
}

}  // namespace troupe::distribute
