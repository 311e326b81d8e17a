#pragma once

#include <string>

#include "troupe/distribute/context.hpp"
#include "troupe/distribute/strategy.hpp"

namespace troupe::distribute::detail {

/// Installs `ctx` as the calling thread's replica context for its lifetime.
class ReplicaContextGuard {
 public:
  explicit ReplicaContextGuard(ReplicaContext* ctx);
  ~ReplicaContextGuard();
  ReplicaContextGuard(const ReplicaContextGuard&) = delete;
  ReplicaContextGuard& operator=(const ReplicaContextGuard&) = delete;

 private:
  ReplicaContext* previous_;
};

/// The replica context installed on this thread by a strategy, or nullptr.
ReplicaContext* installed_replica_context();

/// The default strategy: one replica, run on the calling thread.
Strategy& default_strategy();

/// Scope bookkeeping, per thread.
void push_scope(Strategy* strategy);
void pop_scope(Strategy* strategy);

}  // namespace troupe::distribute::detail

namespace troupe::distribute::detail {

/// Throws ReplicaError for the first original failure among `errors` (one per replica, null where
/// the replica succeeded); failures that only say a collective was abandoned rank after it.
/// Returns normally when every entry is null.
void rethrow_step_failure(const std::vector<std::exception_ptr>& errors, const std::vector<Device>& devices,
                          const std::string& note = {});

}  // namespace troupe::distribute::detail
