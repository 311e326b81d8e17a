#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cpu/intra_op.hpp"
#include "distribute/collectives/collectives.hpp"
#include "distribute/strategies/context_state.hpp"
#include "distribute/strategies/step_profile.hpp"
#include "distribute/collectives/worker_group.hpp"
#include "gpu/gpu.hpp"
#include "distribute/collectives/nccl_collectives.hpp"
#include "flight_recorder.hpp"
#include "troupe/actors/coordinator.hpp"
#include "troupe/distribute/strategy.hpp"
#include "troupe/errors.hpp"
#include "troupe/runtime.hpp"
#include "troupe/transport/shm_group.hpp"

namespace troupe::distribute::detail {

// Replica actors, a coordinator actor and a shared-memory collective group over local devices.
class MirroredBackend : public StrategyBackend {
 public:
  /// GPU replicas all-reduce through NCCL: among this process's GPUs, or, given a `world`, with
  /// every worker's GPUs (MultiWorkerMirroredStrategy with NCCL).
  MirroredBackend(Runtime& runtime, std::vector<Device> devices, std::shared_ptr<CrossDeviceOps> ops,
                  NcclWorld world = NcclWorld())
      : runtime_(&runtime),
        devices_(std::move(devices)),
        ops_(std::move(ops)),
        group_(static_cast<int>(devices_.size()), std::chrono::microseconds(runtime.options().spin_us)),
        collectives_(group_, devices_, std::chrono::microseconds(runtime.options().spin_us)),
        coordinator_(runtime.system(), static_cast<int>(devices_.size()),
                     std::chrono::microseconds(runtime.options().spin_us)),
        intra_op_threads_(troupe::detail::cpu::intra_op_threads_for(static_cast<int>(devices_.size()))) {
    if (!devices_.empty() && devices_[0].is_gpu()) {
      // GPU replicas all-reduce through NCCL; their waits are bounded like cross-worker ones.
      nccl_ = std::make_unique<NcclCollectives>(
          group_, devices_,
          std::chrono::milliseconds(runtime.options().collective_timeout_ms),
          std::move(world));
    }
  }

  const std::vector<Device>& devices() const override { return devices_; }
  CrossDeviceOps& cross_device_ops() override { return *ops_; }
  Runtime* runtime() override { return runtime_; }
  WorkerGroup& workers() const override { return local_workers_; }
  // GPU replicas all-reduce through NCCL, which has no bucket stage: one all-reduce after backward.
  // Among the replicas of one process the automatic setting is one all-reduce after backward too.
  std::size_t gradient_bucket_bytes() const override {
    if (nccl_) return 0;
    return static_cast<std::size_t>(std::max(0, runtime_->options().gradient_bucket_bytes));
  }

  void execute(Strategy& strategy, const std::function<void(int)>& fn) override {
    if (coordinator_.on_replica_thread()) {
      throw std::logic_error("run: called from inside a replica function of the same strategy; call run from "
                             "the thread that owns the strategy");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    ++steps_;
    group_.reset();  // no replica is inside a collective between steps
    collectives_.reset(steps_);
    if (nccl_) nccl_->prepare(steps_);
    StepProfile* profile = step_profile();
    // The step in the flight recorder, with its caller's label, which the replicas' collectives
    // carry too.
    troupe::detail::FlightRecorder* recorder = troupe::detail::FlightRecorder::process();
    const char* call_site = troupe::detail::current_call_site();
    troupe::detail::flight_collective step_entry;
    step_entry.op = troupe::detail::flight_op::step;
    step_entry.step = steps_;
    step_entry.participants = static_cast<int>(devices_.size());
    troupe::detail::flight_scope recorded(recorder, step_entry);
    const std::uint64_t failures_before = recorder ? recorder->failures() : 0;
    auto per_replica = [&](int r) {
      struct label_scope {
        explicit label_scope(const char* label) { troupe::detail::set_call_site(label); }
        ~label_scope() { troupe::detail::set_call_site(nullptr); }
      } label(call_site);
      const Device& device = devices_[static_cast<std::size_t>(r)];
      // A GPU replica enqueues its kernels on its own stream and waits for them once, at the end.
      std::optional<troupe::detail::gpu::replica_scope> gpu;
      if (device.is_gpu()) gpu.emplace(device.index());
      // CPU kernels may use the cores this process's replicas leave idle (cpu/intra_op.hpp).
      troupe::detail::cpu::intra_op_scope intra_op(device.is_gpu() ? 1 : intra_op_threads_);
      ReplicaContext ctx(strategy, first_replica_id() + r, num_replicas_in_sync(), device, &replica_collectives(), r);
      ReplicaContextGuard guard(&ctx);
      // Timings for a watching Monitor: this replica's span, written on its own thread.
      struct span {
        StepProfile* profile;
        int r;
        span(StepProfile* p, int replica) : profile(p), r(replica) {
          if (profile) profile->begin_replica(r);
        }
        ~span() {
          if (profile) profile->end_replica(r);
        }
      } timing(profile, r);
      try {
        fn(r);
        if (nccl_) nccl_->drain(r);
        replica_collectives().end_step(r);
      } catch (const CollectiveAborted& e) {
        // The group may already carry the cause that released this replica; if not, this is it.
        group_.abort(r, e.what());
        replica_collectives().abort_buckets(e.what());
        release_gpu(r);
        throw;
      } catch (const std::exception& e) {
        group_.abort(r, "replica " + std::to_string(r) + " failed: " + e.what());
        replica_collectives().abort_buckets("replica " + std::to_string(r) + " failed: " + e.what());
        release_gpu(r);
        throw;
      } catch (...) {
        group_.abort(r, "replica " + std::to_string(r) + " failed with a non-standard exception");
        replica_collectives().abort_buckets("replica " + std::to_string(r) + " failed with a non-standard exception");
        release_gpu(r);
        throw;
      }
      group_.finish(r);
    };
    auto errors = coordinator_.run_step(per_replica, [&](int r, const std::string& why) {
      group_.abort(r, why);
      replica_collectives().abort_buckets(why);
    });
    const bool failed = std::any_of(errors.begin(), errors.end(), [](const std::exception_ptr& e) { return e != nullptr; });
    if (!failed) {
      recorded.done();
      return;
    }
    recorded.fail(-1);
    // A collective that failed in this step (a replica released from a barrier, a timeout): the
    // recorder is written for the post-mortem (a cross-worker failure was written already, with
    // the step still running: the file is replaced by this one, the step failed).
    std::string note;  // the dump's file, for the error (a cross-worker failure's names it already)
    if (recorder && recorder->failures() > failures_before + 1) {
      std::string why = "step " + std::to_string(steps_) + " failed in a collective";
      bool named = false;
      for (const std::exception_ptr& e : errors) {
        if (!e) continue;
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& first) {
          why += ": " + std::string(first.what());
          named = std::string(first.what()).find("(flight recorder: ") != std::string::npos;
        } catch (...) {
        }
        break;
      }
      const std::string path = recorder->dump_on_failure(why);
      if (!path.empty() && !named) note = " (flight recorder: " + path + ")";
    }
    rethrow_step_failure(errors, devices_, note);
  }

 protected:
  /// The runtime's options (gradient buckets, timeouts), for the backends built on this one.
  const RuntimeOptions& runtime_options() const { return runtime_->options(); }
  /// A failed GPU replica: replicas waiting inside NCCL are released, and this one's stream is
  /// drained before its tensors are dropped.
  void release_gpu(int r) noexcept {
    if (!nccl_) return;
    nccl_->fail();
    try {
      nccl_->drain(r);
    } catch (...) {
      // The step has failed already; this replica's cause is what the caller sees.
    }
  }

  /// What the replicas' collectives go through: shared memory here, hierarchical across workers.
  virtual ReplicaCollectives& replica_collectives() {
    if (nccl_) return *nccl_;
    return collectives_;
  }
  transport::shm_group& group() { return group_; }
  ShmCollectives& shm_collectives() { return collectives_; }

 private:
  Runtime* runtime_;
  std::vector<Device> devices_;
  std::shared_ptr<CrossDeviceOps> ops_;
  transport::shm_group group_;
  ShmCollectives collectives_;
  actors::coordinator coordinator_;
  int intra_op_threads_;  // threads a replica's CPU kernels may use
  std::unique_ptr<NcclCollectives> nccl_;  // GPU replicas only
  std::mutex mutex_;
  std::uint64_t steps_ = 0;  // execute calls so far: the flight recorder's step numbers
  mutable LocalWorkerGroup local_workers_;
};

}  // namespace troupe::distribute::detail
