#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives.hpp"
#include "context_state.hpp"
#include "troupe/actors/coordinator.hpp"
#include "troupe/distribute/strategy.hpp"
#include "troupe/errors.hpp"
#include "troupe/runtime.hpp"
#include "troupe/transport/shm_group.hpp"

namespace troupe::distribute::detail {

// Replica actors, a coordinator actor and a shared-memory collective group over local devices.
class MirroredBackend : public StrategyBackend {
 public:
  MirroredBackend(Runtime& runtime, std::vector<Device> devices, std::shared_ptr<CrossDeviceOps> ops)
      : runtime_(&runtime),
        devices_(std::move(devices)),
        ops_(std::move(ops)),
        group_(static_cast<int>(devices_.size()), std::chrono::microseconds(runtime.options().spin_us)),
        collectives_(group_, devices_),
        coordinator_(runtime.system(), static_cast<int>(devices_.size()),
                     std::chrono::microseconds(runtime.options().spin_us)) {}

  const std::vector<Device>& devices() const override { return devices_; }
  int num_replicas_in_sync() const override { return static_cast<int>(devices_.size()); }
  CrossDeviceOps& cross_device_ops() override { return *ops_; }
  Runtime* runtime() override { return runtime_; }

  void execute(Strategy& strategy, const std::function<void(int)>& fn) override {
    if (coordinator_.on_replica_thread()) {
      throw std::logic_error("run: called from inside a replica function of the same strategy; call run from "
                             "the thread that owns the strategy");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    group_.reset();  // no replica is inside a collective between steps
    auto per_replica = [&](int r) {
      ReplicaContext ctx(strategy, first_replica_id() + r, num_replicas_in_sync(), devices_[static_cast<std::size_t>(r)],
                         &replica_collectives(), r);
      ReplicaContextGuard guard(&ctx);
      try {
        fn(r);
      } catch (const CollectiveAborted&) {
        throw;  // the group already carries the cause that released this replica
      } catch (const std::exception& e) {
        group_.abort(r, "replica " + std::to_string(r) + " failed: " + e.what());
        throw;
      } catch (...) {
        group_.abort(r, "replica " + std::to_string(r) + " failed with a non-standard exception");
        throw;
      }
      group_.finish(r);
    };
    auto errors = coordinator_.run_step(per_replica, [&](int r, const std::string& why) { group_.abort(r, why); });
    rethrow_step_failure(errors, devices_);
  }

 protected:
  /// What the replicas' collectives go through: shared memory here, hierarchical across workers.
  virtual ReplicaCollectives& replica_collectives() { return collectives_; }
  transport::shm_group& group() { return group_; }
  ShmCollectives& shm_collectives() { return collectives_; }

 private:
  Runtime* runtime_;
  std::vector<Device> devices_;
  std::shared_ptr<CrossDeviceOps> ops_;
  transport::shm_group group_;
  ShmCollectives collectives_;
  actors::coordinator coordinator_;
  std::mutex mutex_;
};

}  // namespace troupe::distribute::detail
