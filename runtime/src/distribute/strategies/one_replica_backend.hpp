#pragma once
// One replica on the calling thread: the default strategy's backend (what get_strategy() returns
// outside any scope), and the chief's side of a ParameterServerStrategy.

#include <functional>
#include <vector>

#include "distribute/collectives/collectives.hpp"
#include "distribute/strategies/context_state.hpp"
#include "distribute/collectives/worker_group.hpp"
#include "troupe/distribute/context.hpp"
#include "troupe/distribute/cross_device_ops.hpp"
#include "troupe/distribute/strategy.hpp"

namespace troupe::distribute::detail {

class OneReplicaBackend : public StrategyBackend {
 public:
  const std::vector<Device>& devices() const override { return devices_; }
  void execute(Strategy& strategy, const std::function<void(int)>& fn) override {
    ReplicaContext ctx(strategy, 0, 1, devices_[0], &collectives_);
    ReplicaContextGuard guard(&ctx);
    try {
      fn(0);
    } catch (...) {
      rethrow_step_failure({std::current_exception()}, devices_);
    }
  }
  CrossDeviceOps& cross_device_ops() override { return ops_; }
  WorkerGroup& workers() const override { return workers_; }

 private:
  std::vector<Device> devices_{Device{}};
  IdentityCollectives collectives_;
  ReductionToOneDevice ops_;
  mutable LocalWorkerGroup workers_;
};

}  // namespace troupe::distribute::detail
