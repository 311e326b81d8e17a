#pragma once

// Model::fit as a loop with named phases. Each step of an epoch goes through them in order:
//
// 1. input: the next per-replica batch (a new pass when one ends, as steps_per_epoch asks) and
//    its rows on every replica and over every worker;
// 2. step: train_step on every replica through strategy.run, each replica returning the step's
//    table (distribute/step_agreement.hpp: its loss, its hits, under MultiWorkerMirroredStrategy
//    its worker's pending requests and step-time parts), summed by one reduction;
// 3. agreement: the reduced table read back: the loss and metrics, every replica's loss, every
//    worker's parts, and the requests every worker agreed to apply at this boundary;
// 4. callbacks: the backup's position, FitOptions::on_step_end, on_train_batch_end;
// 5. controls: what was agreed (learning rate, checkpoint, pause, stop) and a callback's
//    stop_training, applied at the step boundary; a pause holds here.
//
// An epoch ends with its means, validation, on_epoch_end and the backup; a stop at a step
// boundary cuts the epoch, and the backup records the step inside it where the next run resumes.
//
// Under elastic membership (MultiWorkerOptions::elastic) the loop also commits its state in
// memory at every commit_every_steps-th step boundary (and at its start): the variables, the
// position and the epoch's running sums. When phases 1 to 3 of a step fail because a worker was
// lost, the strategy turns the cluster into its survivors (ElasticMembership::change), every
// survivor restores the newest commit all of them hold, makes a new input iterator at that
// position (split over the workers that continue, the global batch the same) and the epoch goes
// on from there: the steps after the commit are run again, and their callbacks called again.
// An epoch's last step is always committed; the workers agree to end the epoch (a collective)
// and pass another after its end (validation, callbacks, backup): a worker lost inside that end
// is dropped as in a step, and the end runs again over the others unless one of them had passed
// the collective after it (fit_elastic.cpp, end_epoch_together).
// A worker asking to join is admitted at the step boundary the chief's row of the step's table
// names: every member commits there, the ring re-forms with the joiner, the chief's state (the
// variables, the position and the epoch's sums) reaches it by broadcast, every worker checks that
// its weights' digest equals the chief's, and every worker takes its input up at the commit's
// position, split over the workers there are now. The joiner meets them at the start of its fit.
// A worker asked to leave (SIGUSR2) says so in its row of every step's table until it has left;
// at the first boundary an admission could take, the chief lets it go: its fit returns there
// (History::left_cluster), and the others commit there, re-form the ring without it and take
// their input up from that position, split over fewer workers; nothing is rolled back.

#include <array>
#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distribute/strategies/elastic_commit.hpp"
#include "distribute/strategies/step_agreement.hpp"
#include "nn/epoch_end.hpp"
#include "troupe/distribute/input.hpp"
#include "troupe/errors.hpp"
#include "troupe/nn/backup_and_restore.hpp"
#include "troupe/nn/model.hpp"

namespace troupe::distribute {
class Strategy;
}  // namespace troupe::distribute

namespace troupe::distribute::detail {
class WorkerGroup;
class ElasticMembership;
struct MembershipChange;
}  // namespace troupe::distribute::detail

namespace troupe::nn::detail {

/// Whether a failed step failed in a collective (directly, or in a replica's function): what a
/// lost worker does to a step. Any other failure (a replica's own exception) is the program's.
bool failed_in_collective(const troupe::Error& e);

/// One call of Model::fit (on a distributed dataset), from its checks to its History.
class FitLoop {
 public:
  /// Checks the arguments (std::invalid_argument naming the bad one).
  FitLoop(Model& model, const distribute::DistributedDataset& dataset, int epochs, std::int64_t steps_per_epoch,
          const FitOptions& options);
  FitLoop(const FitLoop&) = delete;
  FitLoop& operator=(const FitLoop&) = delete;

  /// Trains, in the model's strategy's cross-replica context.
  History run();

 private:
  // One step's batch: the per-replica elements and their rows.
  struct Batch {
    distribute::PerReplica<data::Element> values;
    std::vector<std::int64_t> replica_rows;
    std::int64_t global_rows = 0;  // over every replica of every worker
  };
  // What the step's reduced table says.
  struct StepResult {
    double loss = 0;
    double hits = 0;
    std::optional<distribute::detail::StepAgreement> agreed;  // under MultiWorkerMirroredStrategy
  };
  using EpochSums = detail::EpochSums;
  using Clock = std::chrono::steady_clock;

  void begin();
  void run_epoch(int epoch);
  // input
  std::optional<Batch> next_batch();
  // step
  distribute::PerReplica<Tensor> run_step(const Batch& batch, const std::vector<double>& carried_row);
  // agreement
  std::vector<double> carried_row(distribute::detail::StepRequests& carried);
  StepResult read_table(const Tensor& reduced, const distribute::detail::StepRequests& carried,
                        std::vector<double>& table) const;
  void step_logs(Logs& logs, const StepResult& result, const Batch& batch, const std::vector<double>& table,
                 const distribute::PerReplica<Tensor>& results, Clock::time_point t0, Clock::time_point t1,
                 Clock::time_point t2, std::chrono::nanoseconds all_reduce_at_start);
  // callbacks
  void end_step(int epoch, std::int64_t k, Logs& logs);
  // controls
  void boundary(Logs& logs, std::optional<distribute::detail::StepAgreement> carried);
  void end_epoch(int epoch, std::int64_t k, std::int64_t first_k, const EpochSums& sums, Logs& epoch_logs,
                 Clock::time_point start);
  void finish();
  // elastic membership
  void size_step_table();
  distribute::detail::CommitPosition commit(int epoch, std::int64_t k_done, const EpochSums& sums);
  // `stage`: where this worker failed, 2 x its epoch in a step, 2 x its epoch + 1 in the epoch's
  // end; `furthest` (when given) receives the furthest stage of every worker that continues.
  distribute::detail::CommitPosition recover(const std::string& failure, EpochSums& sums, std::int64_t stage,
                                             std::int64_t* furthest = nullptr);
  void admit(int epoch, std::int64_t k_done, const EpochSums& sums);
  bool leave(int epoch, std::int64_t k_done, const EpochSums& sums, const std::vector<int>& ranks);
  bool end_together(int epoch, std::int64_t& k, EpochSums& sums);
  void end_epoch_together(int epoch, std::int64_t k, std::int64_t first_k, const EpochSums& sums,
                          const Logs& epoch_logs, Clock::time_point start);
  std::size_t exchange_state(distribute::detail::CommitPosition& at, EpochSums& sums, bool receiving);
  void record_change(const distribute::detail::MembershipChange& change, std::chrono::milliseconds paused,
                     std::uint64_t state_bytes, const std::string& what, bool asked_to_leave = false);
  void take_up_input(const distribute::detail::CommitPosition& at);

  Model& model_;
  const distribute::DistributedDataset& dataset_;
  const int epochs_;
  const std::int64_t steps_per_epoch_;
  const FitOptions& options_;
  distribute::Strategy& strategy_;
  distribute::detail::WorkerGroup& group_;
  TrainingControl& control_;
  std::ostream& out_;
  int workers_;  // changes only with an elastic cluster's membership
  const int local_replicas_;
  const bool with_metrics_;
  bool wide_;  // each replica returns the step's table (metrics, or several workers)
  distribute::detail::StepTable table_;
  const bool printing_;
  std::chrono::nanoseconds all_reduce_before_{};

  std::vector<std::shared_ptr<Callback>> callbacks_;
  History history_;
  BackupAndRestore* backup_ = nullptr;
  TrainingPosition at_;  // where this call starts
  std::optional<distribute::DistributedIterator> iterator_;
  std::int64_t taken_ = 0;   // elements taken from the current iterator
  std::int64_t passes_ = 0;  // iterators made, the current one included
  std::int64_t step_ = 0;
  int first_epoch_ = 0;
  bool stopped_ = false;
  bool stopped_mid_epoch_ = false;  // at a step boundary (a signal, a request): the backup stays
  bool nothing_to_do_ = false;
  Logs last_batch_logs_;
  std::array<double, distribute::detail::part_fields> previous_parts_{};  // this worker's parts of the step before
  // The names of the per-replica and per-worker logs, made once rather than every step.
  std::vector<std::string> replica_loss_keys_;
  std::vector<std::array<std::string, distribute::detail::part_fields>> worker_part_keys_;
  // Elastic membership: null when the strategy has none.
  distribute::detail::ElasticMembership* elastic_ = nullptr;
  distribute::detail::CommittedState committed_;
  std::vector<std::pair<std::int64_t, EpochSums>> committed_sums_;  // by committed step, the last two
  std::optional<EpochSums> joined_sums_;  // a joiner's: the epoch's sums so far, from the chief
  std::int64_t joined_split_ = 0;         // a joiner's: the workers the chief's pass was split over
};

}  // namespace troupe::nn::detail
