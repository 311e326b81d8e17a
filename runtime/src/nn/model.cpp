#include "troupe/nn/model.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "cpu/intra_op.hpp"
#include "distribute/collectives/collectives.hpp"
#include "distribute/collectives/worker_group.hpp"
#include "distribute/strategies/context_state.hpp"
#include "distribute/strategies/step_profile.hpp"
#include "nn/element_checks.hpp"
#include "nn/fit_loop.hpp"
#include "nn/layer_checks.hpp"
#include "nn/ps_fit.hpp"
#include "troupe/distribute/context.hpp"
#include "troupe/distribute/parameter_server_strategy.hpp"
#include "troupe/distribute/strategy.hpp"
#include "troupe/nn/backup_and_restore.hpp"
#include "troupe/nn/loss_scale_optimizer.hpp"
#include "troupe/nn/ops.hpp"

namespace troupe::nn {

using distribute::ReduceOp;
using detail::as_double;
using detail::check_element;
using detail::rows_of;

namespace {

// The model's input as its first layer takes it. Integer ids for an Embedding (or a
// TokenAndPositionEmbedding) go as they are.
// Otherwise the features are converted to the dtype of the model's variables (float32 unless
// the layers were made otherwise), and for a first Dense layer features of a wider rank are
// flattened, as a Keras Flatten layer would (IDX images [batch, 28, 28]).
Tensor model_input(const Sequential& layers, const Tensor& x, const char* op) {
  if (x.rank() < 1) {
    throw std::invalid_argument(std::string(op) + ": features of shape " + shape_to_string(x.shape()) +
                                " (expected a batch: [batch, ...])");
  }
  const Layer& first = *layers.layers().front();
  const std::string first_kind = first.class_name();
  if (first_kind == "Embedding" || first_kind == "TokenAndPositionEmbedding") return x;
  const bool dense = dynamic_cast<const Dense*>(&first) != nullptr;
  if (dense && x.rank() < 2) {
    throw std::invalid_argument(std::string(op) + ": features of shape " + shape_to_string(x.shape()) +
                                " (expected [batch, features])");
  }
  Tensor out = x;
  if (dense && x.rank() > 2) {
    std::int64_t cols = 1;
    for (std::size_t d = 1; d < x.shape().size(); ++d) cols *= x.shape()[d];
    out = x.reshape({x.shape()[0], cols});
  }
  DType dtype = DType::f32;
  for (const auto& layer : layers.layers()) {
    const auto weights = layer->weights();
    if (!weights.empty()) {
      dtype = weights.front().second.dtype();
      break;
    }
  }
  return out.dtype() == dtype ? out : out.cast(dtype);
}

// The context of a training step: the optimizer's iterations as the step (read only when a
// layer draws from the random stream) and the replica's id.
CallContext training_context(const Sequential& layers, const Optimizer* optimizer) {
  CallContext ctx;
  ctx.training = true;
  if (!layers.uses_random_stream()) return ctx;
  if (optimizer != nullptr) ctx.step = optimizer->iterations().value().to(Device()).item<std::int64_t>();
  if (distribute::ReplicaContext* replica = distribute::detail::installed_replica_context()) {
    ctx.replica = replica->replica_id_in_sync_group();
  }
  return ctx;
}

// Under a LossScaleOptimizer a step differentiates the scaled loss (whose gradient is the loss's
// gradient times the scale) and unscales the gradients before the update, as Keras's
// LossScaleOptimizer.minimize does.
Tensor scaled_loss_gradient(const Optimizer& optimizer, const Tensor& gradient) {
  const auto* lso = dynamic_cast<const LossScaleOptimizer*>(&optimizer);
  return lso != nullptr ? lso->get_scaled_loss(gradient) : gradient;
}
std::vector<Tensor> unscaled(const Optimizer& optimizer, std::vector<Tensor> gradients) {
  const auto* lso = dynamic_cast<const LossScaleOptimizer*>(&optimizer);
  return lso != nullptr ? lso->get_unscaled_gradients(gradients) : gradients;
}

// Cross-replica context of the model's strategy, for the methods that run outside run().
distribute::Scope cross_replica_scope(distribute::Strategy& strategy, const char* op) {
  if (distribute::has_strategy() && !distribute::in_cross_replica_context()) {
    throw std::logic_error(std::string("Model::") + op +
                           ": call it in cross-replica context (outside strategy.run); inside a replica function "
                           "use model(x) and train_step");
  }
  return strategy.scope();
}

// Model::train_step's gradient buckets: the gradients in the order the backward pass produces
// them (reverse layer order, a layer's bias before its kernel), cut into buckets of about `bytes`
// (a larger tensor is a bucket of its own). The first layer's kernel gradient is the last one
// backward produces and the largest (784 KiB of the MLP's 1.05 MiB), so nothing would overlap its
// all-reduce: where it is larger than a bucket it is computed in row blocks of about a bucket
// each (at most max_first_kernel_parts), and each block's all-reduce starts as soon as that block
// exists, while the next ones are computed. Row blocks of xᵀ·g are the same products, element for
// element, as the whole (checked on every CPU path by the tests of the bucketed all-reduce).
constexpr std::int64_t max_first_kernel_parts = 8;
constexpr std::int64_t first_kernel_row_multiple = 16;

struct GradientUnit {
  std::size_t variable = 0;
  std::int64_t row_begin = 0;  // rows of the variable; [0, rows) unless the first kernel is split
  std::int64_t row_end = 0;
};

struct BucketPlan {
  std::vector<GradientUnit> units;                // in production order
  std::vector<std::vector<std::size_t>> members;  // per bucket: unit indices, in production order
  std::vector<std::size_t> bucket_of;             // per unit
  std::vector<std::size_t> unit_of;               // per variable: its (first) unit
  std::int64_t first_kernel_part_rows = 0;        // > 0: variable 0 in blocks of this many rows
};

BucketPlan plan_buckets(const std::vector<Variable>& variables, std::size_t bytes, bool may_split_first_kernel) {
  BucketPlan plan;
  plan.unit_of.resize(variables.size());
  const Tensor& first = variables.front().value();
  if (may_split_first_kernel && first.rank() == 2 && first.nbytes() > bytes) {
    const std::int64_t rows = first.shape()[0];
    const std::int64_t parts = std::min<std::int64_t>(
        max_first_kernel_parts, static_cast<std::int64_t>((first.nbytes() + bytes - 1) / std::max<std::size_t>(bytes, 1)));
    std::int64_t per = (rows + parts - 1) / std::max<std::int64_t>(parts, 1);
    per = (per + first_kernel_row_multiple - 1) / first_kernel_row_multiple * first_kernel_row_multiple;
    if (per < rows) plan.first_kernel_part_rows = per;
  }
  for (std::size_t k = variables.size(); k-- > 0;) {
    const Tensor& value = variables[k].value();
    const std::int64_t rows = value.rank() > 0 ? value.shape()[0] : 1;
    const std::int64_t step = k == 0 && plan.first_kernel_part_rows > 0 ? plan.first_kernel_part_rows : rows;
    plan.unit_of[k] = plan.units.size();
    for (std::int64_t r = 0; r < rows || r == 0; r += std::max<std::int64_t>(step, 1)) {
      plan.units.push_back({k, r, std::min(rows, r + step)});
      if (rows == 0) break;
    }
  }
  std::size_t filled = 0;
  plan.bucket_of.resize(plan.units.size());
  for (std::size_t u = 0; u < plan.units.size(); ++u) {
    const GradientUnit& unit = plan.units[u];
    const Tensor& value = variables[unit.variable].value();
    const std::int64_t rows = value.rank() > 0 ? value.shape()[0] : 1;
    const std::size_t size = rows > 0 ? value.nbytes() / static_cast<std::size_t>(rows) *
                                            static_cast<std::size_t>(unit.row_end - unit.row_begin)
                                      : 0;
    if (plan.members.empty() || (filled > 0 && filled + size > bytes)) {
      plan.members.emplace_back();
      filled = 0;
    }
    plan.members.back().push_back(u);
    plan.bucket_of[u] = plan.members.size() - 1;
    filled += size;
  }
  return plan;
}

// Columns [begin, end) of a [rows, cols] tensor, contiguous.
Tensor columns(const Tensor& x, std::int64_t begin, std::int64_t end) {
  const std::int64_t rows = x.shape()[0], cols = x.shape()[1];
  const std::size_t element = dtype_size(x.dtype());
  Tensor out = Tensor::empty({rows, end - begin}, x.dtype(), x.device());
  const auto* in = static_cast<const char*>(x.raw_data());
  auto* to = static_cast<char*>(out.raw_mutable_data());
  const std::size_t width = static_cast<std::size_t>(end - begin) * element;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(to + static_cast<std::size_t>(r) * width,
                in + (static_cast<std::size_t>(r * cols + begin)) * element, width);
  }
  return out;
}

// The replica's gradients, all-reduced (SUM) bucket by bucket while the backward pass goes on;
// adds replica 0's waits to the optimizer's all-reduce times.
LossAndGradients bucketed_gradients(const Sequential& layers, const Loss& loss, Optimizer& optimizer,
                                    distribute::ReplicaContext& ctx, std::size_t bucket_bytes, const Tensor& features,
                                    const Tensor& targets, std::int64_t global_batch_size, Tensor* outputs_out,
                                    const CallContext& call, const char* op) {
  const std::vector<Variable> variables = layers.trainable_variables();
  // Row blocks only where the replica's products run on its own thread (they are then the same
  // bits as the whole product; an intra-op split is sized by the whole).
  // Only a first Dense layer's kernel is cut into row blocks (the blocks call dense_backward, so
  // only for a layer computing in float32).
  const auto* first_dense = dynamic_cast<const Dense*>(layers.layers().front().get());
  const bool may_split = troupe::detail::cpu::intra_op_threads() <= 1 && !features.is_gpu() &&
                         first_dense != nullptr && first_dense->compute_dtype() == DType::f32;
  const BucketPlan plan = plan_buckets(variables, bucket_bytes, may_split);
  distribute::detail::ReplicaCollectives& collectives = distribute::detail::collectives_of(ctx);
  const int local = ctx.local_replica_index();

  std::vector<Tensor> activations;
  const Tensor outputs = layers.forward(model_input(layers, features, op), activations, call);
  LossAndGradient lg = loss.fn(outputs, targets, global_batch_size);
  std::vector<Tensor> unit_values(plan.units.size());
  std::vector<std::size_t> ready(plan.members.size(), 0);
  std::vector<std::size_t> handles(plan.members.size(), 0);
  const auto produced = [&](std::size_t unit, Tensor gradient) {
    unit_values[unit] = std::move(gradient);
    const std::size_t b = plan.bucket_of[unit];
    if (++ready[b] < plan.members[b].size()) return;
    std::vector<Tensor> values;
    values.reserve(plan.members[b].size());
    for (std::size_t u : plan.members[b]) values.push_back(unit_values[u]);
    handles[b] = collectives.start_all_reduce(local, ReduceOp::sum, std::move(values));
  };
  // Sequential::backward's passes, each gradient handed on as soon as it exists.
  Tensor g = scaled_loss_gradient(optimizer, lg.gradient);
  for (std::size_t i = layers.layers().size(); i-- > 0;) {
    if (i == 0 && plan.first_kernel_part_rows > 0) {
      const Dense& dense = layers.layer<Dense>(0);
      const Tensor kernel = dense.kernel().value();
      const std::size_t first = plan.unit_of[0];
      for (std::size_t u = first; u < plan.units.size() && plan.units[u].variable == 0; ++u) {
        const GradientUnit& part = plan.units[u];
        DenseGradients d = dense_backward(columns(activations[0], part.row_begin, part.row_end),
                                          kernel.slice(part.row_begin, part.row_end), activations[1], g,
                                          dense.activation(), false);
        if (u == first) produced(plan.unit_of[1], std::move(d.bias));
        produced(u, std::move(d.kernel));
      }
      break;
    }
    CallContext at = call;
    at.layer = static_cast<std::int64_t>(i);
    LayerGradients d = layers.layers()[i]->backward(activations[i], activations[i + 1], g, at, i > 0);
    const std::size_t offset = layers.first_variable(i);
    for (std::size_t k = d.variables.size(); k-- > 0;) produced(plan.unit_of[offset + k], std::move(d.variables[k]));
    g = std::move(d.input);
  }

  // The wait that backward did not hide starts when every replica has started its last bucket,
  // i.e. finished its backward pass (waiting for a replica still differentiating is not it).
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point all_started{};
  std::vector<Tensor> gradients(variables.size());
  for (std::size_t b = 0; b < plan.members.size(); ++b) {
    std::vector<Tensor> sums = collectives.wait_all_reduce(local, handles[b], all_started);
    for (std::size_t i = 0; i < sums.size(); ++i) {
      const GradientUnit& unit = plan.units[plan.members[b][i]];
      const Tensor& value = variables[unit.variable].value();
      if (unit.row_begin == 0 && (value.rank() == 0 || unit.row_end == value.shape()[0])) {
        gradients[unit.variable] = std::move(sums[i]);
        continue;
      }
      // A row block of the first kernel: into the whole gradient, as each block arrives.
      Tensor& whole = gradients[unit.variable];
      if (whole.num_elements() == 0 && value.num_elements() > 0) whole = Tensor::empty(value.shape(), value.dtype(), sums[i].device());
      const std::size_t row_bytes = value.nbytes() / static_cast<std::size_t>(value.shape()[0]);
      std::memcpy(static_cast<char*>(whole.raw_mutable_data()) + static_cast<std::size_t>(unit.row_begin) * row_bytes,
                  sums[i].raw_data(), sums[i].nbytes());
    }
  }
  // A monitor's step profile sees the wait for the buckets as the step's gradient all-reduce, as
  // it saw the one all-reduce after backward.
  if (distribute::detail::StepProfile* profile = ctx.strategy().backend().step_profile()) {
    std::uint64_t bytes = 0;
    for (const Variable& v : variables) bytes += v.value().nbytes();
    profile->collective(local, distribute::detail::CollectiveKind::all_reduce,
                        std::chrono::duration_cast<std::chrono::nanoseconds>(start.time_since_epoch()).count(),
                        distribute::detail::profile_now_ns(), bytes);
  }
  if (ctx.replica_id_in_sync_group() == 0) {
    const auto end = std::chrono::steady_clock::now();
    const auto from = std::min(end, std::max(start, all_started));
    optimizer.record_all_reduce_time(std::chrono::duration_cast<std::chrono::nanoseconds>(end - start),
                                     std::chrono::duration_cast<std::chrono::nanoseconds>(end - from),
                                     collectives.peer_wait_within(from, end));
  }
  if (outputs_out != nullptr) *outputs_out = outputs;
  return {std::move(lg.loss), std::move(gradients)};
}

// The bucket size of a training step on this replica: gradient_bucket_bytes of the strategy
// inside strategy.run with several replicas, 0 (one all-reduce after backward) elsewhere.
std::size_t step_bucket_bytes(distribute::ReplicaContext*& ctx) {
  ctx = distribute::detail::installed_replica_context();
  return ctx != nullptr && ctx->num_replicas_in_sync() > 1 ? ctx->strategy().backend().gradient_bucket_bytes() : 0;
}

}  // namespace

Tensor Model::step_and_update(const data::Element& inputs, std::int64_t global_batch_size, Tensor* outputs,
                              const char* op) {
  check_compiled(op);
  check_element(inputs, op);
  // Layers that take a size from the data are built from the first batch (through merge_call
  // inside run), before their variables are listed below. Every replica reads built() before
  // the merge changes it, so all take the same branch.
  const bool building = !layers_.built();
  if (building) layers_.build_from(model_input(layers_, inputs[0], op).shape());
  // Inside strategy.run with several replicas: the gradients are all-reduced in buckets while
  // the backward pass goes on (RuntimeOptions::gradient_bucket_bytes), the same bits as one
  // all-reduce after it.
  // The step that builds the layers (and, in apply_gradients, their optimizer slots, another
  // merge_call) all-reduces after backward: a replica still leaving a merge_call while another
  // starts a bucket would be taken for one that skipped the bucket. The same bits either way.
  distribute::ReplicaContext* ctx = nullptr;
  const std::size_t bucket_bytes = building ? 0 : step_bucket_bytes(ctx);
  if (bucket_bytes > 0) {
    LossAndGradients r = bucketed_gradients(layers_, loss_, *optimizer_, *ctx, bucket_bytes, inputs[0], inputs[1],
                                            global_batch_size, outputs, training_context(layers_, optimizer_.get()), op);
    optimizer_->apply_gradients(zip(unscaled(*optimizer_, std::move(r.gradients)), trainable_variables()), std::nullopt);
    return r.loss;
  }
  const CallContext call = training_context(layers_, optimizer_.get());
  std::vector<Tensor> activations;
  const Tensor out = layers_.forward(model_input(layers_, inputs[0], op), activations, call);
  LossAndGradient lg = loss_.fn(out, inputs[1], global_batch_size);
  optimizer_->apply_gradients(
      zip(unscaled(*optimizer_, layers_.backward(activations, scaled_loss_gradient(*optimizer_, lg.gradient), nullptr, call)),
          trainable_variables()));
  if (outputs != nullptr) *outputs = out;
  return lg.loss;
}

Model::Model(Sequential layers) : layers_(std::move(layers)), strategy_(&distribute::get_strategy()) {
  if (layers_.layers().empty()) throw std::invalid_argument("Model: the Sequential has no layers");
  const std::size_t replicas = strategy_->extended().worker_devices().size();
  // A strategy that keeps its variables on one device (CentralStorageStrategy) gives each one.
  const std::size_t components = strategy_->backend().variable_device() != nullptr ? 1 : replicas;
  for (const auto& [name, variable] : layers_.variables()) {
    if (variable.components().size() != components) {
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
  // A model computing in float16 trains through dynamic loss scaling, as Keras's compile wraps
  // the optimizer under "mixed_float16".
  const bool float16 = std::any_of(layers_.layers().begin(), layers_.layers().end(),
                                   [](const std::shared_ptr<const Layer>& layer) {
                                     const auto* dense = dynamic_cast<const Dense*>(layer.get());
                                     return dense != nullptr && dense->compute_dtype() == DType::f16;
                                   });
  if (float16 && dynamic_cast<LossScaleOptimizer*>(optimizer.get()) == nullptr) {
    optimizer = std::make_shared<LossScaleOptimizer>(std::move(optimizer));
  }
  // Under ParameterServerStrategy the ps tasks keep the slots beside each shard (fit has them
  // apply the optimizer there): only the iteration count is made, on the ps tasks.
  const bool on_ps = dynamic_cast<distribute::ParameterServerStrategy*>(strategy_) != nullptr;
  optimizer->build(on_ps ? std::vector<std::pair<std::string, Variable>>{} : layers_.named_trainable_variables());
  optimizer_ = std::move(optimizer);
  loss_ = std::move(loss);
  metrics_.clear();
}

void Model::compile(std::shared_ptr<Optimizer> optimizer, Loss loss, std::vector<std::string> metrics) {
  for (const std::string& m : metrics) {
    if (m != "accuracy" && m != "sparse_categorical_accuracy") {
      throw std::invalid_argument("Model::compile: unknown metric '" + m +
                                  "' (expected \"accuracy\" or \"sparse_categorical_accuracy\")");
    }
  }
  compile(std::move(optimizer), std::move(loss));
  metrics_ = std::move(metrics);
}

void Model::build(Shape input_shape) {
  auto scope = cross_replica_scope(*strategy_, "build");
  layers_.build(std::move(input_shape));
  // A compiled model's optimizer gets the new variables' slots now, so that a checkpoint or a
  // backup restored before the first step finds them.
  if (optimizer_ && dynamic_cast<distribute::ParameterServerStrategy*>(strategy_) == nullptr) {
    optimizer_->build(layers_.named_trainable_variables());
  }
}

void Model::check_compiled(const char* op) const {
  if (!optimizer_) throw std::logic_error(std::string("Model::") + op + ": compile the model first");
}

LossAndGradients Model::compute_gradients(const Tensor& features, const Tensor& targets,
                                          std::int64_t global_batch_size) const {
  check_compiled("compute_gradients");
  const CallContext call = training_context(layers_, optimizer_.get());
  std::vector<Tensor> activations;
  const Tensor outputs = layers_.forward(model_input(layers_, features, "compute_gradients"), activations, call);
  LossAndGradient lg = loss_.fn(outputs, targets, global_batch_size);
  return {std::move(lg.loss), layers_.backward(activations, lg.gradient, nullptr, call)};
}

namespace detail {

LossAndGradients batch_gradients(const Model& model, const data::Element& batch, std::int64_t step, Tensor* outputs) {
  if (!model.optimizer()) throw std::logic_error("Model::fit: compile the model first");
  check_element(batch, "fit");
  CallContext call;
  call.training = true;
  call.step = step;
  std::vector<Tensor> activations;
  const Sequential& layers = model.layers();
  const Tensor out = layers.forward(model_input(layers, batch[0], "fit"), activations, call);
  LossAndGradient lg = model.loss().fn(out, batch[1], rows_of(batch));
  if (outputs != nullptr) *outputs = out;
  return {std::move(lg.loss), layers.backward(activations, lg.gradient, nullptr, call)};
}

}  // namespace detail

Tensor Model::train_step(const data::Element& inputs, std::int64_t global_batch_size) {
  return step_and_update(inputs, global_batch_size, nullptr, "train_step");
}

namespace {

// fit of a dataset that lives on the chief cannot run under ParameterServerStrategy.
void refuse_parameter_servers(const distribute::Strategy& strategy) {
  if (dynamic_cast<const distribute::ParameterServerStrategy*>(&strategy) != nullptr) {
    throw std::invalid_argument(
        "Model::fit: under ParameterServerStrategy each worker makes its own dataset: pass an "
        "nn::DatasetCreator naming a dataset function the workers registered (FunctionRegistry::add_dataset), "
        "with steps_per_epoch");
  }
}

}  // namespace

History Model::fit(const DatasetCreator& creator, int epochs, std::int64_t steps_per_epoch,
                   const FitOptions& options) {
  auto* strategy = dynamic_cast<distribute::ParameterServerStrategy*>(strategy_);
  if (strategy == nullptr) {
    throw std::invalid_argument("Model::fit: a DatasetCreator (dataset function " +
                                std::string("'") + creator.dataset_function +
                                "') trains under ParameterServerStrategy only: the model belongs to another strategy "
                                "(pass a Dataset or a DistributedDataset)");
  }
  detail::PsFitLoop loop(*this, *strategy, creator, epochs, steps_per_epoch, options);  // checks the arguments
  auto scope = cross_replica_scope(*strategy_, "fit");
  return loop.run();
}

History Model::fit(const distribute::DistributedDataset& dataset, int epochs, std::int64_t steps_per_epoch,
                   const FitOptions& options) {
  refuse_parameter_servers(*strategy_);
  detail::FitLoop loop(*this, dataset, epochs, steps_per_epoch, options);  // checks the arguments
  auto scope = cross_replica_scope(*strategy_, "fit");
  return loop.run();
}

History Model::fit(const data::Dataset& dataset, int epochs, std::int64_t steps_per_epoch,
                   const FitOptions& options) {
  refuse_parameter_servers(*strategy_);
  if (dataset.cardinality() == data::infinite_cardinality && steps_per_epoch < 0) {
    throw std::invalid_argument("Model::fit: the dataset is infinite (repeat()); give steps_per_epoch");
  }
  return fit(strategy_->experimental_distribute_dataset(dataset), epochs, steps_per_epoch, options);
}

namespace {

// Replica r's rows of a batch of `rows` split over `replicas`: contiguous shares in replica order
// whose sizes differ by one at most, so that gathered in replica order they are the batch again.
std::pair<std::int64_t, std::int64_t> share_of(std::int64_t rows, int replicas, int r) {
  return {rows * r / replicas, rows * (r + 1) / replicas};
}

// A 16-bit output (a mixed-precision model's) as float32, as its loss sees it.
Tensor as_output(const Tensor& out) {
  return out.dtype() == DType::f16 || out.dtype() == DType::bf16 ? out.cast(DType::f32) : out;
}

}  // namespace

// predict and evaluate split every batch over the strategy's replicas (over all workers), each
// replica computing its own rows with its own component of the weights, then gather (predict) or
// sum (evaluate) the results in one collective: every worker gets the same bits, each row
// counted once. A batch with fewer rows than replicas is computed whole by every worker.
Tensor Model::predict(const Tensor& x) const {
  auto scope = cross_replica_scope(*strategy_, "predict");
  const Tensor input = model_input(layers_, x, "predict");
  const int replicas = strategy_->num_replicas_in_sync();
  const std::int64_t rows = input.shape()[0];
  if (replicas == 1 || rows < replicas) return as_output(layers_.forward(input));
  layers_.build_from(input.shape());  // here, so that no replica function creates variables
  const auto gathered = strategy_->run([&] {
    distribute::ReplicaContext* ctx = distribute::get_replica_context();
    const auto [begin, end] = share_of(rows, replicas, ctx->replica_id_in_sync_group());
    const Tensor mine = input.slice(begin, end).with_device(ctx->device());
    return ctx->all_gather(as_output(layers_.forward(mine)), 0);
  });
  return strategy_->experimental_local_results(gathered).front().to(Device());
}

EvaluateResult Model::evaluate(const Tensor& features, const Tensor& labels) const {
  return evaluate(data::Dataset::from_tensors({features, labels}));
}

EvaluateResult Model::evaluate(const data::Dataset& batches) const {
  check_compiled("evaluate");
  auto scope = cross_replica_scope(*strategy_, "evaluate");
  const int replicas = strategy_->num_replicas_in_sync();
  double loss_sum = 0.0;
  double hits = 0.0;
  EvaluateResult result;
  for (const data::Element& e : batches) {
    check_element(e, "evaluate");
    const std::int64_t rows = rows_of(e);
    if (rows == 0) continue;
    const Tensor input = model_input(layers_, e[0], "evaluate");
    // Integer labels, or one-hot rows for categorical_crossentropy: accuracy has a meaning.
    const bool class_labels = e[1].dtype() == DType::i32 || e[1].dtype() == DType::i64 ||
                              loss_.name == "categorical_crossentropy";
    // The summed loss and hits of rows [begin, end), and the rows.
    const auto sums = [&](std::int64_t begin, std::int64_t end, const Device& device) {
      std::vector<double> out{0.0, 0.0};
      if (end == begin) return out;
      const Tensor outputs = as_output(layers_.forward(input.slice(begin, end).with_device(device)));
      const Tensor labels = e[1].rank() > 0 ? e[1].slice(begin, end).with_device(device) : e[1];
      const auto n = static_cast<double>(end - begin);
      out[0] = as_double(loss_.fn(outputs, labels, end - begin).loss) * n;
      if (class_labels) out[1] = nn::accuracy(outputs, labels) * n;
      return out;
    };
    std::vector<double> total;
    if (replicas == 1 || rows < replicas) {
      total = sums(0, rows, Device());
    } else {
      layers_.build_from(input.shape());
      const auto reduced = strategy_->run([&] {
        distribute::ReplicaContext* ctx = distribute::get_replica_context();
        const auto [begin, end] = share_of(rows, replicas, ctx->replica_id_in_sync_group());
        const std::vector<double> mine = sums(begin, end, ctx->device());
        return ctx->all_reduce(ReduceOp::sum, Tensor::from_vector(mine, {2}).with_device(ctx->device()));
      });
      total = strategy_->experimental_local_results(reduced).front().to(Device()).to_vector<double>();
    }
    loss_sum += total[0];
    hits += total[1];
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


namespace {

// 50890 -> "50,890", as Keras prints counts.
std::string with_thousands(std::int64_t n) {
  std::string digits = std::to_string(n);
  for (std::size_t at = digits.size(); at > 3; at -= 3) digits.insert(at - 3, ",");
  return digits;
}

}  // namespace

void Model::summary() const { summary(std::cout); }

// Keras's layout: 65 columns, the fields at columns 1, 29 and 55.
void Model::summary(std::ostream& out) const {
  constexpr std::size_t line_length = 65;
  constexpr std::array<std::size_t, 3> ends = {29, 55, 65};
  const auto row = [&](std::array<std::string, 3> left) {
    // A field too long for its column goes on in the same column of the next lines.
    while (!left[0].empty() || !left[1].empty() || !left[2].empty()) {
      std::string line;
      for (std::size_t col = 0; col < left.size(); ++col) {
        const std::size_t start = col > 0 ? ends[col - 1] : 0;
        const std::size_t gap = col + 1 < left.size() ? 2 : 0;  // two spaces before the next column
        // The last column (the counts) runs on rather than wrap ("0 (unbuilt)").
        const std::size_t room =
            col + 1 < left.size() ? ends[col] - start - gap - (col == 0 ? 1 : 0) : std::string::npos;
        if (col == 0) line += ' ';
        line += left[col].substr(0, room);
        left[col] = left[col].size() > room ? left[col].substr(room) : std::string();
        line.resize(std::max(line.size(), ends[col]), ' ');
      }
      line.erase(line.find_last_not_of(' ') + 1);
      out << line << "\n";
    }
  };
  out << "Model: \"sequential\"\n" << std::string(line_length, '_') << "\n";
  row({"Layer (type)", "Output Shape", "Param #"});
  out << std::string(line_length, '=') << "\n";
  std::int64_t total = 0;
  std::int64_t non_trainable = 0;
  const auto& layers = layers_.layers();
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const std::int64_t params = layers[i]->count_params();
    total += params;
    for (const auto& [name, variable] : layers[i]->non_trainable_weights()) {
      non_trainable += variable.value().num_elements();
    }
    row({layers_.layer_names()[i] + " (" + layers[i]->class_name() + ")", detail::keras_shape(layers_.output_shapes()[i]),
         std::to_string(params) + (layers[i]->built() ? "" : " (unbuilt)")});
    out << "\n";
  }
  out << std::string(line_length, '=') << "\n";
  out << "Total params: " << with_thousands(total) << "\n"
      << "Trainable params: " << with_thousands(total - non_trainable) << "\n"
      << "Non-trainable params: " << with_thousands(non_trainable) << "\n"
      << std::string(line_length, '_') << "\n";
}

}  // namespace troupe::nn
