#include "troupe/nn/model.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "distribute/collectives.hpp"
#include "distribute/context_state.hpp"
#include "distribute/worker_group.hpp"
#include "troupe/distribute/context.hpp"
#include "troupe/distribute/strategy.hpp"
#include "troupe/nn/ops.hpp"

namespace troupe::nn {

using distribute::ReduceOp;

namespace {

// The model's input: float32 [batch, features]. Wider ranks are flattened, as a Keras Flatten
// layer would (IDX images [batch, 28, 28]); other dtypes are converted.
Tensor model_input(const Tensor& x, const char* op) {
  if (x.rank() < 2) {
    throw std::invalid_argument(std::string(op) + ": features of shape " + shape_to_string(x.shape()) +
                                " (expected [batch, features])");
  }
  Tensor out = x;
  if (x.rank() > 2) {
    std::int64_t cols = 1;
    for (std::size_t d = 1; d < x.shape().size(); ++d) cols *= x.shape()[d];
    out = x.reshape({x.shape()[0], cols});
  }
  return out.dtype() == DType::f32 ? out : out.cast(DType::f32);
}

double as_double(const Tensor& scalar) { return scalar.cast(DType::f64).item<double>(); }

void check_element(const data::Element& e, const char* op) {
  if (e.size() < 2) {
    throw std::invalid_argument(std::string(op) + ": a dataset element has " + std::to_string(e.size()) +
                                " component(s) (expected {features, targets})");
  }
}

std::int64_t rows_of(const data::Element& e) { return e[0].rank() > 0 ? e[0].shape()[0] : 0; }

// Cross-replica context of the model's strategy, for the methods that run outside run().
distribute::Scope cross_replica_scope(distribute::Strategy& strategy, const char* op) {
  if (distribute::has_strategy() && !distribute::in_cross_replica_context()) {
    throw std::logic_error(std::string("Model::") + op +
                           ": call it in cross-replica context (outside strategy.run); inside a replica function "
                           "use model(x) and train_step");
  }
  return strategy.scope();
}

// Model::train_step's gradient buckets: the variables in the order the backward pass produces
// their gradients (reverse layer order), cut into buckets of about `bytes` (a larger tensor is a
// bucket of its own).
struct BucketPlan {
  std::vector<std::vector<std::size_t>> members;  // per bucket: variable indices, in production order
  std::vector<std::size_t> bucket_of;             // per variable
};

BucketPlan plan_buckets(const std::vector<Variable>& variables, std::size_t bytes) {
  BucketPlan plan;
  plan.bucket_of.resize(variables.size());
  std::size_t filled = 0;
  // Sequential::backward's order: the last layer first, its bias before its kernel.
  for (std::size_t k = variables.size(); k-- > 0;) {
    const std::size_t size = variables[k].value().nbytes();
    if (plan.members.empty() || (filled > 0 && filled + size > bytes)) {
      plan.members.emplace_back();
      filled = 0;
    }
    plan.members.back().push_back(k);
    plan.bucket_of[k] = plan.members.size() - 1;
    filled += size;
  }
  return plan;
}

// The replica's gradients, all-reduced (SUM) bucket by bucket while the backward pass goes on;
// adds replica 0's waits to the optimizer's all-reduce times.
LossAndGradients bucketed_gradients(const Sequential& layers, const Loss& loss, Optimizer& optimizer,
                                    distribute::ReplicaContext& ctx, std::size_t bucket_bytes, const Tensor& features,
                                    const Tensor& targets, std::int64_t global_batch_size) {
  const std::vector<Variable> variables = layers.trainable_variables();
  const BucketPlan plan = plan_buckets(variables, bucket_bytes);
  distribute::detail::ReplicaCollectives& collectives = distribute::detail::collectives_of(ctx);
  const int local = ctx.local_replica_index();

  std::vector<Tensor> activations;
  const Tensor outputs = layers.forward(model_input(features, "train_step"), activations);
  LossAndGradient lg = loss.fn(outputs, targets, global_batch_size);
  std::vector<Tensor> gradients(variables.size());
  std::vector<std::size_t> ready(plan.members.size(), 0);
  std::vector<std::size_t> handles(plan.members.size(), 0);
  layers.backward(activations, lg.gradient, [&](std::size_t index, const Tensor& gradient) {
    gradients[index] = gradient;
    const std::size_t b = plan.bucket_of[index];
    if (++ready[b] < plan.members[b].size()) return;
    std::vector<Tensor> values;
    values.reserve(plan.members[b].size());
    for (std::size_t k : plan.members[b]) values.push_back(gradients[k]);
    handles[b] = collectives.start_all_reduce(local, ReduceOp::sum, std::move(values));
  });

  // The wait that backward did not hide starts when every replica has started its last bucket,
  // i.e. finished its backward pass (waiting for a replica still differentiating is not it).
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point all_started{};
  for (std::size_t b = 0; b < plan.members.size(); ++b) {
    std::vector<Tensor> sums = collectives.wait_all_reduce(local, handles[b], all_started);
    for (std::size_t i = 0; i < sums.size(); ++i) gradients[plan.members[b][i]] = std::move(sums[i]);
  }
  if (ctx.replica_id_in_sync_group() == 0) {
    const auto end = std::chrono::steady_clock::now();
    const auto from = std::max(start, all_started);
    optimizer.record_all_reduce_time(std::chrono::duration_cast<std::chrono::nanoseconds>(end - start),
                                     std::chrono::duration_cast<std::chrono::nanoseconds>(end - std::min(end, from)));
  }
  return {std::move(lg.loss), std::move(gradients)};
}

}  // namespace

Model::Model(Sequential layers) : layers_(std::move(layers)), strategy_(&distribute::get_strategy()) {
  if (layers_.layers().empty()) throw std::invalid_argument("Model: the Sequential has no layers");
  const std::size_t replicas = strategy_->extended().worker_devices().size();
  for (const auto& [name, variable] : layers_.named_trainable_variables()) {
    if (variable.components().size() != replicas) {
      throw std::invalid_argument("Model: variable '" + name + "' has " + std::to_string(variable.components().size()) +
                                  " component(s) but the current strategy has " + std::to_string(replicas) +
                                  " local replica(s): create the layers and the model in the same strategy.scope()");
    }
  }
}

void Model::compile(std::shared_ptr<Optimizer> optimizer, Loss loss) {
  if (!optimizer) throw std::invalid_argument("Model::compile: the optimizer is null");
  if (!loss.fn) throw std::invalid_argument("Model::compile: the loss '" + loss.name + "' has no function");
  auto scope = cross_replica_scope(*strategy_, "compile");
  optimizer->build(layers_.named_trainable_variables());
  optimizer_ = std::move(optimizer);
  loss_ = std::move(loss);
}

void Model::check_compiled(const char* op) const {
  if (!optimizer_) throw std::logic_error(std::string("Model::") + op + ": compile the model first");
}

LossAndGradients Model::compute_gradients(const Tensor& features, const Tensor& targets,
                                          std::int64_t global_batch_size) const {
  check_compiled("compute_gradients");
  std::vector<Tensor> activations;
  const Tensor outputs = layers_.forward(model_input(features, "compute_gradients"), activations);
  LossAndGradient lg = loss_.fn(outputs, targets, global_batch_size);
  return {std::move(lg.loss), layers_.backward(activations, lg.gradient)};
}

Tensor Model::train_step(const data::Element& inputs, std::int64_t global_batch_size) {
  check_compiled("train_step");
  check_element(inputs, "train_step");
  // Inside strategy.run with several replicas: the gradients are all-reduced in buckets while
  // the backward pass goes on (RuntimeOptions::gradient_bucket_bytes), the same bits as one
  // all-reduce after it.
  distribute::ReplicaContext* ctx = distribute::detail::installed_replica_context();
  const std::size_t bucket_bytes =
      ctx != nullptr && ctx->num_replicas_in_sync() > 1 ? ctx->strategy().backend().gradient_bucket_bytes() : 0;
  if (bucket_bytes > 0) {
    check_compiled("compute_gradients");
    LossAndGradients r = bucketed_gradients(layers_, loss_, *optimizer_, *ctx, bucket_bytes, inputs[0], inputs[1],
                                            global_batch_size);
    optimizer_->apply_gradients(zip(r.gradients, trainable_variables()), std::nullopt);
    return r.loss;
  }
  LossAndGradients r = compute_gradients(inputs[0], inputs[1], global_batch_size);
  optimizer_->apply_gradients(zip(r.gradients, trainable_variables()));
  return r.loss;
}

History Model::fit(const distribute::DistributedDataset& dataset, int epochs, std::int64_t steps_per_epoch,
                   const FitOptions& options) {
  check_compiled("fit");
  if (epochs < 0) throw std::invalid_argument("Model::fit: epochs is " + std::to_string(epochs) + " (expected >= 0)");
  if (steps_per_epoch == 0 || steps_per_epoch < -1) {
    throw std::invalid_argument("Model::fit: steps_per_epoch is " + std::to_string(steps_per_epoch) +
                                " (expected a positive number, or -1 for one pass per epoch)");
  }
  if (options.initial_step < 0 || (options.initial_step > 0 && steps_per_epoch < 0)) {
    throw std::invalid_argument("Model::fit: initial_step " + std::to_string(options.initial_step) +
                                " needs steps_per_epoch and must be >= 0");
  }
  auto scope = cross_replica_scope(*strategy_, "fit");
  distribute::Strategy& strategy = *strategy_;
  std::ostream& out = options.out != nullptr ? *options.out : std::cout;
  const std::int64_t workers = strategy.backend().workers().size();
  const auto all_reduce_before = optimizer_->all_reduce_time();

  History history;
  std::optional<distribute::DistributedIterator> iterator;
  std::int64_t step = options.initial_step;
  const int first_epoch = steps_per_epoch > 0 ? static_cast<int>(options.initial_step / steps_per_epoch) : 0;
  for (int epoch = first_epoch; epoch < epochs; ++epoch) {
    if (steps_per_epoch < 0 || !iterator) iterator.emplace(dataset.make_iterator());
    const auto start = std::chrono::steady_clock::now();
    double loss_sum = 0.0;
    std::int64_t steps = 0;
    std::int64_t samples = 0;
    std::int64_t k = (epoch == first_epoch && steps_per_epoch > 0) ? options.initial_step % steps_per_epoch : 0;
    for (; steps_per_epoch < 0 || k < steps_per_epoch; ++k) {
      auto batch = iterator->get_next_as_optional();
      if (!batch) {
        if (steps_per_epoch < 0) break;
        iterator.emplace(dataset.make_iterator());  // a finite dataset with steps_per_epoch: start again
        batch = iterator->get_next_as_optional();
        if (!batch) throw std::invalid_argument("Model::fit: the dataset has no elements");
      }
      std::int64_t rows = 0;
      for (const data::Element& e : batch->values()) {
        check_element(e, "fit");
        rows += rows_of(e);
      }
      // Every worker's replicas get batches of one size except at the very end of the data.
      const std::int64_t global_batch = rows * workers;
      if (global_batch == 0) continue;
      auto losses = strategy.run([this, global_batch](const data::Element& e) { return train_step(e, global_batch); },
                                 *batch);
      const double loss = as_double(strategy.reduce(ReduceOp::sum, losses, std::nullopt));
      loss_sum += loss;
      ++steps;
      samples += global_batch;
      ++step;
      if (options.on_step_end) options.on_step_end(step, loss);
    }
    if (steps == 0) {
      throw std::invalid_argument("Model::fit: epoch " + std::to_string(epoch + 1) + " got no batch from the dataset");
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double epoch_loss = loss_sum / static_cast<double>(steps);
    const double rate = seconds > 0 ? static_cast<double>(samples) / seconds : 0.0;
    history.loss.push_back(epoch_loss);
    history.seconds.push_back(seconds);
    history.samples_per_second.push_back(rate);
    history.steps += steps;
    history.samples += samples;
    if (options.verbose > 0) {
      std::ostringstream line;
      line << "Epoch " << epoch + 1 << "/" << epochs << ": " << steps << (steps == 1 ? " step" : " steps")
           << ", loss " << std::setprecision(6) << epoch_loss << ", " << std::fixed << std::setprecision(0) << rate
           << " samples/s, ";
      // Epochs of a small set take microseconds: three significant digits in ms, not "0.000 s".
      if (seconds >= 0.1) {
        line << std::setprecision(3) << seconds << " s\n";
      } else {
        line << std::defaultfloat << std::setprecision(3) << seconds * 1e3 << " ms\n";
      }
      out << line.str() << std::flush;
    }
  }
  history.all_reduce_seconds = std::chrono::duration<double>(optimizer_->all_reduce_time() - all_reduce_before).count();
  return history;
}

History Model::fit(const data::Dataset& dataset, int epochs, std::int64_t steps_per_epoch,
                   const FitOptions& options) {
  if (dataset.cardinality() == data::infinite_cardinality && steps_per_epoch < 0) {
    throw std::invalid_argument("Model::fit: the dataset is infinite (repeat()); give steps_per_epoch");
  }
  return fit(strategy_->experimental_distribute_dataset(dataset), epochs, steps_per_epoch, options);
}

Tensor Model::predict(const Tensor& x) const {
  auto scope = cross_replica_scope(*strategy_, "predict");
  return layers_.forward(model_input(x, "predict"));
}

EvaluateResult Model::evaluate(const Tensor& features, const Tensor& labels) const {
  return evaluate(data::Dataset::from_tensors({features, labels}));
}

EvaluateResult Model::evaluate(const data::Dataset& batches) const {
  check_compiled("evaluate");
  auto scope = cross_replica_scope(*strategy_, "evaluate");
  double loss_sum = 0.0;
  double hits = 0.0;
  EvaluateResult result;
  for (const data::Element& e : batches) {
    check_element(e, "evaluate");
    const std::int64_t rows = rows_of(e);
    if (rows == 0) continue;
    const Tensor outputs = layers_.forward(model_input(e[0], "evaluate"));
    loss_sum += as_double(loss_.fn(outputs, e[1], rows).loss) * static_cast<double>(rows);
    const bool integer_labels = e[1].dtype() == DType::i32 || e[1].dtype() == DType::i64;
    if (integer_labels) hits += nn::accuracy(outputs, e[1]) * static_cast<double>(rows);
    result.samples += rows;
  }
  if (result.samples > 0) {
    result.loss = loss_sum / static_cast<double>(result.samples);
    result.accuracy = hits / static_cast<double>(result.samples);
  }
  return result;
}

std::map<std::string, Variable> Model::variables() const {
  std::map<std::string, Variable> out = layers_.variables();
  if (optimizer_) {
    for (auto& [name, variable] : optimizer_->variables()) out.emplace(name, variable);
  }
  return out;
}

}  // namespace troupe::nn
