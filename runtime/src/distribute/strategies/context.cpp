#include <stdexcept>
#include <string>
#include <vector>

#include "distribute/collectives/collectives.hpp"
#include "distribute/strategies/context_state.hpp"
#include "distribute/strategies/step_profile.hpp"
#include "troupe/distribute/strategy.hpp"

namespace troupe::distribute {
namespace detail {
namespace {

// The thread-local state the API requires: the replica a thread is running, and the stack of
// scopes it has entered.
thread_local ReplicaContext* tl_replica = nullptr;
thread_local std::vector<Strategy*> tl_scopes;

ReplicaContext& default_replica_context() {
  static IdentityCollectives identity;
  thread_local ReplicaContext ctx(default_strategy(), 0, 1, Device{}, &identity);
  return ctx;
}

}  // namespace

ReplicaContextGuard::ReplicaContextGuard(ReplicaContext* ctx) : previous_(tl_replica) { tl_replica = ctx; }
ReplicaContextGuard::~ReplicaContextGuard() { tl_replica = previous_; }

ReplicaContext* installed_replica_context() { return tl_replica; }

ReplicaCollectives& collectives_of(const ReplicaContext& context) { return *context.collectives_; }

void push_scope(Strategy* strategy) { tl_scopes.push_back(strategy); }

void pop_scope(Strategy* strategy) {
  if (tl_scopes.empty() || tl_scopes.back() != strategy) {
    throw std::logic_error("Scope: scopes must be closed in the reverse order they were opened");
  }
  tl_scopes.pop_back();
}

}  // namespace detail

namespace {
bool scope_open() { return !detail::tl_scopes.empty(); }
}  // namespace

ReplicaContext::ReplicaContext(Strategy& strategy, int replica_id, int num_replicas, Device device,
                               detail::ReplicaCollectives* collectives, int local_index)
    : strategy_(&strategy), replica_id_(replica_id), local_index_(local_index < 0 ? replica_id : local_index),
      num_replicas_(num_replicas), device_(std::move(device)), collectives_(collectives) {}

Tensor ReplicaContext::all_reduce(ReduceOp op, const Tensor& value) {
  detail::StepProfile* profile = strategy_->backend().step_profile();
  if (!profile) return collectives_->all_reduce(local_index_, op, value);
  const std::int64_t start = detail::profile_now_ns();
  Tensor out = collectives_->all_reduce(local_index_, op, value);
  profile->collective(local_index_, detail::CollectiveKind::all_reduce, start, detail::profile_now_ns(), value.nbytes());
  return out;
}

Tensor ReplicaContext::all_reduce(std::string_view op, const Tensor& value) {
  return all_reduce(parse_reduce_op(op), value);
}

std::vector<Tensor> ReplicaContext::all_reduce(ReduceOp op, const std::vector<Tensor>& values) {
  detail::StepProfile* profile = strategy_->backend().step_profile();
  if (!profile) return collectives_->all_reduce(local_index_, op, values);
  const std::int64_t start = detail::profile_now_ns();
  std::vector<Tensor> out = collectives_->all_reduce(local_index_, op, values);
  std::uint64_t bytes = 0;
  for (const Tensor& v : values) bytes += v.nbytes();
  profile->collective(local_index_, detail::CollectiveKind::all_reduce, start, detail::profile_now_ns(), bytes);
  return out;
}

Tensor ReplicaContext::all_gather(const Tensor& value, int axis) {
  detail::StepProfile* profile = strategy_->backend().step_profile();
  if (!profile) return collectives_->all_gather(local_index_, value, axis);
  const std::int64_t start = detail::profile_now_ns();
  Tensor out = collectives_->all_gather(local_index_, value, axis);
  profile->collective(local_index_, detail::CollectiveKind::all_gather, start, detail::profile_now_ns(), value.nbytes());
  return out;
}

void ReplicaContext::merge_call_erased(const void* mine,
                                       const std::function<void(const std::vector<const void*>&)>& on_first) {
  collectives_->merge(local_index_, mine, [&](const std::vector<const void*>& all) {
    // The function runs in cross-replica context: no replica context, the strategy's scope open.
    detail::ReplicaContextGuard no_replica(nullptr);
    Scope scope(*strategy_);
    on_first(all);
  });
}

std::shared_ptr<const void> ReplicaContext::merge_result() const { return collectives_->merge_result(); }

std::shared_ptr<const void>& ReplicaContext::collectives_result() { return collectives_->merge_result(); }

std::int64_t InputContext::get_per_replica_batch_size(std::int64_t global_batch_size) const {
  if (num_replicas_in_sync <= 0) {
    throw std::invalid_argument("get_per_replica_batch_size: num_replicas_in_sync is " +
                                std::to_string(num_replicas_in_sync) + ", expected at least 1");
  }
  if (global_batch_size < 0 || global_batch_size % num_replicas_in_sync != 0) {
    throw std::invalid_argument("get_per_replica_batch_size: the global batch size (" +
                                std::to_string(global_batch_size) + ") must be a non-negative multiple of the number "
                                "of replicas in sync (" + std::to_string(num_replicas_in_sync) + ")");
  }
  return global_batch_size / num_replicas_in_sync;
}

ReplicaContext* get_replica_context() {
  if (detail::tl_replica != nullptr) return detail::tl_replica;
  if (scope_open()) return nullptr;
  return &detail::default_replica_context();
}

Strategy& get_strategy() {
  if (detail::tl_replica != nullptr) return detail::tl_replica->strategy();
  if (scope_open()) return *detail::tl_scopes.back();
  return detail::default_strategy();
}

bool has_strategy() { return &get_strategy() != &detail::default_strategy(); }

bool in_cross_replica_context() { return detail::tl_replica == nullptr && scope_open(); }

}  // namespace troupe::distribute
