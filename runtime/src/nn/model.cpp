#include "troupe/nn/model.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include <unistd.h>

#include "cpu/intra_op.hpp"
#include "distribute/collectives/collectives.hpp"
#include "distribute/strategies/context_state.hpp"
#include "distribute/strategies/step_profile.hpp"
#include "distribute/collectives/worker_group.hpp"
#include "troupe/distribute/context.hpp"
#include "troupe/distribute/strategy.hpp"
#include "troupe/nn/backup_and_restore.hpp"
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
                                    const char* op) {
  const std::vector<Variable> variables = layers.trainable_variables();
  // Row blocks only where the replica's products run on its own thread (they are then the same
  // bits as the whole product; an intra-op split is sized by the whole).
  const bool may_split = troupe::detail::cpu::intra_op_threads() <= 1 && !features.is_gpu();
  const BucketPlan plan = plan_buckets(variables, bucket_bytes, may_split);
  distribute::detail::ReplicaCollectives& collectives = distribute::detail::collectives_of(ctx);
  const int local = ctx.local_replica_index();

  std::vector<Tensor> activations;
  const Tensor outputs = layers.forward(model_input(features, op), activations);
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
  const std::vector<Dense>& dense = layers.layers();
  Tensor g = lg.gradient;
  for (std::size_t i = dense.size(); i-- > 0;) {
    if (i == 0 && plan.first_kernel_part_rows > 0) {
      const Tensor kernel = dense[0].kernel().value();
      const std::size_t first = plan.unit_of[0];
      for (std::size_t u = first; u < plan.units.size() && plan.units[u].variable == 0; ++u) {
        const GradientUnit& part = plan.units[u];
        DenseGradients d = dense_backward(columns(activations[0], part.row_begin, part.row_end),
                                          kernel.slice(part.row_begin, part.row_end), activations[1], g,
                                          dense[0].activation(), false);
        if (u == first) produced(plan.unit_of[1], std::move(d.bias));
        produced(u, std::move(d.kernel));
      }
      break;
    }
    DenseGradients d = dense[i].backward(activations[i], activations[i + 1], g, i > 0);
    produced(plan.unit_of[2 * i + 1], std::move(d.bias));
    produced(plan.unit_of[2 * i], std::move(d.kernel));
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
  // Inside strategy.run with several replicas: the gradients are all-reduced in buckets while
  // the backward pass goes on (RuntimeOptions::gradient_bucket_bytes), the same bits as one
  // all-reduce after it.
  distribute::ReplicaContext* ctx = nullptr;
  const std::size_t bucket_bytes = step_bucket_bytes(ctx);
  if (bucket_bytes > 0) {
    LossAndGradients r = bucketed_gradients(layers_, loss_, *optimizer_, *ctx, bucket_bytes, inputs[0], inputs[1],
                                            global_batch_size, outputs, op);
    optimizer_->apply_gradients(zip(r.gradients, trainable_variables()), std::nullopt);
    return r.loss;
  }
  std::vector<Tensor> activations;
  const Tensor out = layers_.forward(model_input(inputs[0], op), activations);
  LossAndGradient lg = loss_.fn(out, inputs[1], global_batch_size);
  optimizer_->apply_gradients(zip(layers_.backward(activations, lg.gradient), trainable_variables()));
  if (outputs != nullptr) *outputs = out;
  return lg.loss;
}

Model::Model(Sequential layers) : layers_(std::move(layers)), strategy_(&distribute::get_strategy()) {
  if (layers_.layers().empty()) throw std::invalid_argument("Model: the Sequential has no layers");
  const std::size_t replicas = strategy_->extended().worker_devices().size();
  // A strategy that keeps its variables on one device (CentralStorageStrategy) gives each one.
  const std::size_t components = strategy_->backend().variable_device() != nullptr ? 1 : replicas;
  for (const auto& [name, variable] : layers_.named_trainable_variables()) {
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
  optimizer->build(layers_.named_trainable_variables());
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
  return step_and_update(inputs, global_batch_size, nullptr, "train_step");
}

namespace {

bool finite(double x) { return std::isfinite(x); }

// What every worker agreed to do at a step boundary.
struct Agreed {
  bool stop = false;
  std::string stop_reason;
  std::uint32_t stop_code = 0;  // TrainingControl::reason_code of the stopper's reason
  bool checkpoint = false;
  std::optional<bool> pause;
  std::optional<double> learning_rate;
};

// A worker's requests as the five numbers of its row in the agreement table; under
// MultiWorkerMirroredStrategy the step's row also carries the worker's step-time parts of the
// step before (input, compute, all-reduce, whole step, in ms): worker_fields in all.
constexpr std::size_t request_fields = 5;
constexpr std::size_t part_fields = 4;
constexpr std::size_t worker_fields = request_fields + part_fields;
constexpr const char* part_names[part_fields] = {"input_ms", "compute_ms", "all_reduce_ms", "step_ms"};

void encode(const TrainingControl::Requests& r, double* row) {
  // A stop carries its reason's code (< 2^31, exact in a double), so that every worker can tell
  // why the cluster stopped.
  row[0] = r.stop ? 1.0 + static_cast<double>(TrainingControl::reason_code(r.stop_reason)) : 0.0;
  row[1] = r.checkpoint ? 1.0 : 0.0;
  row[2] = r.pause ? (*r.pause ? 1.0 : 2.0) : 0.0;
  row[3] = r.learning_rate ? 1.0 : 0.0;
  row[4] = r.learning_rate.value_or(0.0);
}

// The decision every worker reads from the same table of rows, one per worker in order: a
// request anywhere counts everywhere; for the pause state and the learning rate the first row
// that asked wins. `mine` gives this worker's own stop reason; rows are `stride` numbers apart.
Agreed decide(const double* table, int workers, const TrainingControl::Requests& mine, std::size_t stride) {
  Agreed out;
  int stopper = -1;
  for (int w = 0; w < workers; ++w) {
    const double* r = table + static_cast<std::size_t>(w) * stride;
    if (r[0] != 0 && stopper < 0) {
      stopper = w;
      out.stop_code = static_cast<std::uint32_t>(r[0] - 1.0);
    }
    if (r[1] != 0) out.checkpoint = true;
    if (r[2] != 0 && !out.pause) out.pause = r[2] == 1.0;
    if (r[3] != 0 && !out.learning_rate) out.learning_rate = r[4];
  }
  if (stopper >= 0) {
    out.stop = true;
    out.stop_reason = mine.stop ? mine.stop_reason : "stop requested by worker " + std::to_string(stopper);
  }
  return out;
}

Agreed local(TrainingControl::Requests mine) {
  Agreed out;
  out.stop = mine.stop;
  out.stop_reason = std::move(mine.stop_reason);
  out.stop_code = TrainingControl::reason_code(out.stop_reason);
  out.checkpoint = mine.checkpoint;
  out.pause = mine.pause;
  out.learning_rate = mine.learning_rate;
  return out;
}

// Takes this worker's pending requests and agrees on them with every other worker in a
// collective of its own (while training is paused no step carries them): one row per worker,
// concatenated in rank order. One worker needs no collective.
Agreed agree(TrainingControl& control, distribute::detail::WorkerGroup& group) {
  TrainingControl::Requests mine = control.take();
  if (group.size() == 1) return local(std::move(mine));
  std::vector<double> row(request_fields);
  encode(mine, row.data());
  const Tensor table = group.concat(Tensor::from_vector(row, {1, static_cast<std::int64_t>(request_fields)}), 0);
  return decide(table.to_vector<double>().data(), group.size(), mine, request_fields);
}

std::string format_ms(double ms) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(ms >= 10 ? 0 : ms >= 1 ? 1 : 3) << ms << "ms";
  return s.str();
}

std::string format_seconds(double seconds) {
  std::ostringstream s;
  if (seconds >= 3600) {
    s << static_cast<long long>(seconds) / 3600 << ":" << std::setw(2) << std::setfill('0')
      << (static_cast<long long>(seconds) / 60) % 60 << ":" << std::setw(2) << static_cast<long long>(seconds) % 60;
  } else if (seconds >= 60) {
    s << static_cast<long long>(seconds) / 60 << ":" << std::setw(2) << std::setfill('0')
      << static_cast<long long>(seconds) % 60;
  } else {
    s << static_cast<long long>(seconds + 0.5) << "s";
  }
  return s.str();
}

// Keras's progress bar: on a terminal one line redrawn in place at most every 50 ms with the
// step, a bar, the ETA, ms/step and the running means of the loss and metrics; at the end of an
// epoch (and elsewhere, as the only output) the epoch's line.
class ProgbarLogger : public Callback {
 public:
  ProgbarLogger(std::ostream& out, bool terminal, int verbose)
      : out_(out), terminal_(terminal && verbose == 1) {}

  void on_epoch_begin(int epoch, Logs&) override {
    epoch_ = epoch;
    steps_ = 0;
    sums_.clear();
    start_ = last_draw_ = std::chrono::steady_clock::now();
    drawn_ = false;
  }

  void on_train_batch_end(std::int64_t, Logs& logs) override {
    ++steps_;
    for (const std::string& name : params().metrics) {
      auto it = logs.find(name);
      if (it != logs.end()) sums_[name] += it->second;
    }
    if (!terminal_) return;
    const auto now = std::chrono::steady_clock::now();
    const bool last = params().steps > 0 && steps_ >= params().steps;
    if (!last && now - last_draw_ < std::chrono::milliseconds(50) && drawn_) return;
    last_draw_ = now;
    drawn_ = true;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double per_step = elapsed / static_cast<double>(steps_);
    std::ostringstream line;
    line << "\rEpoch " << epoch_ + 1 << "/" << params().epochs << " ";
    if (params().steps > 0) {
      const int width = 30;
      const std::int64_t total = params().steps;
      const int filled = static_cast<int>(width * std::min<std::int64_t>(steps_, total) / total);
      line << std::setw(static_cast<int>(std::to_string(total).size())) << steps_ << "/" << total << " [";
      for (int i = 0; i < width; ++i) line << (i < filled ? '=' : i == filled ? '>' : '.');
      line << "] - ETA: " << format_seconds(per_step * static_cast<double>(std::max<std::int64_t>(0, total - steps_)));
    } else {
      line << steps_ << "/Unknown - " << format_seconds(elapsed);
    }
    line << " - " << format_ms(per_step * 1e3) << "/step";
    for (const std::string& name : params().metrics) {
      auto it = sums_.find(name);
      if (it == sums_.end()) continue;
      line << " - " << name << ": " << std::setprecision(4) << std::fixed << it->second / static_cast<double>(steps_);
    }
    line << "\x1b[K";
    out_ << line.str() << std::flush;
  }

  void on_epoch_end(int epoch, Logs& logs) override { finish(epoch, logs); }

  // An epoch cut short by a stop before its end (on_epoch_end is not called after a non-finite
  // loss) still ends its line on a terminal.
  void on_train_end(Logs&) override {
    if (terminal_ && drawn_) out_ << "\n" << std::flush;
    drawn_ = false;
  }

 private:
  void finish(int epoch, const Logs& logs) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::ostringstream line;
    if (terminal_) line << "\r\x1b[K";
    line << "Epoch " << epoch + 1 << "/" << params().epochs << ": " << steps_ << (steps_ == 1 ? " step" : " steps");
    const auto loss = logs.find("loss");
    if (loss != logs.end()) line << ", loss " << std::setprecision(6) << loss->second;
    // Keras's order: the loss and metrics, then the same with "val_".
    for (const char* prefix : {"", "val_"}) {
      for (const std::string& metric : params().metrics) {
        const std::string name = prefix + metric;
        const auto it = logs.find(name);
        if (name == "loss" || it == logs.end()) continue;
        line << ", " << name << " " << std::setprecision(4) << std::fixed << it->second << std::defaultfloat;
      }
    }
    const auto rate = logs.find("samples_per_second");
    if (rate != logs.end()) line << ", " << std::fixed << std::setprecision(0) << rate->second << " samples/s";
    line << ", ";
    // Epochs of a small set take microseconds: three significant digits in ms, not "0.000 s".
    if (seconds >= 0.1) {
      line << std::fixed << std::setprecision(3) << seconds << " s";
    } else {
      line << std::defaultfloat << std::setprecision(3) << seconds * 1e3 << " ms";
    }
    if (steps_ > 0) line << ", " << format_ms(seconds * 1e3 / static_cast<double>(steps_)) << "/step";
    out_ << line.str() << "\n" << std::flush;
    drawn_ = false;
  }

  std::ostream& out_;
  bool terminal_;
  int epoch_ = 0;
  std::int64_t steps_ = 0;
  std::map<std::string, double> sums_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool drawn_ = false;
};

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

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
  for (std::size_t i = 0; i < options.callbacks.size(); ++i) {
    if (!options.callbacks[i]) throw std::invalid_argument("Model::fit: callback " + std::to_string(i) + " is null");
  }
  auto scope = cross_replica_scope(*strategy_, "fit");
  distribute::Strategy& strategy = *strategy_;
  distribute::detail::WorkerGroup& group = strategy.backend().workers();
  std::ostream& out = options.out != nullptr ? *options.out : std::cout;
  const std::int64_t workers = group.size();
  const auto all_reduce_before = optimizer_->all_reduce_time();
  TrainingControl& control = *control_;
  control.reset();

  FitParams params;
  params.epochs = epochs;
  params.steps = steps_per_epoch;
  params.verbose = options.verbose;
  params.worker = group.rank();
  params.workers = group.size();
  params.metrics.push_back("loss");
  for (const std::string& m : metrics_) params.metrics.push_back(m);

  std::vector<std::shared_ptr<Callback>> callbacks = options.callbacks;
  const bool printing = options.verbose > 0 && (group.rank() == 0 || options.print_on_all_workers);
  if (printing) {
    const bool terminal = options.terminal ? *options.terminal : (options.out == nullptr && isatty(STDOUT_FILENO) == 1);
    callbacks.push_back(std::make_shared<ProgbarLogger>(out, terminal, options.verbose));
  }
  for (const auto& c : callbacks) c->set_model(*this, params);

  History history;
  Logs train_logs;
  for (const auto& c : callbacks) c->on_train_begin(train_logs);
  std::optional<distribute::DistributedIterator> iterator;
  std::int64_t taken = 0;  // elements taken from the current iterator
  TrainingPosition at;     // where this call starts
  if (steps_per_epoch > 0) {
    at.step = options.initial_step;
    at.epoch = options.initial_step / steps_per_epoch;
    at.step_in_epoch = options.initial_step % steps_per_epoch;
  }
  BackupAndRestore* backup = options.backup_and_restore;
  if (backup != nullptr) {
    backup->track(variables());
    at = backup->restore();
  }
  std::int64_t step = at.step;
  const int first_epoch = static_cast<int>(at.epoch);
  control.set_position(step, first_epoch);
  // Resumed at or past the end of the epochs asked for: nothing to train, and the backup stays
  // (a run asked for more epochs takes it up).
  const bool nothing_to_do = first_epoch >= epochs && epochs > 0;
  if (nothing_to_do && printing) {
    out << "Nothing left to train: the run stands at step " << step
        << (at.step_in_epoch > 0 ? ", in epoch " + std::to_string(first_epoch + 1)
                                 : ", after epoch " + std::to_string(first_epoch))
        << ", and " << epochs << (epochs == 1 ? " epoch was" : " epochs were") << " asked for"
        << (backup != nullptr ? "; the backup in " + backup->backup_dir() + " is kept" : std::string()) << "\n"
        << std::flush;
  }
  BackupAndRestore::replay_passes(dataset, at.input_passes);
  std::int64_t passes = at.input_passes;  // iterators made, the current one included
  bool stopped_mid_epoch = false;          // at a step boundary (a signal, a request): the backup stays
  const bool with_metrics = !metrics_.empty();
  const int local_replicas = static_cast<int>(strategy.extended().worker_devices().size());
  bool stopped = false;
  Logs last_batch_logs;
  std::array<double, part_fields> previous_parts{};  // this worker's step-time parts of the step before
  // The names of the per-replica and per-worker logs, made once rather than every step.
  std::vector<std::string> replica_loss_keys;
  for (int g = 0; g < static_cast<int>(workers) * local_replicas; ++g) {
    replica_loss_keys.push_back("loss/replica_" + std::to_string(g));
  }
  std::vector<std::array<std::string, part_fields>> worker_part_keys(static_cast<std::size_t>(workers));
  for (std::size_t w = 0; w < worker_part_keys.size(); ++w) {
    for (std::size_t p = 0; p < part_fields; ++p) {
      worker_part_keys[w][p] = "worker_" + std::to_string(w) + "/time/" + part_names[p];
    }
  }

  // Applies, at this step boundary, what every worker agreed on (carried by the step's own
  // reduction under MultiWorkerMirroredStrategy, this worker's requests otherwise) and a
  // callback's stop_training; holds training while paused.
  auto boundary = [&](Logs& logs, std::optional<Agreed> carried) {
    Agreed agreed = carried ? std::move(*carried) : local(control.take());
    if (auto reason = control.take_immediate_stop()) {
      if (!agreed.stop) {
        agreed.stop_reason = *reason;
        agreed.stop_code = TrainingControl::reason_code(*reason);
      }
      agreed.stop = true;
    }
    if (agreed.stop) stopped_mid_epoch = true;
    for (bool first = true;; first = false) {
      if (agreed.learning_rate) {
        optimizer_->set_learning_rate(static_cast<float>(*agreed.learning_rate));
        for (const auto& c : callbacks) c->on_learning_rate(step, optimizer_->learning_rate());
      }
      if (agreed.checkpoint && history.non_finite_step == 0) {
        for (const auto& c : callbacks) c->on_checkpoint(step, logs);
      }
      if (agreed.stop) {
        if (!stopped) {
          stopped = true;
          history.stop_reason = agreed.stop_reason;
          history.stopped_at_step = step;
          control.set_stopped_for(agreed.stop_code);
        }
        break;
      }
      if (first && agreed.pause && *agreed.pause) {
        control.set_paused(true);
        for (const auto& c : callbacks) c->on_pause(step);
      } else if (!first && agreed.pause && !*agreed.pause) {
        break;
      }
      if (!control.paused()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      agreed = agree(control, group);
    }
    if (control.paused()) {
      control.set_paused(false);
      if (!stopped) {
        for (const auto& c : callbacks) c->on_resume(step);
      }
    }
  };

  for (int epoch = first_epoch; epoch < epochs && !stopped; ++epoch) {
    control.set_position(step, epoch);
    if (steps_per_epoch < 0 || !iterator) {
      iterator.emplace(dataset.make_iterator());
      ++passes;
      taken = epoch == first_epoch ? BackupAndRestore::skip(*iterator, at.iterator_position) : 0;
    }
    Logs epoch_logs;
    for (const auto& c : callbacks) c->on_epoch_begin(epoch, epoch_logs);
    const auto start = std::chrono::steady_clock::now();
    double loss_sum = 0.0;
    double hits_sum = 0.0;
    std::int64_t steps = 0;
    std::int64_t samples = 0;
    const std::int64_t first_k = epoch == first_epoch ? at.step_in_epoch : 0;
    std::int64_t k = first_k;
    for (; (steps_per_epoch < 0 || k < steps_per_epoch) && !stopped; ++k) {
      Logs logs;
      for (const auto& c : callbacks) c->on_train_batch_begin(k, logs);
      const auto t0 = std::chrono::steady_clock::now();
      const auto all_reduce_at_start = optimizer_->all_reduce_time();
      auto batch = iterator->get_next_as_optional();
      if (!batch) {
        if (steps_per_epoch < 0) break;
        iterator.emplace(dataset.make_iterator());  // a finite dataset with steps_per_epoch: start again
        ++passes;
        taken = 0;
        batch = iterator->get_next_as_optional();
        if (!batch) throw std::invalid_argument("Model::fit: the dataset has no elements");
      }
      ++taken;
      std::vector<std::int64_t> replica_rows;
      std::int64_t rows = 0;
      for (const data::Element& e : batch->values()) {
        check_element(e, "fit");
        replica_rows.push_back(rows_of(e));
        rows += rows_of(e);
      }
      // Input whose end is agreed across workers knows the step's rows over every worker (one
      // worker may have fewer, or none); elsewhere every worker's replicas get batches of one
      // size except at the very end of the data.
      const std::int64_t global_batch = iterator->last_global_rows().value_or(rows * workers);
      if (global_batch == 0) continue;
      const auto t1 = std::chrono::steady_clock::now();
      // With metrics or several workers each replica returns float64 {its share of the loss, its
      // correct predictions, then one row per worker, then {mean loss, 1} per replica}: the first
      // replica of each worker fills its worker's row with the requests pending now and the
      // worker's step-time parts of the step before, and every replica its own loss, so the
      // step's one reduction also agrees on the requests and shows every worker's timings and
      // every replica's loss on every worker (no collective of its own).
      const bool wide = with_metrics || workers > 1;
      TrainingControl::Requests carried;
      std::vector<double> carried_row(worker_fields);
      if (workers > 1) {
        carried = control.take();
        encode(carried, carried_row.data());
        std::copy(previous_parts.begin(), previous_parts.end(), carried_row.begin() + request_fields);
      }
      const int worker_count = static_cast<int>(workers);
      auto results = strategy.run(
          [this, global_batch, with_metrics, wide, worker_count, local_replicas, &carried_row](const data::Element& e) {
            if (!wide) return train_step(e, global_batch);
            // The same step as train_step (gradient buckets included), keeping the outputs.
            Tensor outputs;
            const Tensor step_loss = step_and_update(e, global_batch, &outputs, "fit");
            const std::size_t rows_at = 2 + worker_fields * static_cast<std::size_t>(worker_count);
            const std::size_t replicas_in_sync = static_cast<std::size_t>(worker_count * local_replicas);
            std::vector<double> v(worker_count > 1 ? rows_at + 2 * replicas_in_sync : 2, 0.0);
            v[0] = as_double(step_loss);
            if (with_metrics && rows_of(e) > 0) v[1] = nn::accuracy(outputs, e[1]) * static_cast<double>(rows_of(e));
            const int id = distribute::get_replica_context()->replica_id_in_sync_group();
            if (worker_count > 1) {
              if (id % local_replicas == 0) {
                const std::size_t at = 2 + worker_fields * static_cast<std::size_t>(id / local_replicas);
                std::copy(carried_row.begin(), carried_row.end(), v.begin() + static_cast<std::ptrdiff_t>(at));
              }
              if (rows_of(e) > 0) {
                const std::size_t at = rows_at + 2 * static_cast<std::size_t>(id);
                v[at] = v[0] * static_cast<double>(global_batch) / static_cast<double>(rows_of(e));
                v[at + 1] = 1.0;
              }
            }
            // On the replica's device, where the strategy's cross-device op expects its values.
            return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}).to(step_loss.device());
          },
          *batch);
      const Tensor reduced = strategy.reduce(ReduceOp::sum, results, std::nullopt);
      const auto t2 = std::chrono::steady_clock::now();
      double loss = 0.0;
      double hits = 0.0;
      std::optional<Agreed> agreed;
      std::vector<double> v;  // the reduced table, under MultiWorkerMirroredStrategy
      if (wide) {
        v = reduced.to_vector<double>();
        loss = v[0];
        hits = v[1];
        if (workers > 1) agreed = decide(v.data() + 2, worker_count, carried, worker_fields);
      } else {
        loss = as_double(reduced);
      }
      loss_sum += loss;
      hits_sum += hits;
      ++steps;
      samples += global_batch;
      ++step;
      control.set_position(step, epoch);
      if (!finite(loss) && history.non_finite_step == 0) history.non_finite_step = step;

      const double all_reduce_s =
          std::chrono::duration<double>(optimizer_->all_reduce_time() - all_reduce_at_start).count();
      const double step_s = seconds_between(t0, t2);
      logs["loss"] = loss;
      for (const std::string& m : metrics_) logs[m] = hits / static_cast<double>(global_batch);
      logs["learning_rate"] = optimizer_->learning_rate();
      logs["samples_per_second"] = step_s > 0 ? static_cast<double>(global_batch) / step_s : 0.0;
      logs["time/input_ms"] = seconds_between(t0, t1) * 1e3;
      logs["time/all_reduce_ms"] = all_reduce_s * 1e3;
      logs["time/compute_ms"] = std::max(0.0, seconds_between(t1, t2) - all_reduce_s) * 1e3;
      logs["time/step_ms"] = step_s * 1e3;
      if (workers > 1) {
        // Every replica's loss of this step and every worker's parts of the step before, as the
        // reduction carried them.
        const std::size_t rows_at = 2 + worker_fields * static_cast<std::size_t>(worker_count);
        for (int g = 0; g < worker_count * local_replicas; ++g) {
          const std::size_t at = rows_at + 2 * static_cast<std::size_t>(g);
          if (v[at + 1] != 0) logs[replica_loss_keys[static_cast<std::size_t>(g)]] = v[at];
        }
        for (int w = 0; w < worker_count; ++w) {
          const double* parts = v.data() + 2 + worker_fields * static_cast<std::size_t>(w) + request_fields;
          if (parts[part_fields - 1] <= 0) continue;  // the first step: no step before
          for (std::size_t p = 0; p < part_fields; ++p) {
            logs[worker_part_keys[static_cast<std::size_t>(w)][p]] = parts[p];
          }
        }
        previous_parts = {logs["time/input_ms"], logs["time/compute_ms"], logs["time/all_reduce_ms"], step_s * 1e3};
      } else {
        const auto locals = strategy.experimental_local_results(results);
        for (std::size_t r = 0; r < locals.size() && r < replica_rows.size(); ++r) {
          if (replica_rows[r] == 0) continue;
          const double share = wide ? locals[r].to_vector<double>()[0] : as_double(locals[r]);
          logs[replica_loss_keys[static_cast<std::size_t>(group.rank() * local_replicas) + r]] =
              share * static_cast<double>(global_batch) / static_cast<double>(replica_rows[r]);
        }
      }
      if (backup != nullptr && history.non_finite_step == 0) {  // first: on_step_end may save through it
        // The last step of an epoch of known length stands at the start of the next one.
        const bool epoch_done = steps_per_epoch > 0 && k + 1 == steps_per_epoch;
        backup->on_step_end(epoch_done ? TrainingPosition{step, epoch + 1, 0, taken, passes - 1}
                                       : TrainingPosition{step, epoch, k + 1, taken, passes - 1});
      }
      if (options.on_step_end) options.on_step_end(step, loss);
      for (const auto& c : callbacks) c->on_train_batch_end(k, logs);
      boundary(logs, std::move(agreed));
      last_batch_logs = std::move(logs);
    }
    // A stop at a step boundary before the epoch's last step cuts the epoch: the run stands
    // inside it, where the next run takes it up (a pass of unknown length may have had no batch
    // left: the next run finds that out and goes on with the next epoch).
    const bool stopped_at_step = stopped;
    const bool cut = stopped_at_step && (steps_per_epoch < 0 || k < steps_per_epoch);
    // The epoch's time excludes its backup (after the line below). A stop at a step boundary is
    // backed up at that step, whatever save_freq says, so that the next run resumes after it.
    const auto end_of_epoch = [&] {
      if (backup == nullptr || history.non_finite_step != 0) return;  // never a backup of non-finite weights
      const TrainingPosition at_end = cut                  ? TrainingPosition{step, epoch, k, taken, passes - 1}
                                      : steps_per_epoch > 0 ? TrainingPosition{step, epoch + 1, 0, taken, passes - 1}
                                                            : TrainingPosition{step, epoch + 1, 0, 0, passes};
      if (stopped_at_step) {
        backup->save(at_end);
      } else {
        backup->on_epoch_end(at_end);
      }
    };
    if (steps == 0 && first_k > 0) {  // resumed after the last batch of this epoch
      end_of_epoch();
      continue;
    }
    if (steps == 0) {
      throw std::invalid_argument("Model::fit: epoch " + std::to_string(epoch + 1) + " got no batch from the dataset");
    }
    const double seconds = seconds_between(start, std::chrono::steady_clock::now());
    const double epoch_loss = loss_sum / static_cast<double>(steps);
    const double rate = seconds > 0 ? static_cast<double>(samples) / seconds : 0.0;
    history.loss.push_back(epoch_loss);
    history.seconds.push_back(seconds);
    history.samples_per_second.push_back(rate);
    history.steps += steps;
    history.samples += samples;
    epoch_logs["loss"] = epoch_loss;
    for (const std::string& m : metrics_) epoch_logs[m] = hits_sum / static_cast<double>(samples);
    const bool poisoned = history.non_finite_step != 0 && stopped;
    if (options.validation_data && !poisoned) {
      const EvaluateResult v = evaluate(*options.validation_data);
      epoch_logs["val_loss"] = v.loss;
      for (const std::string& m : metrics_) epoch_logs["val_" + m] = v.accuracy;
    }
    for (const auto& [name, value] : epoch_logs) history.history[name].push_back(value);
    epoch_logs["learning_rate"] = optimizer_->learning_rate();
    epoch_logs["samples_per_second"] = rate;
    if (!poisoned) {
      for (const auto& c : callbacks) c->on_epoch_end(epoch, epoch_logs);
      // Only a callback's own stop_training acts here: requests wait for the next step.
      if (auto reason = control.take_immediate_stop(); reason && !stopped) {
        stopped = true;
        history.stop_reason = *reason;
        history.stopped_at_step = step;
      }
    }
    end_of_epoch();
  }
  for (const auto& c : callbacks) c->on_train_end(last_batch_logs);
  history.all_reduce_seconds = std::chrono::duration<double>(optimizer_->all_reduce_time() - all_reduce_before).count();
  // A run that ended, or that a callback stopped at an epoch's end (EarlyStopping), has no more
  // use for its backup; one stopped at a step boundary (a signal, a request, the dashboard)
  // resumes from it.
  if (backup != nullptr && !stopped_mid_epoch && !nothing_to_do) backup->on_train_end();
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
