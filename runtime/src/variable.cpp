#include "troupe/variable.hpp"

#include <stdexcept>

#include "distribute/strategies/context_state.hpp"
#include "distribute/collectives/worker_group.hpp"
#include "tape.hpp"
#include "troupe/distribute/context.hpp"
#include "troupe/distribute/strategy.hpp"

namespace troupe {
namespace detail {

struct VariableState {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  VariableSynchronization synchronization = VariableSynchronization::on_write;
  VariableAggregation aggregation = VariableAggregation::none;
  distribute::Strategy* strategy = nullptr;
  std::vector<Device> devices;
  // One component on the strategy's variable device, shared by every replica
  // (CentralStorageStrategy): replica-context writes are made once, in merge_call.
  bool central = false;
  // Replica r reads and writes only components[r] inside run; the vector never changes size.
  std::vector<Tensor> components;
  // Set: the variable lives outside this process (ParameterServerStrategy's ps tasks), and
  // components is empty: every read and write reaches it, from any context.
  std::shared_ptr<distribute::detail::RemoteVariable> remote;
};

}  // namespace detail

namespace {

using distribute::ReduceOp;

std::string label(const detail::VariableState& s) {
  return "Variable" + (s.name.empty() ? std::string() : " '" + s.name + "'");
}

void check_value(const detail::VariableState& s, const Tensor& v, const char* op) {
  if (v.dtype() != s.dtype || v.shape() != s.shape) {
    throw std::invalid_argument(label(s) + ": " + op + " with a " + std::string(dtype_name(v.dtype())) + " tensor of shape " +
                                shape_to_string(v.shape()) + ", the variable is " + std::string(dtype_name(s.dtype)) +
                                " " + shape_to_string(s.shape));
  }
}

// The value every replica agrees on for a write made in replica context.
Tensor aggregate_in_replica(const detail::VariableState& s, distribute::ReplicaContext& ctx, const Tensor& v,
                            const char* op) {
  switch (s.aggregation) {
    case VariableAggregation::sum: return ctx.all_reduce(ReduceOp::sum, v);
    case VariableAggregation::mean: return ctx.all_reduce(ReduceOp::mean, v);
    case VariableAggregation::only_first_replica: {
      Tensor row = v.reshape([&] {
        Shape one = s.shape;
        one.insert(one.begin(), 1);
        return one;
      }());
      return ctx.all_gather(row, 0).slice(0, 1).reshape(s.shape);
    }
    case VariableAggregation::none: break;
  }
  throw std::invalid_argument(label(s) + ": " + op +
                              " in replica context needs an aggregation (sum, mean or only_first_replica) to "
                              "keep the replicas' components equal; give the variable one, write in cross-replica "
                              "context, or use merge_call");
}

// A central variable's one component is shared by every replica: a write in replica context is
// made once, by the first replica inside merge_call, which starts only when every replica has
// arrived (so each has read the value its update starts from) and which every replica waits for
// (so each reads the new value afterwards).
void write_central(detail::VariableState& s, distribute::ReplicaContext& ctx, const Tensor& value) {
  ctx.merge_call(
      [&](distribute::Strategy&, const distribute::PerReplica<Tensor>& values) {
        s.components[0] = values[0].with_device(s.devices[0]);
        return 0;
      },
      value);
}

}  // namespace

Variable::Variable(Tensor initial_value, std::string name, VariableSynchronization synchronization,
                   VariableAggregation aggregation)
    : state_(std::make_shared<detail::VariableState>()) {
  auto& s = *state_;
  s.name = std::move(name);
  s.shape = initial_value.shape();
  s.dtype = initial_value.dtype();
  s.synchronization =
      synchronization == VariableSynchronization::automatic ? VariableSynchronization::on_write : synchronization;
  s.aggregation = aggregation;
  if (distribute::in_cross_replica_context()) {
    s.strategy = &distribute::get_strategy();
    if (auto remote = s.strategy->backend().make_remote_variable(s.name, initial_value)) {
      s.remote = std::move(remote);
      s.name = s.remote->name();
      s.devices = {Device{}};
      return;
    }
    s.devices = s.strategy->extended().worker_devices();
    // On a strategy that keeps variables on one device, every variable but an on_read one (which
    // keeps a value per replica, as in TensorFlow) has a single component there.
    if (const Device* central = s.strategy->backend().variable_device();
        central != nullptr && s.synchronization != VariableSynchronization::on_read) {
      s.devices = {*central};
      s.central = true;
    }
  } else if (distribute::has_strategy()) {
    throw std::logic_error(label(s) + ": create variables in the strategy's scope (cross-replica context), not "
                           "inside a replica function");
  } else {
    s.strategy = &distribute::get_strategy();  // the default strategy
    s.devices = {Device{}};
  }
  if (s.synchronization == VariableSynchronization::none) s.devices.resize(1);
  // An integer scalar (an optimizer's iterations, a step counter) stays in host memory beside GPU
  // replicas, as TensorFlow keeps such values in host memory: reading it each step never waits
  // for a GPU stream. Each replica still has its own component.
  if (!dtype_is_floating(initial_value.dtype()) && initial_value.shape().empty()) {
    for (Device& d : s.devices) {
      if (d.is_gpu()) d = Device{};
    }
  }
  // Every worker starts from the chief's value (a broadcast on the ring when there are several),
  // so an initialiser that differs between processes cannot make the replicas diverge.
  initial_value = s.strategy->backend().workers().broadcast_from_chief(initial_value);
  for (const Device& d : s.devices) s.components.push_back(initial_value.with_device(d));
}

int Variable::component_index() const {
  const auto& s = *state_;
  distribute::ReplicaContext* ctx = distribute::get_replica_context();
  if (ctx == nullptr) return -1;
  if (&ctx->strategy() != s.strategy) {
    // Outside every strategy (the default replica context, e.g. in main after training) the
    // variable acts as in its own strategy's cross-replica context, as in TensorFlow.
    if (distribute::detail::installed_replica_context() == nullptr) return -1;
    if (s.components.size() == 1 && !s.central) return 0;
    throw std::logic_error(label(s) + " belongs to another strategy than the replica using it");
  }
  return s.components.size() == 1 ? 0 : ctx->local_replica_index();
}

Tensor Variable::value() const {
  const auto& s = *state_;
  if (s.remote) return detail::watched_read(s.remote->read(), &name());
  const int r = component_index();
  // A read while a GradientTape records is watched (the variable's identity: its shared name).
  if (r >= 0) {
    if (s.central) {
      // Each replica computes with the variable on its own device, as TensorFlow copies it there.
      const Device& device = distribute::get_replica_context()->device();
      if (device.is_gpu()) return detail::watched_read(s.components[0].to(device), &name());
    }
    return detail::watched_read(s.components[static_cast<std::size_t>(r)], &name());
  }
  if (s.synchronization != VariableSynchronization::on_read || s.strategy->num_replicas_in_sync() == 1) {
    return detail::watched_read(s.components[0], &name());
  }
  // An on_read variable read across replicas: the aggregate over every replica of every worker
  // (a collective when there are several workers: each must read it).
  auto& workers = s.strategy->backend().workers();
  auto& ops = s.strategy->extended().cross_device_ops();
  switch (s.aggregation) {
    case VariableAggregation::sum: return workers.reduce(ReduceOp::sum, s.components, ops);
    case VariableAggregation::mean: return workers.reduce(ReduceOp::mean, s.components, ops);
    case VariableAggregation::only_first_replica:
    case VariableAggregation::none:
      // Replica 0 of the whole cluster is the chief's first: everyone gets its value.
      return workers.broadcast_from_chief(s.components[0]);
  }
  return s.components[0];
}

void Variable::assign(const Tensor& value) {
  auto& s = *state_;
  check_value(s, value, "assign");
  if (s.remote) return s.remote->write(0, value);
  const int r = component_index();
  if (r < 0) {
    // Cross-replica: every component. An on_read SUM variable splits the value so it sums back.
    Tensor each = value;
    if (s.synchronization == VariableSynchronization::on_read && s.aggregation == VariableAggregation::sum) {
      each = value / Scalar(static_cast<std::int64_t>(s.strategy->num_replicas_in_sync()));
    }
    for (std::size_t i = 0; i < s.components.size(); ++i) s.components[i] = each.with_device(s.devices[i]);
    return;
  }
  auto* ctx = distribute::get_replica_context();
  if (s.central) {
    write_central(s, *ctx, s.strategy->num_replicas_in_sync() == 1 ? value : aggregate_in_replica(s, *ctx, value, "assign"));
    return;
  }
  if (s.synchronization != VariableSynchronization::on_write || s.strategy->num_replicas_in_sync() == 1) {
    s.components[static_cast<std::size_t>(r)] = value.with_device(s.devices[static_cast<std::size_t>(r)]);
    return;
  }
  s.components[static_cast<std::size_t>(r)] = aggregate_in_replica(s, *ctx, value, "assign");
}

void Variable::assign_add(const Tensor& delta) {
  auto& s = *state_;
  check_value(s, delta, "assign_add");
  if (s.remote) return s.remote->write(1, delta);
  const int r = component_index();
  if (r < 0) {
    Tensor each = delta;
    if (s.synchronization == VariableSynchronization::on_read && s.aggregation == VariableAggregation::sum) {
      each = delta / Scalar(static_cast<std::int64_t>(s.strategy->num_replicas_in_sync()));
    }
    for (std::size_t i = 0; i < s.components.size(); ++i) s.components[i] = s.components[i] + each;
    return;
  }
  auto* ctx = distribute::get_replica_context();
  if (s.central) {
    const Tensor total = s.strategy->num_replicas_in_sync() == 1 ? delta : aggregate_in_replica(s, *ctx, delta, "assign_add");
    write_central(s, *ctx, s.components[0] + total.with_device(s.devices[0]));
    return;
  }
  Tensor& mine = s.components[static_cast<std::size_t>(r)];
  if (s.synchronization != VariableSynchronization::on_write || s.strategy->num_replicas_in_sync() == 1) {
    mine = mine + delta;
    return;
  }
  mine = mine + aggregate_in_replica(s, *ctx, delta, "assign_add");
}

void Variable::assign_sub(const Tensor& delta) {
  if (state_->remote) {
    check_value(*state_, delta, "assign_sub");
    return state_->remote->write(2, delta);
  }
  assign_add(-delta);
}

void Variable::assign_local(const Tensor& value) {
  auto& s = *state_;
  check_value(s, value, "assign_local");
  if (s.remote) return s.remote->write(0, value);
  const int r = component_index();
  if (r < 0) {
    for (std::size_t i = 0; i < s.components.size(); ++i) s.components[i] = value.with_device(s.devices[i]);
    return;
  }
  if (s.central) {
    write_central(s, *distribute::get_replica_context(), value);
    return;
  }
  s.components[static_cast<std::size_t>(r)] = value.with_device(s.devices[static_cast<std::size_t>(r)]);
}

void Variable::set_component(int replica, const Tensor& value) {
  auto& s = *state_;
  check_value(s, value, "set_component");
  const std::size_t count = s.remote ? 1 : s.components.size();
  if (replica < 0 || static_cast<std::size_t>(replica) >= count) {
    throw std::out_of_range(label(s) + ": no component " + std::to_string(replica) + " (it has " +
                            std::to_string(count) + ")");
  }
  if (s.remote) return s.remote->write(0, value);
  s.components[static_cast<std::size_t>(replica)] = value.with_device(s.devices[static_cast<std::size_t>(replica)]);
}

const std::string& Variable::name() const { return state_->name; }
const Shape& Variable::shape() const { return state_->shape; }
DType Variable::dtype() const { return state_->dtype; }
VariableSynchronization Variable::synchronization() const { return state_->synchronization; }
VariableAggregation Variable::aggregation() const { return state_->aggregation; }
std::vector<Tensor> Variable::components() const {
  if (state_->remote) return {state_->remote->read()};
  return state_->components;
}
const std::vector<Device>& Variable::devices() const { return state_->devices; }
distribute::Strategy& Variable::distribute_strategy() const { return *state_->strategy; }

}  // namespace troupe
