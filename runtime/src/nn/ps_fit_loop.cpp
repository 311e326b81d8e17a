// The chief's side of Model::fit under ParameterServerStrategy (ps_fit.hpp has the walkthrough):
// closures scheduled a bounded number ahead, their results taken in order, the callbacks and
// the controls at closure boundaries.

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "distribute/cluster/ps_access.hpp"
#include "nn/epoch_end.hpp"
#include "nn/model_config.hpp"
#include "nn/ps_fit.hpp"
#include "troupe/base/quote.hpp"
#include "troupe/errors.hpp"
#include "troupe/nn/callbacks.hpp"

namespace troupe::nn::detail {

namespace {

using json = nlohmann::json;

Model& checked(Model& model, int epochs, std::int64_t steps_per_epoch, const FitOptions& options) {
  if (!model.optimizer()) throw std::logic_error("Model::fit: compile the model first");
  if (epochs < 0) throw std::invalid_argument("Model::fit: epochs is " + std::to_string(epochs) + " (expected >= 0)");
  if (steps_per_epoch < 1) {
    throw std::invalid_argument(
        "Model::fit: under ParameterServerStrategy steps_per_epoch is required (it is " +
        std::to_string(steps_per_epoch) +
        "): each worker reads its own dataset, with no end common to all, so an epoch is a number of steps, as Keras "
        "requires");
  }
  if (options.steps_per_execution < 1) {
    throw std::invalid_argument("Model::fit: steps_per_execution is " + std::to_string(options.steps_per_execution) +
                                " (expected 1 or more steps per scheduled closure)");
  }
  if (options.initial_step < 0) {
    throw std::invalid_argument("Model::fit: initial_step is " + std::to_string(options.initial_step) +
                                " (expected >= 0)");
  }
  for (std::size_t i = 0; i < options.callbacks.size(); ++i) {
    if (!options.callbacks[i]) throw std::invalid_argument("Model::fit: callback " + std::to_string(i) + " is null");
  }
  if (options.backup_and_restore != nullptr) {
    throw std::invalid_argument(
        "Model::fit: BackupAndRestore keeps the variables of this process; under ParameterServerStrategy they live on "
        "the ps tasks: save a Checkpoint of model.variables() from a callback's on_checkpoint instead");
  }
  if (!model.layers().built()) {
    throw std::invalid_argument(
        "Model::fit: under ParameterServerStrategy the variables are made on the ps tasks before the workers train: "
        "build the model first (model.build(input_shape), in the strategy's scope)");
  }
  const auto frozen = model.layers().named_non_trainable_variables();
  if (!frozen.empty()) {
    throw std::invalid_argument("Model::fit under ParameterServerStrategy: variable " + base::quoted(frozen[0].first) +
                                " is not trainable (a BatchNormalization's moving statistics): the workers only send "
                                "gradients, so such layers do not train under this strategy");
  }
  return model;
}

// What every closure of this fit carries, the same text for all (the worker's cache key).
std::string closure_config(const Model& model, const distribute::ShardOptimizer& o) {
  std::vector<std::string> names;
  for (const Variable& v : model.trainable_variables()) names.push_back(v.name());
  const char* kind = o.kind == distribute::ShardOptimizer::Kind::adam    ? "adam"
                     : o.kind == distribute::ShardOptimizer::Kind::adamw ? "adamw"
                                                                          : "sgd";
  const json optimizer{{"kind", kind},         {"momentum", o.momentum}, {"nesterov", o.nesterov},
                       {"beta_1", o.beta_1},   {"beta_2", o.beta_2},     {"epsilon", o.epsilon},
                       {"weight_decay", o.weight_decay}};
  const std::string first = model.layers().layers().front()->class_name();
  return json{{"training", training_config(model)},
              {"variables", names},
              {"optimizer", optimizer},
              {"sparse_first", first == "Embedding"}}
      .dump();
}

}  // namespace

PsFitLoop::PsFitLoop(Model& model, distribute::ParameterServerStrategy& strategy, const DatasetCreator& creator,
                     int epochs, std::int64_t steps_per_epoch, const FitOptions& options)
    : model_(checked(model, epochs, steps_per_epoch, options)),
      strategy_(strategy),
      epochs_(epochs),
      steps_per_epoch_(steps_per_epoch),
      steps_per_execution_(options.steps_per_execution),
      options_(options),
      control_(model.control()),
      out_(options.out != nullptr ? *options.out : std::cout),
      optimizer_(shard_optimizer_of(*model.optimizer())),
      dataset_function_(creator.dataset_function) {
  config_ = distribute::detail::text_tensor(closure_config(model_, optimizer_));
  // Enough closures in flight that no worker waits for the chief, few enough that a new learning
  // rate or a stop acts soon, and that the updates stay close to the variables they were computed
  // from.
  window_ = static_cast<std::size_t>(std::max(1, 2 * strategy_.num_workers()));
  rate_ = CompletionRate(window_, std::chrono::seconds(1));
}

PsFitLoop::~PsFitLoop() {
  if (counting_samples_) distribute::detail::PsAccess::on_result(strategy_, {});
}

History PsFitLoop::run() {
  begin();
  for (;;) {
    try {
      for (int epoch = first_epoch_; epoch < epochs_ && !stopped_; ++epoch) run_epoch(epoch);
      break;
    } catch (...) {
      // A closure failed (or a ps task was lost): the closures in flight end first, so the
      // coordinator is left with nothing of this fit; the error raised once more is this one,
      // unless it was a ps task restarted alone, from which training goes on.
      in_flight_.clear();
      for (int i = 0; i < 2; ++i) {  // the first raises the failure, the second waits for the rest
        try {
          coordinator_->join();
        } catch (const std::exception&) {
        }
      }
      if (!recover_from_ps_restart()) throw;
    }
  }
  // After a ps restart the steps redone from the checkpoint count once.
  if (rolled_back_) history_.steps = step_ - options_.initial_step;
  for (const auto& c : callbacks_) c->on_train_end(last_batch_logs_);
  record_iterations();
  return std::move(history_);
}

void PsFitLoop::begin() {
  control_.reset();
  FitParams params;
  params.epochs = epochs_;
  params.steps = steps_per_epoch_;
  params.verbose = options_.verbose;
  params.worker = 0;
  params.workers = strategy_.num_workers();
  params.metrics.push_back("loss");
  for (const std::string& m : model_.metrics()) params.metrics.push_back(m);
  callbacks_ = options_.callbacks;
  if (options_.verbose > 0) {
    ProgbarOptions bar;
    bar.verbose = options_.verbose;
    bar.out = &out_;
    bar.terminal = options_.terminal ? *options_.terminal : (options_.out == nullptr && isatty(STDOUT_FILENO) == 1);
    callbacks_.push_back(std::make_shared<ProgbarLogger>(bar));
  }
  for (const auto& c : callbacks_) c->set_model(model_, params);
  Logs train_logs;
  for (const auto& c : callbacks_) c->on_train_begin(train_logs);
  step_ = options_.initial_step;
  iterations_at_start_ = model_.optimizer()->iterations().value().to(Device()).item<std::int64_t>();
  scheduled_ = step_;
  first_epoch_ = static_cast<int>(step_ / steps_per_epoch_);
  first_k_ = step_ % steps_per_epoch_;
  control_.set_position(step_, first_epoch_);
  coordinator_ = distribute::ClusterCoordinator::attach(strategy_);
  ps_losses_seen_ = distribute::detail::PsAccess::ps_losses(strategy_);
  iterator_ = coordinator_->create_per_worker_dataset(dataset_function_).make_iterator();
  // Each worker's samples on the dashboard's board, as its results arrive: the train step returns
  // (losses, rows, hits), float64 vectors of its steps (take_one checks them).
  if (auto board = distribute::detail::PsAccess::dispatcher(strategy_).board()) {
    distribute::detail::PsAccess::on_result(strategy_, [board](int worker, const std::vector<Tensor>& r) {
      if (r.size() != 3 || r[1].dtype() != DType::f64) return;
      double rows = 0;
      for (const double x : r[1].to_vector<double>()) rows += x;
      board->samples_done(worker, static_cast<std::uint64_t>(rows), actors::ps_cluster_board::clock::now());
    });
    counting_samples_ = true;
  }
}

void PsFitLoop::schedule(std::int64_t first_k, std::int64_t steps) {
  const Tensor params = Tensor::from_vector<double>(
      {static_cast<double>(steps), static_cast<double>(model_.optimizer()->learning_rate()), static_cast<double>(scheduled_)});
  distribute::RemoteValue value = coordinator_->schedule(fit_train_step, iterator_, config_, params);
  in_flight_.push_back(InFlight{std::move(value), first_k, steps});
  scheduled_ += steps;
}

void PsFitLoop::run_epoch(int epoch) {
  control_.set_position(step_, epoch);
  Logs epoch_logs;
  for (const auto& c : callbacks_) c->on_epoch_begin(epoch, epoch_logs);
  const auto start = Clock::now();
  rate_.restart(start);
  EpochSums sums;
  std::int64_t next_k = epoch == first_epoch_ ? first_k_ : 0;
  for (;;) {
    while (!hold_ && !stopped_ && in_flight_.size() < window_ && next_k < steps_per_epoch_) {
      const std::int64_t n = std::min(steps_per_execution_, steps_per_epoch_ - next_k);
      schedule(next_k, n);
      next_k += n;
    }
    if (!in_flight_.empty()) {
      take_one(epoch, sums);
      continue;
    }
    if (hold_ && boundary()) {  // what waited for the closures in flight is done
      rate_.restart(Clock::now());  // a pause (or a save) is no closure's time
      continue;
    }
    break;
  }
  end_epoch(epoch, sums, epoch_logs, start);
}

bool PsFitLoop::take_one(int epoch, EpochSums& sums) {
  if (in_flight_.empty()) return false;
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  Logs logs;
  for (const auto& c : callbacks_) c->on_train_batch_begin(f.first_k, logs);
  const std::vector<Tensor> r = f.value.fetch();  // the worker's error, naming it, if it failed
  const std::size_t n = static_cast<std::size_t>(f.steps);
  if (r.size() != 3 || r[0].num_elements() != f.steps || r[1].num_elements() != f.steps ||
      r[2].num_elements() != f.steps || r[0].dtype() != DType::f64) {
    throw Error("Model::fit: a worker's train step returned " + std::to_string(r.size()) +
                " values (expected 3 float64 vectors of " + std::to_string(f.steps) + " steps each)");
  }
  const std::vector<double> losses = r[0].to_vector<double>(), rows = r[1].to_vector<double>(),
                            hits = r[2].to_vector<double>();
  double loss = 0, closure_rows = 0, closure_hits = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ++step_;
    if (!std::isfinite(losses[i]) && history_.non_finite_step == 0) history_.non_finite_step = step_;
    if (options_.on_step_end) options_.on_step_end(step_, losses[i]);
    loss += losses[i];
    closure_rows += rows[i];
    closure_hits += hits[i];
  }
  sums.loss += loss;
  sums.hits += closure_hits;
  sums.steps += f.steps;
  sums.samples += static_cast<std::int64_t>(closure_rows);
  const auto now = Clock::now();
  rate_.add(now, f.steps, closure_rows);
  logs["loss"] = loss / static_cast<double>(n);
  for (const std::string& m : model_.metrics()) logs[m] = closure_rows > 0 ? closure_hits / closure_rows : 0.0;
  logs["learning_rate"] = model_.optimizer()->learning_rate();
  logs["samples_per_second"] = rate_.samples_per_second();
  logs["time/step_ms"] = rate_.step_ms();
  control_.set_position(step_, epoch);
  for (const auto& c : callbacks_) c->on_train_batch_end(f.first_k + f.steps - 1, logs);
  last_batch_logs_ = std::move(logs);

  // Controls at this closure boundary: a learning rate reaches the closures scheduled from now
  // on; a checkpoint, a pause or a stop waits until the closures in flight are done.
  TrainingControl::Requests requests = control_.take();
  if (requests.learning_rate) {
    model_.optimizer()->set_learning_rate(static_cast<float>(*requests.learning_rate));
    for (const auto& c : callbacks_) c->on_learning_rate(step_, model_.optimizer()->learning_rate());
  }
  if (requests.checkpoint && history_.non_finite_step == 0) checkpoint_pending_ = true;
  if (requests.pause) pause_pending_ = *requests.pause;
  std::optional<std::string> stop = control_.take_immediate_stop();
  if (!stop && requests.stop) stop = requests.stop_reason;
  if (stop && !stop_pending_) {
    stop_pending_ = true;
    stop_reason_ = *stop;
  }
  hold_ = checkpoint_pending_ || pause_pending_ || stop_pending_;
  return true;
}

// With no closure in flight: the checkpoint, the stop and the pause that waited. Returns whether
// training goes on.
bool PsFitLoop::boundary() {
  for (;;) {
    if (checkpoint_pending_) {
      checkpoint_pending_ = false;
      record_iterations();
      for (const auto& c : callbacks_) c->on_checkpoint(step_, last_batch_logs_);
    }
    if (stop_pending_) {
      stopped_ = true;
      hold_ = false;
      history_.stop_reason = stop_reason_;
      history_.stopped_at_step = step_;
      control_.set_stopped_for(TrainingControl::reason_code(stop_reason_));
      if (control_.paused()) control_.set_paused(false);
      return false;
    }
    if (!pause_pending_) {
      if (control_.paused()) {
        control_.set_paused(false);
        for (const auto& c : callbacks_) c->on_resume(step_);
      }
      hold_ = false;
      return true;
    }
    if (!control_.paused()) {
      // control().paused() turns true only once every callback (the dashboard among them) knows.
      for (const auto& c : callbacks_) c->on_pause(step_);
      control_.set_paused(true);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    TrainingControl::Requests requests = control_.take();
    if (requests.learning_rate) {
      model_.optimizer()->set_learning_rate(static_cast<float>(*requests.learning_rate));
      for (const auto& c : callbacks_) c->on_learning_rate(step_, model_.optimizer()->learning_rate());
    }
    if (requests.checkpoint) checkpoint_pending_ = true;
    if (requests.pause) pause_pending_ = *requests.pause;
    std::optional<std::string> stop = control_.take_immediate_stop();
    if (!stop && requests.stop) stop = requests.stop_reason;
    if (stop) {
      stop_pending_ = true;
      stop_reason_ = *stop;
    }
  }
}

void PsFitLoop::end_epoch(int epoch, const EpochSums& sums, Logs& epoch_logs, Clock::time_point start) {
  if (sums.steps == 0) return;  // stopped before this epoch's first closure came back
  const double seconds = seconds_between(start, Clock::now());
  // Before on_epoch_end, so that a checkpoint a callback writes holds the steps done (validation
  // reads no iteration count).
  record_iterations();
  close_epoch({model_, options_, callbacks_, control_, history_, stopped_, step_}, epoch, sums, seconds,
               epoch_logs);
}

// The optimizer's iteration count (on the ps tasks) with the steps done, for a checkpoint of
// model.variables(): Keras's count of every update applied, across fits, which a model loaded
// outside the cluster takes for Adam's step (the ps tasks count each shard's own).
void PsFitLoop::record_iterations() {
  Variable iterations = model_.optimizer()->iterations();
  iterations.assign(Tensor::scalar<std::int64_t>(iterations_at_start_ + step_ - options_.initial_step));
}

}  // namespace troupe::nn::detail
