#include "nn/fit_loop.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <stdexcept>
#include <thread>
#include <utility>

#include "distribute/collectives/worker_group.hpp"
#include "distribute/strategies/elastic_membership.hpp"
#include "elements.hpp"
#include "flight_recorder.hpp"
#include "gpu/gpu.hpp"
#include "nn/element_checks.hpp"
#include "troupe/actors/membership_state.hpp"
#include "troupe/errors.hpp"
#include "troupe/log.hpp"
#include "troupe/distribute/context.hpp"
#include "troupe/distribute/strategy.hpp"
#include "troupe/flight_recorder.hpp"
#include "troupe/nn/callbacks.hpp"
#include "troupe/nn/ops.hpp"

namespace troupe::nn::detail {

using distribute::ReduceOp;
using distribute::detail::StepAgreement;
using distribute::detail::StepRequests;
using distribute::detail::part_fields;
using distribute::detail::request_fields;
using distribute::detail::worker_fields;

namespace {

constexpr const char* part_names[part_fields] = {"input_ms", "compute_ms", "all_reduce_ms", "step_ms"};

StepRequests step_requests(TrainingControl::Requests r) {
  StepRequests out;
  out.stop = r.stop;
  out.stop_code = TrainingControl::reason_code(r.stop_reason);
  out.stop_reason = std::move(r.stop_reason);
  out.checkpoint = r.checkpoint;
  out.pause = r.pause;
  out.learning_rate = r.learning_rate;
  return out;
}

void check_arguments(int epochs, std::int64_t steps_per_epoch, const FitOptions& options) {
  if (epochs < 0) throw std::invalid_argument("Model::fit: epochs is " + std::to_string(epochs) + " (expected >= 0)");
  if (steps_per_epoch == 0 || steps_per_epoch < -1) {
    throw std::invalid_argument("Model::fit: steps_per_epoch is " + std::to_string(steps_per_epoch) +
                                " (expected a positive number, or -1 for one pass per epoch)");
  }
  if (options.initial_step < 0 || (options.initial_step > 0 && steps_per_epoch < 0)) {
    throw std::invalid_argument("Model::fit: initial_step " + std::to_string(options.initial_step) +
                                " needs steps_per_epoch and must be >= 0");
  }
  for (std::size_t i = 0; i < options.callbacks.size(); ++i) {
    if (!options.callbacks[i]) throw std::invalid_argument("Model::fit: callback " + std::to_string(i) + " is null");
  }
  if (options.steps_per_execution != 1) {
    throw std::invalid_argument("Model::fit: steps_per_execution is " + std::to_string(options.steps_per_execution) +
                                "; it sets the steps of a scheduled closure under ParameterServerStrategy, and every "
                                "other strategy runs one step per execution (expected 1)");
  }
}

distribute::Strategy& checked_strategy(Model& model, int epochs, std::int64_t steps_per_epoch,
                                       const FitOptions& options) {
  if (!model.optimizer()) throw std::logic_error("Model::fit: compile the model first");
  check_arguments(epochs, steps_per_epoch, options);
  return model.strategy();
}

}  // namespace

bool failed_in_collective(const troupe::Error& e) {
  if (dynamic_cast<const CollectiveAborted*>(&e) != nullptr) return true;
  const auto* replica = dynamic_cast<const ReplicaError*>(&e);
  if (replica == nullptr || !replica->cause()) return false;
  try {
    std::rethrow_exception(replica->cause());
  } catch (const CollectiveAborted&) {
    return true;
  } catch (...) {
    return false;
  }
}

FitLoop::FitLoop(Model& model, const distribute::DistributedDataset& dataset, int epochs,
                 std::int64_t steps_per_epoch, const FitOptions& options)
    : model_(model),
      dataset_(dataset),
      epochs_(epochs),
      steps_per_epoch_(steps_per_epoch),
      options_(options),
      strategy_(checked_strategy(model, epochs, steps_per_epoch, options)),
      group_(strategy_.backend().workers()),
      control_(model.control()),
      out_(options.out != nullptr ? *options.out : std::cout),
      workers_(group_.size()),
      local_replicas_(static_cast<int>(strategy_.extended().worker_devices().size())),
      with_metrics_(!model.metrics().empty()),
      wide_(with_metrics_ || workers_ > 1),
      table_{workers_, local_replicas_},
      printing_(options.verbose > 0 && (group_.rank() == 0 || options.print_on_all_workers)) {
  elastic_ = dynamic_cast<distribute::detail::ElasticMembership*>(&strategy_.backend());
  if (elastic_ != nullptr && elastic_->commit_every_steps() <= 0) elastic_ = nullptr;
}

History FitLoop::run() {
  begin();
  for (int epoch = first_epoch_; epoch < epochs_ && !stopped_; ++epoch) run_epoch(epoch);
  finish();
  return std::move(history_);
}

// Callbacks, their parameters, and where this call starts (a backup, or initial_step).
void FitLoop::begin() {
  all_reduce_before_ = model_.optimizer()->all_reduce_time();
  control_.reset();
  FitParams params;
  params.epochs = epochs_;
  params.steps = steps_per_epoch_;
  params.verbose = options_.verbose;
  params.worker = group_.rank();
  params.workers = group_.size();
  params.metrics.push_back("loss");
  for (const std::string& m : model_.metrics()) params.metrics.push_back(m);

  callbacks_ = options_.callbacks;
  if (printing_) {
    ProgbarOptions bar;
    bar.verbose = options_.verbose;
    bar.out = &out_;
    bar.terminal = options_.terminal ? *options_.terminal : (options_.out == nullptr && isatty(STDOUT_FILENO) == 1);
    callbacks_.push_back(std::make_shared<ProgbarLogger>(bar));
  }
  for (const auto& c : callbacks_) c->set_model(model_, params);
  Logs train_logs;
  for (const auto& c : callbacks_) c->on_train_begin(train_logs);

  if (steps_per_epoch_ > 0) {
    at_.step = options_.initial_step;
    at_.epoch = options_.initial_step / steps_per_epoch_;
    at_.step_in_epoch = options_.initial_step % steps_per_epoch_;
  }
  backup_ = options_.backup_and_restore;
  if (backup_ != nullptr && !model_.layers().built()) {
    throw std::invalid_argument(
        "Model::fit: BackupAndRestore restores the model's variables before training, but layers that take a size "
        "from the data are not built yet: call model.build(input_shape) first (e.g. {-1, 28, 28, 1})");
  }
  // Elastic membership: a worker that joined a running cluster meets the others here, before any
  // collective of its own, and takes its state (not a backup's).
  const bool joining = elastic_ != nullptr && elastic_->joining();
  if (joining) {
    if (!model_.layers().built()) {
      throw std::invalid_argument(
          "Model::fit: joining a running cluster takes its variables, but layers that take a size from the data are "
          "not built yet: call model.build(input_shape) first (e.g. {-1, 28, 28, 1})");
    }
    const auto started = Clock::now();
    elastic_->end_joining();
    distribute::detail::CommitPosition at;
    EpochSums sums;
    const std::size_t bytes = exchange_state(at, sums, true);
    at_ = TrainingPosition{at.step, at.epoch, at.step_in_epoch, at.iterator_position, at.input_passes};
    joined_sums_ = sums;
    joined_split_ = at.iterator_position > 0 ? at.input_split : 0;
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
    troupe::log(LogLevel::warning, "elastic membership: joined as worker " + std::to_string(group_.rank()) + " of " +
                                       std::to_string(group_.size()) + " at step " + std::to_string(at.step) +
                                       " (state " + std::to_string(bytes) + " bytes, received in " +
                                       std::to_string(took.count()) + " ms)");
  }
  if (backup_ != nullptr) {
    backup_->track(model_.variables());
    if (!joining) at_ = backup_->restore();
  }
  step_ = at_.step;
  first_epoch_ = static_cast<int>(at_.epoch);
  control_.set_position(step_, first_epoch_);
  // Resumed at or past the end of the epochs asked for: nothing to train, and the backup stays
  // (a run asked for more epochs takes it up).
  nothing_to_do_ = first_epoch_ >= epochs_ && epochs_ > 0;
  if (nothing_to_do_ && printing_) {
    out_ << "Nothing left to train: the run stands at step " << step_
         << (at_.step_in_epoch > 0 ? ", in epoch " + std::to_string(first_epoch_ + 1)
                                   : ", after epoch " + std::to_string(first_epoch_))
         << ", and " << epochs_ << (epochs_ == 1 ? " epoch was" : " epochs were") << " asked for"
         << (backup_ != nullptr ? "; the backup in " + backup_->backup_dir() + " is kept" : std::string()) << "\n"
         << std::flush;
  }
  BackupAndRestore::replay_passes(dataset_, at_.input_passes);
  passes_ = at_.input_passes;

  size_step_table();
  if (elastic_ != nullptr) {
    if (!model_.layers().built()) {
      throw std::invalid_argument(
          "Model::fit: elastic membership commits the model's variables from the first step, but layers that take a "
          "size from the data are not built yet: call model.build(input_shape) first (e.g. {-1, 28, 28, 1})");
    }
    committed_.track(model_.variables());
    // The pass run_epoch makes is split over the workers there are now (a joiner's: as the chief's was).
    committed_.commit({step_, first_epoch_, at_.step_in_epoch, at_.iterator_position, at_.input_passes,
                       joined_split_ > 0 ? joined_split_ : group_.size()});
    committed_sums_.assign(1, {step_, EpochSums{}});
  }
}

// The names and the layout of the step's table for the workers there are now.
void FitLoop::size_step_table() {
  wide_ = with_metrics_ || workers_ > 1;
  table_ = distribute::detail::StepTable{workers_, local_replicas_};
  replica_loss_keys_.clear();
  for (int g = 0; g < workers_ * local_replicas_; ++g) replica_loss_keys_.push_back("loss/replica_" + std::to_string(g));
  worker_part_keys_.assign(static_cast<std::size_t>(workers_), {});
  for (std::size_t w = 0; w < worker_part_keys_.size(); ++w) {
    for (std::size_t p = 0; p < part_fields; ++p) {
      worker_part_keys_[w][p] = "worker_" + std::to_string(w) + "/time/" + part_names[p];
    }
  }
  previous_parts_ = {};
}

void FitLoop::run_epoch(int epoch) {
  control_.set_position(step_, epoch);
  if (steps_per_epoch_ < 0 || !iterator_) {
    // A joiner takes the members' pass up as they do (fit_elastic.cpp, take_up_input).
    iterator_.emplace(epoch == first_epoch_ ? dataset_.make_iterator(joined_split_) : dataset_.make_iterator());
    ++passes_;
    taken_ = epoch == first_epoch_ ? BackupAndRestore::skip(*iterator_, at_.iterator_position) : 0;
  }
  Logs epoch_logs;
  for (const auto& c : callbacks_) c->on_epoch_begin(epoch, epoch_logs);
  const auto start = Clock::now();
  EpochSums sums;
  if (epoch == first_epoch_ && joined_sums_) sums = *joined_sums_;  // a joiner takes the epoch up
  const std::int64_t first_k = epoch == first_epoch_ ? at_.step_in_epoch : 0;
  std::int64_t k = first_k;
  bool ended_together = false;  // elastic: every worker agreed to end the epoch (end_together)
  for (; (steps_per_epoch_ < 0 || k < steps_per_epoch_) && !stopped_; ++k) {
    Logs logs;
    for (const auto& c : callbacks_) c->on_train_batch_begin(k, logs);
    const auto t0 = Clock::now();
    const auto all_reduce_at_start = model_.optimizer()->all_reduce_time();
    // The flight recorder labels the step's steps and collectives with fit's phase.
    std::optional<Batch> batch;
    Clock::time_point t1;
    StepRequests carried;
    std::optional<distribute::PerReplica<Tensor>> step_results;
    Tensor reduced;
    try {
      {
        const CallSiteLabel phase("fit:input");
        batch = next_batch();
      }
      if (!batch) break;
      if (batch->global_rows == 0) continue;
      t1 = Clock::now();
      const std::vector<double> row = carried_row(carried);
      {
        const CallSiteLabel phase("fit:train_step");
        step_results.emplace(run_step(*batch, row));
      }
      {
        const CallSiteLabel phase("fit:step_reduction");
        reduced = strategy_.reduce(ReduceOp::sum, *step_results, std::nullopt);
      }
    } catch (const troupe::Error& e) {
      // A lost worker, under elastic membership: the survivors go on from their last common commit.
      if (elastic_ == nullptr || !failed_in_collective(e)) throw;
      const distribute::detail::CommitPosition at = recover(e.what(), sums, 2 * std::int64_t{epoch});
      if (at.epoch != epoch) {
        throw CollectiveAborted("elastic membership falls back to the restart path: the commit the workers that "
                                "continue hold is of epoch " + std::to_string(at.epoch + 1) + ", and this worker has "
                                "ended it (a step of epoch " + std::to_string(epoch + 1) + " failed)");
      }
      k = at.step_in_epoch - 1;  // the loop's ++k takes up the step after the commit
      continue;
    }
    const distribute::PerReplica<Tensor>& results = *step_results;
    const auto t2 = Clock::now();
    std::vector<double> table;
    StepResult result = read_table(reduced, carried, table);
    sums.loss += result.loss;
    sums.hits += result.hits;
    ++sums.steps;
    sums.samples += batch->global_rows;
    ++step_;
    control_.set_position(step_, epoch);
    if (!std::isfinite(result.loss) && history_.non_finite_step == 0) history_.non_finite_step = step_;
    step_logs(logs, result, *batch, table, results, t0, t1, t2, all_reduce_at_start);
    end_step(epoch, k, logs);
    // Elastic membership: the chief's row says whether workers wait to join (every worker reads
    // the same table); alone, the chief asks itself.
    // Never at an epoch's last step: the members end the epoch (validation, backup: collectives)
    // where a joiner would start the next.
    const bool admit_here = elastic_ != nullptr && steps_per_epoch_ > 0 && k + 1 < steps_per_epoch_ &&
                            (workers_ > 1 ? result.agreed && result.agreed->admit : elastic_->joiners_waiting() > 0);
    // A worker asked to leave (its row says so): the same boundaries as an admission; a leave
    // goes first, the joiners come at the next boundary.
    std::vector<int> leaving;
    if (elastic_ != nullptr && steps_per_epoch_ > 0 && k + 1 < steps_per_epoch_ && workers_ > 1 && result.agreed) {
      leaving = result.agreed->leaving;
    }
    boundary(logs, std::move(result.agreed));
    last_batch_logs_ = std::move(logs);
    if (elastic_ != nullptr && !stopped_ && !leaving.empty()) {
      if (leave(epoch, k, sums, leaving)) return;  // this worker left: no more collectives, no epoch end
    } else if (elastic_ != nullptr && !stopped_ && admit_here) {
      admit(epoch, k, sums);
    } else if (elastic_ != nullptr && !stopped_ &&
               (step_ % elastic_->commit_every_steps() == 0 || (steps_per_epoch_ > 0 && k + 1 == steps_per_epoch_))) {
      // An epoch's last step is always committed, before end_together: every worker that goes
      // into the epoch's end holds that commit (fit_elastic.cpp, end_epoch_together).
      commit(epoch, k, sums);
    }
    if (elastic_ != nullptr && !stopped_ && steps_per_epoch_ > 0 && k + 1 == steps_per_epoch_) {
      if (!end_together(epoch, k, sums)) continue;  // rolled back into this epoch: ++k takes up the step after the commit
      ended_together = true;
    }
  }
  if (ended_together) {
    end_epoch_together(epoch, k, first_k, sums, epoch_logs, start);
  } else {
    end_epoch(epoch, k, first_k, sums, epoch_logs, start);
  }
}

// Input: the step's per-replica batch; none when a pass of unknown length ended.
std::optional<FitLoop::Batch> FitLoop::next_batch() {
  auto values = iterator_->get_next_as_optional();
  if (!values) {
    if (steps_per_epoch_ < 0) return std::nullopt;
    iterator_.emplace(dataset_.make_iterator());  // a finite dataset with steps_per_epoch: start again
    ++passes_;
    taken_ = 0;
    values = iterator_->get_next_as_optional();
    if (!values) throw std::invalid_argument("Model::fit: the dataset has no elements");
  }
  ++taken_;
  Batch batch{std::move(*values), {}, 0};
  std::int64_t rows = 0;
  for (const data::Element& e : batch.values.values()) {
    check_element(e, "fit");
    batch.replica_rows.push_back(rows_of(e));
    rows += rows_of(e);
  }
  // Input over several workers knows the step's rows over all of them, which no worker's own rows
  // tell (a global batch that its replicas do not split evenly, a worker whose data has ended);
  // the input of one worker leaves them to its own.
  batch.global_rows = iterator_->last_global_rows().value_or(rows);
  return batch;
}

// Agreement, before the step: under MultiWorkerMirroredStrategy this worker's row of the step's
// table, its pending requests and its step-time parts of the step before.
std::vector<double> FitLoop::carried_row(StepRequests& carried) {
  std::vector<double> row(worker_fields);
  if (workers_ == 1) return row;
  carried = step_requests(control_.take());
  if (elastic_ != nullptr && group_.rank() == 0 && steps_per_epoch_ > 0) {
    carried.joiners = static_cast<std::uint32_t>(elastic_->joiners_waiting());
  }
  // Asked again at every step until it left (or the chief refused): a request is never lost.
  if (elastic_ != nullptr && steps_per_epoch_ > 0) carried.leave = elastic_->leave_requested();
  distribute::detail::encode_requests(carried, row.data());
  std::copy(previous_parts_.begin(), previous_parts_.end(), row.begin() + request_fields);
  return row;
}

namespace {

// On a GPU replica the step's table is completed on the device (the loss, the rows predicted
// right): the host reads it once, after the reduction, instead of waiting on the replica's stream
// for the loss and again for the predictions and labels. Other shapes and dtypes (sequence
// outputs, one-hot or float labels, 16-bit outputs) are read on the host.
bool table_on_device(const Tensor& loss, const Tensor& outputs, const data::Element& e, bool hits) {
  if (!loss.is_gpu() || (loss.dtype() != DType::f32 && loss.dtype() != DType::f64)) return false;
  if (!hits) return true;
  if (e.size() < 2) return false;
  const Tensor& labels = e[1];
  return outputs.is_gpu() && outputs.rank() == 2 && (outputs.dtype() == DType::f32 || outputs.dtype() == DType::f64) &&
         labels.device() == outputs.device() && labels.rank() == 1 && labels.shape()[0] == outputs.shape()[0] &&
         (labels.dtype() == DType::i32 || labels.dtype() == DType::i64) && loss.device() == outputs.device();
}

void fill_table_on_device(Tensor& table, const Tensor& loss, std::int64_t loss_at, double loss_scale,
                          const Tensor& outputs, const data::Element& e, bool hits) {
  const Tensor predicted = hits ? nn::argmax(outputs) : Tensor();
  troupe::detail::gpu::step_table(table.device().index(), static_cast<double*>(table.raw_mutable_data()),
                                  table.num_elements(), loss.raw_data(), troupe::detail::to_scalar_type(loss.dtype()),
                                  loss_at, loss_scale,
                                  hits ? static_cast<const std::int64_t*>(predicted.raw_data()) : nullptr,
                                  hits ? e[1].raw_data() : nullptr,
                                  hits ? troupe::detail::to_scalar_type(e[1].dtype()) : base::scalar_type::i64,
                                  hits ? rows_of(e) : 0);
}

}  // namespace

// Step: train_step on every replica. With metrics or several workers each replica returns the
// step's table (step_agreement.hpp): the first replica of each worker fills its worker's row with
// `row`, and every replica its own loss, so the step's one reduction also agrees on the requests
// and shows every worker's timings and every replica's loss on every worker.
distribute::PerReplica<Tensor> FitLoop::run_step(const Batch& batch, const std::vector<double>& row) {
  const std::int64_t global_batch = batch.global_rows;
  const bool with_metrics = with_metrics_;
  const bool wide = wide_;
  const distribute::detail::StepTable table = table_;
  Model& model = model_;
  return strategy_.run(
      [&model, &row, global_batch, with_metrics, wide, table](const data::Element& e) {
        if (!wide) return model.train_step(e, global_batch);
        // The same step as train_step (gradient buckets included), keeping the outputs.
        Tensor outputs;
        const Tensor step_loss = model.step_and_update(e, global_batch, &outputs, "fit");
        const bool hits = with_metrics && rows_of(e) > 0;
        const bool on_device = table_on_device(step_loss, outputs, e, hits);
        std::vector<double> v(table.size(), 0.0);
        if (!on_device) {
          v[0] = as_double(step_loss);
          if (hits) v[1] = nn::accuracy(outputs, e[1]) * static_cast<double>(rows_of(e));
        }
        std::int64_t loss_at = -1;
        double loss_scale = 0.0;
        if (table.workers > 1) {
          const int id = distribute::get_replica_context()->replica_id_in_sync_group();
          if (id % table.replicas_per_worker == 0) {
            std::copy(row.begin(), row.end(),
                      v.begin() + static_cast<std::ptrdiff_t>(table.worker_row(id / table.replicas_per_worker)));
          }
          if (rows_of(e) > 0) {
            const std::size_t at = table.replica_at(id);
            loss_at = static_cast<std::int64_t>(at);
            loss_scale = static_cast<double>(global_batch) / static_cast<double>(rows_of(e));
            if (!on_device) v[at] = v[0] * loss_scale;
            v[at + 1] = 1.0;
          }
        }
        // On the replica's device, where the strategy's cross-device op expects its values.
        Tensor t = Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}).to(step_loss.device());
        if (on_device) fill_table_on_device(t, step_loss, loss_at, loss_scale, outputs, e, hits);
        return t;
      },
      batch.values);
}

// Agreement, after the step: the loss, the hits and what every worker agreed on.
FitLoop::StepResult FitLoop::read_table(const Tensor& reduced, const StepRequests& carried,
                                        std::vector<double>& table) const {
  StepResult result;
  if (!wide_) {
    result.loss = as_double(reduced);
    return result;
  }
  table = reduced.to_vector<double>();
  result.loss = table[0];
  result.hits = table[1];
  if (workers_ > 1) {
    result.agreed = distribute::detail::decide(table.data() + table_.worker_row(0), workers_, carried, worker_fields);
  }
  return result;
}

// The step's logs: its loss and metrics, what it measured, every replica's loss and (under
// MultiWorkerMirroredStrategy) every worker's parts of the step before, as the table carried them.
void FitLoop::step_logs(Logs& logs, const StepResult& result, const Batch& batch, const std::vector<double>& table,
                        const distribute::PerReplica<Tensor>& results, Clock::time_point t0, Clock::time_point t1,
                        Clock::time_point t2, std::chrono::nanoseconds all_reduce_at_start) {
  const double all_reduce_s =
      std::chrono::duration<double>(model_.optimizer()->all_reduce_time() - all_reduce_at_start).count();
  const double step_s = seconds_between(t0, t2);
  const std::int64_t global_batch = batch.global_rows;
  logs["loss"] = result.loss;
  for (const std::string& m : model_.metrics()) logs[m] = result.hits / static_cast<double>(global_batch);
  logs["learning_rate"] = model_.optimizer()->learning_rate();
  logs["samples_per_second"] = step_s > 0 ? static_cast<double>(global_batch) / step_s : 0.0;
  logs["time/input_ms"] = seconds_between(t0, t1) * 1e3;
  logs["time/all_reduce_ms"] = all_reduce_s * 1e3;
  logs["time/compute_ms"] = std::max(0.0, seconds_between(t1, t2) - all_reduce_s) * 1e3;
  logs["time/step_ms"] = step_s * 1e3;
  if (workers_ > 1) {
    for (int g = 0; g < workers_ * local_replicas_; ++g) {
      const std::size_t at = table_.replica_at(g);
      if (table[at + 1] != 0) logs[replica_loss_keys_[static_cast<std::size_t>(g)]] = table[at];
    }
    for (int w = 0; w < workers_; ++w) {
      const double* parts = table.data() + table_.worker_row(w) + request_fields;
      if (parts[part_fields - 1] <= 0) continue;  // the first step: no step before
      for (std::size_t p = 0; p < part_fields; ++p) logs[worker_part_keys_[static_cast<std::size_t>(w)][p]] = parts[p];
    }
    previous_parts_ = {logs["time/input_ms"], logs["time/compute_ms"], logs["time/all_reduce_ms"], step_s * 1e3};
    return;
  }
  const auto locals = strategy_.experimental_local_results(results);
  for (std::size_t r = 0; r < locals.size() && r < batch.replica_rows.size(); ++r) {
    if (batch.replica_rows[r] == 0) continue;
    const double share = wide_ ? locals[r].to_vector<double>()[0] : as_double(locals[r]);
    logs[replica_loss_keys_[static_cast<std::size_t>(group_.rank() * local_replicas_) + r]] =
        share * static_cast<double>(global_batch) / static_cast<double>(batch.replica_rows[r]);
  }
}

// Callbacks: the backup's position first (on_step_end may save through it), then the step's
// callbacks.
void FitLoop::end_step(int epoch, std::int64_t k, Logs& logs) {
  if (backup_ != nullptr && history_.non_finite_step == 0) {
    // The last step of an epoch of known length stands at the start of the next one.
    const bool epoch_done = steps_per_epoch_ > 0 && k + 1 == steps_per_epoch_;
    backup_->on_step_end(epoch_done ? TrainingPosition{step_, epoch + 1, 0, taken_, passes_ - 1}
                                    : TrainingPosition{step_, epoch, k + 1, taken_, passes_ - 1});
  }
  if (options_.on_step_end) options_.on_step_end(step_, logs.at("loss"));
  for (const auto& c : callbacks_) c->on_train_batch_end(k, logs);
}

// Controls: applies, at this step boundary, what every worker agreed on (carried by the step's
// own reduction under MultiWorkerMirroredStrategy, this worker's requests otherwise) and a
// callback's stop_training; holds training while paused.
void FitLoop::boundary(Logs& logs, std::optional<StepAgreement> carried) {
  StepAgreement agreed = carried ? std::move(*carried) : distribute::detail::agree_alone(step_requests(control_.take()));
  if (auto reason = control_.take_immediate_stop()) {
    if (!agreed.stop) {
      agreed.stop_reason = *reason;
      agreed.stop_code = TrainingControl::reason_code(*reason);
    }
    agreed.stop = true;
  }
  if (agreed.stop) stopped_mid_epoch_ = true;
  for (bool first = true;; first = false) {
    if (agreed.learning_rate) {
      model_.optimizer()->set_learning_rate(static_cast<float>(*agreed.learning_rate));
      for (const auto& c : callbacks_) c->on_learning_rate(step_, model_.optimizer()->learning_rate());
    }
    if (agreed.checkpoint && history_.non_finite_step == 0) {
      for (const auto& c : callbacks_) c->on_checkpoint(step_, logs);
    }
    if (agreed.stop) {
      if (!stopped_) {
        stopped_ = true;
        history_.stop_reason = agreed.stop_reason;
        history_.stopped_at_step = step_;
        control_.set_stopped_for(agreed.stop_code);
      }
      break;
    }
    if (first && agreed.pause && *agreed.pause) {
      // control().paused() turns true only once every callback (the dashboard among them) knows.
      for (const auto& c : callbacks_) c->on_pause(step_);
      control_.set_paused(true);
    } else if (!first && agreed.pause && !*agreed.pause) {
      break;
    }
    if (!control_.paused()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const CallSiteLabel phase("fit:agreement");
    agreed = distribute::detail::agree_now(step_requests(control_.take()), group_);
  }
  if (control_.paused()) {
    control_.set_paused(false);
    if (!stopped_) {
      for (const auto& c : callbacks_) c->on_resume(step_);
    }
  }
}

// The epoch's means, validation and callbacks, then its backup. `k` is the step of the epoch the
// loop stopped at.
void FitLoop::end_epoch(int epoch, std::int64_t k, std::int64_t first_k, const EpochSums& sums, Logs& epoch_logs,
                        Clock::time_point start) {
  // A stop at a step boundary before the epoch's last step cuts the epoch: the run stands inside
  // it, where the next run takes it up (a pass of unknown length may have had no batch left: the
  // next run finds that out and goes on with the next epoch).
  const bool stopped_at_step = stopped_;
  const bool cut = stopped_at_step && (steps_per_epoch_ < 0 || k < steps_per_epoch_);
  // The epoch's time excludes its backup. A stop at a step boundary is backed up at that step,
  // whatever save_freq says, so that the next run resumes after it.
  const auto back_up = [&] {
    if (backup_ == nullptr || history_.non_finite_step != 0) return;  // never a backup of non-finite weights
    const TrainingPosition at_end = cut                   ? TrainingPosition{step_, epoch, k, taken_, passes_ - 1}
                                    : steps_per_epoch_ > 0 ? TrainingPosition{step_, epoch + 1, 0, taken_, passes_ - 1}
                                                           : TrainingPosition{step_, epoch + 1, 0, 0, passes_};
    if (stopped_at_step) {
      backup_->save(at_end);
    } else {
      backup_->on_epoch_end(at_end);
    }
  };
  if (sums.steps == 0 && first_k > 0) {  // resumed after the last batch of this epoch
    back_up();
    return;
  }
  if (sums.steps == 0) {
    throw std::invalid_argument("Model::fit: epoch " + std::to_string(epoch + 1) + " got no batch from the dataset");
  }
  const double seconds = seconds_between(start, Clock::now());
  close_epoch({model_, options_, callbacks_, control_, history_, stopped_, step_}, epoch, sums, seconds,
               epoch_logs);
  back_up();
}

void FitLoop::finish() {
  if (elastic_ != nullptr && group_.rank() == 0) {
    elastic_->refuse_waiting("the cluster's Model::fit ended before a step boundary could admit it");
  }
  for (const auto& c : callbacks_) c->on_train_end(last_batch_logs_);
  history_.all_reduce_seconds =
      std::chrono::duration<double>(model_.optimizer()->all_reduce_time() - all_reduce_before_).count();
  // A run that ended, or that a callback stopped at an epoch's end (EarlyStopping), has no more
  // use for its backup; one stopped at a step boundary (a signal, a request, the dashboard)
  // resumes from it, and one that had nothing to do keeps it.
  if (backup_ != nullptr && !stopped_mid_epoch_ && !nothing_to_do_) backup_->on_train_end();
}

}  // namespace troupe::nn::detail
