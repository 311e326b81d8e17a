// Model::fit under elastic membership (MultiWorkerMirroredStrategy with
// MultiWorkerOptions::elastic): FitLoop's in-memory commits, its recovery from a lost worker, the
// admission of joiners, the leave of workers asked to go and the agreement at an epoch's end. The loop's other phases are in
// fit_loop.cpp.
#include "nn/fit_loop.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "distribute/collectives/worker_group.hpp"
#include "distribute/strategies/elastic_membership.hpp"
#include "flight_recorder.hpp"
#include "troupe/actors/membership_state.hpp"
#include "troupe/errors.hpp"
#include "troupe/log.hpp"
#include "troupe/distribute/strategy.hpp"
#include "troupe/flight_recorder.hpp"
#include "troupe/nn/callbacks.hpp"

namespace troupe::nn::detail {

// Elastic membership: the state after step `k` of `epoch`, with the epoch's sums so far (the
// position as the backup records it: the last step of an epoch stands at the start of the next).
distribute::detail::CommitPosition FitLoop::commit(int epoch, std::int64_t k, const EpochSums& sums) {
  const bool epoch_done = steps_per_epoch_ > 0 && k + 1 == steps_per_epoch_;
  const distribute::detail::CommitPosition at{step_, epoch_done ? epoch + 1 : epoch, epoch_done ? 0 : k + 1, taken_,
                                              passes_ - 1, iterator_ ? iterator_->split_workers() : 0};
  committed_.commit(at);
  const EpochSums kept = epoch_done ? EpochSums{} : sums;
  bool replaced = false;
  for (auto& entry : committed_sums_) {
    if (entry.first == step_) {
      entry.second = kept;
      replaced = true;
    }
  }
  if (!replaced) committed_sums_.emplace_back(step_, kept);
  // Only the sums of the commits held.
  std::vector<std::pair<std::int64_t, EpochSums>> held;
  for (const auto& entry : committed_sums_) {
    if (committed_.holds(entry.first)) held.push_back(entry);
  }
  committed_sums_ = std::move(held);
  return at;
}

namespace {

// A change of membership as one flight recorder entry (op "membership", labelled `label`, as the
// collectives inside it are): running while it lasts, done once training takes up, failed when
// the change falls back to the restart path (an exception leaves before done()).
class ChangeEntry {
 public:
  ChangeEntry(std::int64_t step, int workers, const char* label)
      : label_(label), recorded_(troupe::detail::FlightRecorder::process(), what(step, workers)) {}
  void done() noexcept { recorded_.done(); }

 private:
  static troupe::detail::flight_collective what(std::int64_t step, int workers) {
    troupe::detail::flight_collective w;
    w.step = static_cast<std::uint64_t>(std::max<std::int64_t>(step, 0));
    w.collective = -1;
    w.op = troupe::detail::flight_op::membership;
    w.group = troupe::detail::flight_group::workers;
    w.participants = workers;
    return w;
  }
  CallSiteLabel label_;
  troupe::detail::flight_scope recorded_;
};

}  // namespace

// Elastic membership, after a step failed: the cluster without the lost worker, the newest
// commit every worker that continues holds, restored, and the input taken up there.
// Every worker that continues says where it failed (`stage`) beside the commits it holds, in the
// same all-gather: an epoch's end decides from them whether the others ended it already.
distribute::detail::CommitPosition FitLoop::recover(const std::string& failure, EpochSums& sums, std::int64_t stage,
                                                    std::int64_t* furthest) {
  const auto started = Clock::now();
  ChangeEntry entry(step_, workers_, "elastic:worker_left");
  const distribute::detail::MembershipChange change = elastic_->change(failure);
  std::vector<std::int64_t> mine = committed_.steps();
  mine.resize(2, -1);
  mine.push_back(stage);
  const std::vector<std::int64_t> all =
      group_.concat(Tensor::from_vector(mine, {3}), 0).to_vector<std::int64_t>();
  std::vector<std::vector<std::int64_t>> held(all.size() / 3);
  std::string listed;
  std::int64_t far = stage;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (i % 3 == 2) {
      far = std::max(far, all[i]);
      continue;
    }
    if (all[i] >= 0) held[i / 3].push_back(all[i]);
    if (i % 3 == 0) listed += (i == 0 ? "worker 0: " : "; worker " + std::to_string(i / 3) + ": ");
    listed += (i % 3 == 1 ? ", " : "") + std::to_string(all[i]);
  }
  if (furthest != nullptr) *furthest = far;
  const std::optional<std::int64_t> step = actors::common_commit(held);
  if (!step) {
    throw CollectiveAborted("elastic membership falls back to the restart path: the workers that continue hold no "
                            "common commit (" + listed + ")");
  }
  const distribute::detail::CommitPosition at = committed_.restore(*step);
  sums = EpochSums{};
  for (const auto& entry : committed_sums_) {
    if (entry.first == *step) sums = entry.second;
  }
  take_up_input(at);
  std::string left;
  for (const std::string& t : change.left) left += (left.empty() ? "" : ", ") + t;
  const auto paused = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
  const std::string what = left + " left; " + std::to_string(change.workers) + " worker" +
                           (change.workers == 1 ? "" : "s") + " continue from step " + std::to_string(step_) +
                           " as ring generation " + std::to_string(change.generation) + " (paused " +
                           std::to_string(paused.count()) + " ms)";
  troupe::log(LogLevel::warning, "elastic membership: " + what);
  record_change(change, paused, 0, what);
  entry.done();
  return at;
}

// The chief's dashboard: the change as an event and a record (who left and joined, the step, the
// pause, the ring's ids after it).
void FitLoop::record_change(const distribute::detail::MembershipChange& change, std::chrono::milliseconds paused,
                            std::uint64_t state_bytes, const std::string& what, bool asked_to_leave) {
  auto* health = group_.health();
  if (health == nullptr) return;
  actors::membership_record r;
  r.left = change.left;
  r.joined = change.joined;
  r.step = step_;
  r.paused_ms = paused.count();
  r.workers = change.workers;
  r.generation = change.generation;
  r.state_bytes = state_bytes;
  r.leave = asked_to_leave;
  r.ring = change.watch_ids;
  health->membership_changed(std::move(r), what, actors::cluster_health::clock::now());
}

// Elastic membership: training takes up at `at` (the workers there are now, their step table,
// a new input iterator split over them where the commit stood).
void FitLoop::take_up_input(const distribute::detail::CommitPosition& at) {
  step_ = at.step;
  workers_ = group_.size();
  size_step_table();
  // The passes this process made already drew their shuffles' orders: the iterator at the
  // commit is made as in a process just started (rewound, the passes before it replayed), so
  // that every worker's global batches are the same and each row goes to one replica.
  iterator_.reset();  // stops its prefetch, which would draw more
  dataset_.rewind_passes();
  BackupAndRestore::replay_passes(dataset_, at.input_passes);
  // A pass whose input was split over the workers of then (FILE sharding, a dataset_fn's input
  // contexts) is taken up as split then, and its rest re-split over the workers there are now.
  iterator_.emplace(dataset_.make_iterator(at.iterator_position > 0 ? at.input_split : 0));
  passes_ = at.input_passes + 1;
  taken_ = BackupAndRestore::skip(*iterator_, at.iterator_position);
  control_.set_position(step_, static_cast<int>(at.epoch));
}

namespace {

// FNV-1a over the bytes of every variable's first component, in the model's order: equal on
// every worker whose weights (and optimizer slots) are the same bits.
std::int64_t weights_digest(const std::map<std::string, Variable>& variables) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const auto& [name, v] : variables) {
    const Tensor t = v.components().front().to(Device());
    const auto* p = static_cast<const unsigned char*>(t.raw_data());
    for (std::size_t i = 0; i < t.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ULL;
  }
  return static_cast<std::int64_t>(h);
}

}  // namespace

// Elastic membership: the chief's state to every worker over the ring (a joiner assigns it, the
// members hold it already), then every worker's weights digest compared with the chief's.
// Returns the bytes of the variables sent.
std::size_t FitLoop::exchange_state(distribute::detail::CommitPosition& at, EpochSums& sums, bool receiving) {
  const auto& variables = model_.variables();
  const std::vector<std::int64_t> head{static_cast<std::int64_t>(variables.size()), at.step, at.epoch,
                                       at.step_in_epoch, at.iterator_position, at.input_passes, sums.steps,
                                       sums.samples, at.input_split};
  const std::vector<std::int64_t> got = group_.broadcast_from_chief(Tensor::from_vector(head, {9})).to_vector<std::int64_t>();
  const std::vector<double> sums_in =
      group_.broadcast_from_chief(Tensor::from_vector(std::vector<double>{sums.loss, sums.hits}, {2})).to_vector<double>();
  if (got[0] != head[0]) {
    throw CollectiveAborted("elastic membership: the cluster's model has " + std::to_string(got[0]) +
                            " variables and this worker's " + std::to_string(head[0]) +
                            ": every worker must run the same program");
  }
  std::size_t bytes = 0;
  for (const auto& [name, v] : variables) {
    Variable variable = v;
    const Tensor value = group_.broadcast_from_chief(variable.components().front().to(Device()));
    bytes += value.nbytes();
    if (receiving) variable.assign(value);
  }
  if (receiving) {
    at = {got[1], got[2], got[3], got[4], got[5], got[8]};
    sums = EpochSums{sums_in[0], sums_in[1], got[6], got[7]};
  }
  const std::vector<std::int64_t> digests =
      group_.concat(Tensor::from_vector(std::vector<std::int64_t>{weights_digest(variables)}, {1}), 0)
          .to_vector<std::int64_t>();
  for (std::size_t r = 1; r < digests.size(); ++r) {
    if (digests[r] != digests[0]) {
      throw CollectiveAborted("elastic membership: after the change worker " + std::to_string(r) +
                              "'s weights digest differs from the chief's (" + std::to_string(digests[r]) + " vs " +
                              std::to_string(digests[0]) + ")");
    }
  }
  return bytes;
}

// Elastic membership, at a step boundary where the chief's row asked for it: the workers waiting
// to join are admitted, receive the state committed here, and every worker takes its input up
// from it, split over the workers there are now.
void FitLoop::admit(int epoch, std::int64_t k, const EpochSums& sums) {
  const auto started = Clock::now();
  ChangeEntry entry(step_, workers_, "elastic:admission");
  distribute::detail::CommitPosition at = commit(epoch, k, sums);
  EpochSums kept = steps_per_epoch_ > 0 && k + 1 == steps_per_epoch_ ? EpochSums{} : sums;
  const distribute::detail::MembershipChange change = elastic_->admit();
  if (change.joined.empty()) {  // the chief refused them all: no change
    entry.done();
    return;
  }
  const std::size_t bytes = exchange_state(at, kept, false);
  take_up_input(at);
  std::string joined;
  for (const std::string& t : change.joined) joined += (joined.empty() ? "" : ", ") + t;
  const auto paused = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
  const std::string what = joined + " joined; " + std::to_string(change.workers) + " workers continue from step " +
                           std::to_string(step_) + " as ring generation " + std::to_string(change.generation) +
                           " (paused " + std::to_string(paused.count()) + " ms, state " + std::to_string(bytes) +
                           " bytes)";
  troupe::log(LogLevel::warning, "elastic membership: " + what);
  record_change(change, paused, bytes, what);
  entry.done();
}

// Elastic membership, at a step boundary (after step `k` of `epoch`) where the rows of `ranks`
// asked to leave: the chief decides, the workers it lets go leave here (true: this one did; its
// fit ends without another collective), and the others commit here and take their input up from
// here, split over the workers that stay. Every worker completed the step before: nothing is
// rolled back.
bool FitLoop::leave(int epoch, std::int64_t k, const EpochSums& sums, const std::vector<int>& ranks) {
  const auto started = Clock::now();
  ChangeEntry entry(step_, workers_, "elastic:leave");
  const distribute::detail::MembershipChange change = elastic_->leave(ranks);
  if (change.left.empty()) {  // the chief refused them all: no change, the boundary's commit as usual
    if (step_ % elastic_->commit_every_steps() == 0) commit(epoch, k, sums);
    entry.done();
    return false;
  }
  std::string left;
  for (const std::string& t : change.left) left += (left.empty() ? "" : ", ") + t;
  const auto paused = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
  if (change.rank < 0) {
    stopped_ = true;
    stopped_mid_epoch_ = true;  // a backup stays as it is: the cluster goes on without this worker
    history_.left_cluster = true;
    history_.stop_reason = "left the elastic cluster at step " + std::to_string(step_) + " (asked to leave)";
    history_.stopped_at_step = step_;
    troupe::log(LogLevel::warning, "elastic membership: this worker left the cluster at step " + std::to_string(step_) +
                                       " as it was asked to; " + std::to_string(change.workers) + " worker" +
                                       (change.workers == 1 ? "" : "s") + " continue (" + left + " left)");
    entry.done();
    return true;
  }
  distribute::detail::CommitPosition at = commit(epoch, k, sums);
  take_up_input(at);
  std::string refused;
  for (const std::string& r : change.refused) refused += "; refused: " + r;
  const std::string what = left + " left (asked to leave); " + std::to_string(change.workers) + " worker" +
                           (change.workers == 1 ? "" : "s") + " continue from step " + std::to_string(step_) +
                           " as ring generation " + std::to_string(change.generation) + " (paused " +
                           std::to_string(paused.count()) + " ms, nothing rolled back)" + refused;
  troupe::log(LogLevel::warning, "elastic membership: " + what);
  record_change(change, paused, 0, what, true);
  entry.done();
  return false;
}

// Elastic membership, after an epoch's last step (`k`), committed at its boundary: every worker
// passes one collective before any ends the epoch, so that none ends it while another failed that
// step (the commit they share would then be of the epoch one of them ended). The commit of the
// epoch's end makes a loss early in the next epoch roll back to its start rather than into the
// epoch ended. False when the collective failed and training rolled back into this epoch: `k` is
// then the step before the one to take up, `sums` the epoch's as committed there. True when it
// failed and every worker that continues holds the epoch's end: each of them finished the last
// step, so the epoch ends (end_epoch_together) over them.
bool FitLoop::end_together(int epoch, std::int64_t& k, EpochSums& sums) {
  if (workers_ <= 1) return true;
  try {
    const CallSiteLabel phase("fit:epoch_end");
    group_.sum(Tensor::from_vector(std::vector<float>{1.0f}, {1}));
  } catch (const troupe::Error& e) {
    if (!failed_in_collective(e)) throw;
    EpochSums kept = sums;
    const distribute::detail::CommitPosition at = recover(e.what(), kept, 2 * std::int64_t{epoch} + 1);
    if (at.epoch == epoch + 1 && at.step_in_epoch == 0) return true;  // `sums` stay the epoch's, to end it
    if (at.epoch != epoch) {
      throw CollectiveAborted("elastic membership falls back to the restart path: the commit the workers that "
                              "continue hold is of epoch " + std::to_string(at.epoch + 1) + ", and this worker "
                              "stands at the end of epoch " + std::to_string(epoch + 1));
    }
    sums = kept;
    k = at.step_in_epoch - 1;
    return false;
  }
  return true;
}

// Elastic membership: the end of an epoch every worker agreed to end (end_together): its means,
// validation, on_epoch_end and the backup, then one more collective that every worker passes
// before any starts the next epoch. A worker lost inside them is dropped as one lost in a step:
// the workers that continue all hold the commit of the epoch's end (its last step), restore it,
// and say where each failed. When one of them passed that last collective, every worker had
// entered it, the end's work done on each: they all go on with the next epoch. Otherwise none
// began the next epoch, and the epoch's end runs again from its start over the workers that
// continue (validation, on_epoch_end and the backup again, on some for the second time), as the
// steps after a commit run again.
void FitLoop::end_epoch_together(int epoch, std::int64_t k, std::int64_t first_k, const EpochSums& sums,
                                 const Logs& epoch_logs, Clock::time_point start) {
  const std::int64_t steps_before = history_.steps;
  const std::int64_t samples_before = history_.samples;
  for (;;) {
    Logs logs = epoch_logs;
    try {
      end_epoch(epoch, k, first_k, sums, logs, start);
      if (workers_ > 1) {
        const CallSiteLabel phase("fit:epoch_closed");
        group_.sum(Tensor::from_vector(std::vector<float>{1.0f}, {1}));
      }
      return;
    } catch (const troupe::Error& e) {
      if (!failed_in_collective(e)) throw;
      EpochSums next;
      std::int64_t furthest = 0;
      const std::int64_t here = 2 * std::int64_t{epoch} + 1;
      const distribute::detail::CommitPosition at = recover(e.what(), next, here, &furthest);
      if (at.epoch != epoch + 1 || at.step_in_epoch != 0) {
        throw CollectiveAborted("elastic membership falls back to the restart path: a worker was lost in the end of "
                                "epoch " + std::to_string(epoch + 1) + ", and the commit the workers that continue "
                                "hold is not of its end (epoch " + std::to_string(at.epoch + 1) + ", step " +
                                std::to_string(at.step_in_epoch) + " of it)");
      }
      if (furthest > here) {
        troupe::log(LogLevel::warning, "elastic membership: the end of epoch " + std::to_string(epoch + 1) +
                                           " was done on every worker; the next epoch goes on");
        return;
      }
      history_.steps = steps_before;
      history_.samples = samples_before;
      troupe::log(LogLevel::warning, "elastic membership: the end of epoch " + std::to_string(epoch + 1) +
                                         " (validation, callbacks, backup) runs again on the " +
                                         std::to_string(workers_) + " worker" + (workers_ == 1 ? "" : "s") +
                                         " that continue");
    }
  }
}

}  // namespace troupe::nn::detail
