#pragma once

// The set of workers a strategy spans. A strategy's cross-replica operations reduce over its local
// replicas first and then hand the result to its WorkerGroup, which combines it over the workers:
// the one-process group does nothing, the ring group runs a collective on the TCP ring among the
// workers' leaders. Strategy code never asks how many workers there are to decide what to do.

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/cluster_health.hpp"
#include "troupe/actors/worker_report.hpp"
#include "troupe/actors/rendezvous.hpp"
#include "troupe/actors/stall_inspector.hpp"
#include "troupe/distribute/cross_device_ops.hpp"
#include "troupe/distribute/multi_worker_strategy.hpp"
#include "troupe/distribute/reduce_op.hpp"
#include "troupe/tensor.hpp"
#include "troupe/transport/tcp_ring.hpp"

namespace troupe::distribute::detail {

/// The workers a strategy spans, as seen from one of them (cross-replica context only: every
/// worker must make the same calls in the same order).
class WorkerGroup {
 public:
  virtual ~WorkerGroup() = default;
  /// Workers in the group (1 for a one-process strategy).
  virtual int size() const = 0;
  /// This worker's rank: 0 is the chief.
  virtual int rank() const = 0;
  /// Reduces this worker's per-replica values with `local`, then over every worker: the SUM or
  /// MEAN over every replica of the cluster, on the host.
  virtual Tensor reduce(ReduceOp op, const std::vector<Tensor>& per_replica, CrossDeviceOps& local) = 0;
  /// Sums a tensor of this worker's over the workers (every worker passes one shape and dtype).
  virtual Tensor sum(const Tensor& local) = 0;
  /// The chief's `value` on every worker (every worker passes one shape and dtype).
  virtual Tensor broadcast_from_chief(const Tensor& value) = 0;
  /// Concatenates the workers' tensors along `axis`, in rank order (only that dimension may
  /// differ between workers).
  virtual Tensor concat(const Tensor& local, int axis) = 0;
  /// The cluster's health as the chief's control plane records it (heartbeats, workers late and
  /// lost, faults, refused connections, failed collectives); nullptr for one process.
  virtual actors::cluster_health* health() { return nullptr; }
  /// This worker's last log lines, which its heartbeat carries to the chief (the monitor adds
  /// what it says); nullptr for one process.
  virtual actors::log_tail* log_tail() { return nullptr; }
};

/// One process: every operation returns this worker's value.
class LocalWorkerGroup final : public WorkerGroup {
 public:
  int size() const override { return 1; }
  int rank() const override { return 0; }
  Tensor reduce(ReduceOp op, const std::vector<Tensor>& per_replica, CrossDeviceOps& local) override;
  Tensor sum(const Tensor& local) override { return local; }
  Tensor broadcast_from_chief(const Tensor& value) override { return value; }
  Tensor concat(const Tensor& local, int axis) override;
};

/// What the cluster watch learnt: the first worker declared gone, and the ring to break so that
/// collectives waiting on it fail at once. Shared with the watch's actor thread, which reports
/// into it; created before the ring exists, since a verdict may come during the start.
class WorkerFailures {
 public:
  /// Records a verdict (`rank`: the lost worker's id in the chief's watch, -1 when the reason
  /// names none), and shuts the ring down (when one is attached). Every verdict is kept, in the
  /// order they came, until forgotten: an elastic cluster may lose a second worker while it
  /// handles the first.
  void report(const std::string& why, int rank = -1);
  /// The rank named with the first verdict kept (-1: none, or no verdict).
  int rank() const;
  /// The first verdict kept; empty while every worker lives.
  std::string reason() const;
  /// The first verdict, waiting at most `wait` for one (a broken ring is often the echo of a
  /// verdict on its way).
  std::string await_reason(std::chrono::milliseconds wait) const;
  /// Every verdict kept, in the order they came: (rank, reason).
  std::vector<std::pair<int, std::string>> verdicts() const;
  /// Attaches the ring to break on a verdict (nullptr detaches it); a verdict kept breaks it at
  /// once.
  void attach(transport::tcp_ring* ring);
  /// Forgets the verdicts naming `ranks` (an elastic cluster that re-formed its ring without
  /// them); a later verdict, or one naming another rank, stays.
  void forget(const std::vector<int>& ranks);
  /// Forgets every verdict.
  void clear();

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable reported_;
  std::vector<std::pair<int, std::string>> verdicts_;
  transport::tcp_ring* ring_ = nullptr;
};

/// The message of a failed cross-worker collective: the peer by task and data endpoint (from
/// `members`, in rank order), and what the cluster watch learnt, when it learnt something.
std::string describe_collective_failure(const transport::peer_error& e, const std::vector<actors::member>& members,
                                        const WorkerFailures& failures);

/// What worker `rank` tells every other worker, through the watch, of a fault of the cluster's
/// (`e.for_everyone()` set): "TASK (rank R) found the workers out of step: ..." when the workers
/// disagree on the collective, "TASK (rank R) found the ring link from TASK (rank P) tampered with:
/// ..." when a frame failed its integrity check. Workers are named from `members` (rank order).
std::string describe_fault_report(const transport::peer_error& e, const std::vector<actors::member>& members, int rank);

/// Several processes joined by a TCP ring among the workers' leaders, watched by the cluster
/// watch. A collective that fails throws CollectiveAborted naming the peer (its task and data
/// endpoint) and, when the watch learnt something, what it learnt.
class RingWorkerGroup final : public WorkerGroup {
 public:
  /// `members` in rank order (from the rendezvous); `listener` is the data plane's listening
  /// socket the ring was accepted on (kept open for the group's life; may be null); `watch` may be
  /// null (no liveness watch); `health` is what the watch records into (null: a record of its own,
  /// which only failed collectives fill); `log` is the tail the watch's heartbeat reads (null: one
  /// of its own, which nobody reads); `position` is where this worker's step, phase and collective
  /// are kept for its heartbeat to carry to the chief's stall inspector (null: one of its own).
  RingWorkerGroup(int rank, std::vector<actors::member> members, std::unique_ptr<transport::listener> listener,
                  std::unique_ptr<transport::tcp_ring> ring, std::shared_ptr<WorkerFailures> failures,
                  std::unique_ptr<actors::cluster_watch> watch,
                  std::shared_ptr<actors::cluster_health> health = nullptr,
                  std::shared_ptr<actors::log_tail> log = nullptr,
                  std::shared_ptr<actors::position_board> position = nullptr);
  ~RingWorkerGroup() override;
  RingWorkerGroup(const RingWorkerGroup&) = delete;
  RingWorkerGroup& operator=(const RingWorkerGroup&) = delete;

  int size() const override { return static_cast<int>(members_.size()); }
  int rank() const override { return rank_; }
  Tensor reduce(ReduceOp op, const std::vector<Tensor>& per_replica, CrossDeviceOps& local) override;
  Tensor sum(const Tensor& local) override;
  Tensor broadcast_from_chief(const Tensor& value) override;
  Tensor concat(const Tensor& local, int axis) override;
  actors::cluster_health* health() override { return health_.get(); }
  actors::log_tail* log_tail() override { return log_.get(); }

  /// A training step begins (Strategy::run, on every worker): the ring's frames carry its number
  /// from now on, so that a worker that skipped, added or reordered a collective fails on every
  /// worker instead of adding values of different steps.
  void begin_step() {
    ring().begin_step(++steps_);
    position_->begin_step(steps_);
  }
  /// The step ended (returned or failed): the loop's own work until the next.
  void end_step() noexcept { position_->end_step(); }
  /// Sums a host tensor over the workers in place (the tensor must not be shared). With
  /// `compression`, a float32 tensor crosses as f16 or bf16: each worker rounds its values to the
  /// format (nearest even), the ring sums them in float32 in its fixed order and rounds every
  /// partial sum to the format again, and the final 16-bit sum, the same bits on every worker, is
  /// widened back into `t`. Other dtypes ignore it. A float16 or bfloat16 tensor is summed in
  /// float32 (twice its bytes on the ring) and rounded once at the end, the same bits on every
  /// worker.
  void all_reduce_in_place(Tensor& t, Compression compression = Compression::none);
  /// Where the last all_reduce_in_place waited for another worker (tcp_ring::peer_wait).
  transport::tcp_ring::peer_wait last_all_reduce_wait() const { return ring().last_all_reduce_wait(); }
  /// The members, in rank order.
  const std::vector<actors::member>& members() const { return members_; }
  /// Breaks the ring: a collective in progress on another thread fails at once (the group is
  /// being torn down).
  void shutdown_ring() {
    if (ring_) ring_->shutdown();
  }
  /// Elastic membership: re-forms the ring among `members` (the survivors of a change, in their
  /// new rank order, this worker at `rank`) as ring generation `generation`, on the listener the
  /// group keeps, every connection proving `auth` (the cluster token and the generation's
  /// incarnation, actors::generation_incarnation: a hello or frame of an earlier generation is
  /// refused). The old ring is closed first, so nothing of its is ever read again; the watch's
  /// reason is forgotten, and the ring's steps are numbered afresh (the survivors may have run
  /// different numbers of them). Bounded by `timeout`; a survivor that does
  /// not come is a CollectiveAborted naming it; every collective after that fails the same way
  /// (the restart path).
  /// Not while a collective runs on another thread.
  void reform(int rank, std::vector<actors::member> members, std::uint64_t generation,
              const transport::ring_auth& auth, std::chrono::milliseconds timeout);
  /// What the cluster watch learnt (shared with its actor thread).
  WorkerFailures& failures() { return *failures_; }
  /// The cluster watch (null when there is none).
  actors::cluster_watch* watch() { return watch_.get(); }
  /// The ring's generation: 0 from the start, the generation of the last reform after it.
  std::uint64_t generation() const noexcept { return generation_; }
  /// Elastic membership, on a worker that joined a running cluster with a ring of `generation`:
  /// until end_joining, broadcast_from_chief returns this worker's own value (the variables it
  /// creates are overwritten by the cluster's state) and every other collective is a
  /// std::logic_error (the others are not running it).
  void begin_joining(std::uint64_t generation) {
    generation_ = generation;
    joining_ = true;
  }
  /// Elastic membership: this worker left the cluster at a step boundary (asked to): its watch
  /// ends with its goodbye, so that the chief does not count its exit as a loss, and every
  /// collective after this throws CollectiveAborted saying that it left. Its ring stays open
  /// (unused) until the group ends: the others close their ends of it as they re-form.
  void leave();
  bool left() const noexcept { return left_; }
  /// The joiner meets the others in Model::fit, to receive the cluster's state.
  void end_joining() noexcept { joining_ = false; }
  bool joining() const noexcept { return joining_; }

 private:
  void all_gather(const void* mine, std::size_t my_bytes, void* out, const std::vector<std::size_t>& bytes);
  /// The ring; CollectiveAborted when a reform left none (it did not form).
  transport::tcp_ring& ring() const;
  /// The CollectiveAborted for `e`. A fault of the cluster's (workers out of step, a link
  /// tampered with: describe_fault_report) is told to every worker first, through the watch;
  /// otherwise the watch's verdict, when one is on its way, is awaited briefly, so that a worker
  /// whose ring broke under it learns why.
  [[noreturn]] void fail(const transport::peer_error& e);

  int rank_;
  std::vector<actors::member> members_;
  std::unique_ptr<transport::listener> listener_;
  std::unique_ptr<transport::tcp_ring> ring_;
  std::shared_ptr<WorkerFailures> failures_;
  std::shared_ptr<actors::cluster_health> health_;
  std::shared_ptr<actors::log_tail> log_;
  std::shared_ptr<actors::position_board> position_;
  std::uint64_t steps_ = 0;  // Strategy::run calls so far
  std::uint64_t generation_ = 0;  // of the ring (elastic membership)
  bool joining_ = false;          // joined a running cluster, its state not received yet
  bool left_ = false;             // left the elastic cluster
  std::vector<std::uint16_t> wire_;  // compressed values, kept between calls (no page faults)
  std::unique_ptr<actors::cluster_watch> watch_;  // declared last: destroyed first
};

}  // namespace troupe::distribute::detail
