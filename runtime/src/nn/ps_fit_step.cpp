// The worker's side of Model::fit under ParameterServerStrategy: troupe's built-in function
// "troupe.fit.train_step" (ps_fit.hpp has the walkthrough), and the optimizers the ps tasks apply
// in place of the model's.

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/element_checks.hpp"
#include "nn/model_config.hpp"
#include "nn/ps_fit.hpp"
#include "troupe/base/quote.hpp"
#include "troupe/distribute/remote_function.hpp"
#include "troupe/errors.hpp"
#include "troupe/nn/loss_scale_optimizer.hpp"
#include "troupe/nn/ops.hpp"

namespace troupe::nn::detail {

distribute::ShardOptimizer shard_optimizer_of(const Optimizer& optimizer) {
  using distribute::ShardOptimizer;
  if (const auto* w = dynamic_cast<const AdamW*>(&optimizer)) {
    return ShardOptimizer::adamw(w->learning_rate(), w->weight_decay(), w->beta_1(), w->beta_2(), w->epsilon());
  }
  if (const auto* a = dynamic_cast<const Adam*>(&optimizer)) {
    return ShardOptimizer::adam(a->learning_rate(), a->beta_1(), a->beta_2(), a->epsilon());
  }
  if (const auto* s = dynamic_cast<const SGD*>(&optimizer)) {
    return ShardOptimizer::sgd(s->learning_rate(), s->momentum(), s->nesterov());
  }
  const bool scaled = dynamic_cast<const LossScaleOptimizer*>(&optimizer) != nullptr;
  throw std::invalid_argument(
      "Model::fit under ParameterServerStrategy: the ps tasks apply SGD (with or without momentum, nesterov), "
      "Adam and AdamW to their shards; the model's optimizer is " +
      (scaled ? std::string("a LossScaleOptimizer (a float16 model: train it in float32 under this strategy)")
              : base::quoted(optimizer.name())) +
      ": compile the model with one of those");
}

}  // namespace troupe::nn::detail

namespace troupe::distribute::detail {

using json = nlohmann::json;

Tensor text_tensor(const std::string& text) {
  std::vector<std::int32_t> words(1 + (text.size() + 3) / 4, 0);
  words[0] = static_cast<std::int32_t>(text.size());
  std::memcpy(words.data() + 1, text.data(), text.size());
  return Tensor::from_vector(words);
}

std::string tensor_text(const Tensor& t) {
  if (t.dtype() != DType::i32 || t.rank() != 1 || t.shape()[0] < 1) {
    throw std::invalid_argument("troupe.fit.train_step: argument 1 is not a training config (expected int32 words)");
  }
  const std::vector<std::int32_t> words = t.to_vector<std::int32_t>();
  const auto n = static_cast<std::size_t>(words[0]);
  if (words[0] < 0 || (n + 3) / 4 != words.size() - 1) {
    throw std::invalid_argument("troupe.fit.train_step: the training config claims " + std::to_string(words[0]) +
                                " bytes in " + std::to_string(words.size() - 1) + " words");
  }
  std::string out(n, '\0');
  std::memcpy(out.data(), words.data() + 1, n);
  return out;
}

namespace {

ShardOptimizer optimizer_from_json(const json& o) {
  const std::string kind = o.at("kind").get<std::string>();
  const auto f = [&](const char* k) { return o.at(k).get<float>(); };
  // The learning rate comes with each closure; 1 stands in until then (any valid rate).
  if (kind == "sgd") return ShardOptimizer::sgd(1.0f, f("momentum"), o.at("nesterov").get<bool>());
  if (kind == "adam") return ShardOptimizer::adam(1.0f, f("beta_1"), f("beta_2"), f("epsilon"));
  if (kind == "adamw") return ShardOptimizer::adamw(1.0f, f("weight_decay"), f("beta_1"), f("beta_2"), f("epsilon"));
  throw std::invalid_argument("troupe.fit.train_step: optimizer kind " + base::quoted(kind) + " is unknown");
}

// A model as a worker trains it: its local copy, the ps names of its trainable variables in the
// same order, and the optimizer the ps tasks apply.
struct WorkerModel {
  std::optional<nn::Model> model;
  std::vector<std::string> names;
  std::vector<Variable> locals;
  ShardOptimizer optimizer;
  bool sparse_first = false;  // the first layer is an Embedding: its table's gradient goes as rows
};

std::shared_ptr<WorkerModel> build_worker_model(const std::string& text, const std::string& task) {
  const json spec = json::parse(text);
  auto out = std::make_shared<WorkerModel>();
  out->model.emplace(nn::detail::model_from_training_config(spec.at("training").get<std::string>(),
                                                            std::make_shared<nn::SGD>(),
                                                            "the chief's model (rebuilt on " + task + ")"));
  out->names = spec.at("variables").get<std::vector<std::string>>();
  out->locals = out->model->trainable_variables();
  if (out->names.size() != out->locals.size()) {
    throw std::invalid_argument("troupe.fit.train_step: the chief named " + std::to_string(out->names.size()) +
                                " variables, the model rebuilt on " + task + " has " +
                                std::to_string(out->locals.size()));
  }
  out->optimizer = optimizer_from_json(spec.at("optimizer"));
  out->sparse_first = spec.at("sparse_first").get<bool>();
  return out;
}

// The unique ids of a batch of integer ids, in order of first appearance, and their rows of a
// dense [rows, ...] gradient.
std::pair<std::vector<std::int64_t>, Tensor> touched_rows(const Tensor& ids_tensor, const Tensor& gradient) {
  const Tensor flat = ids_tensor.reshape({ids_tensor.num_elements()}).cast(DType::i64);
  std::vector<std::int64_t> unique;
  std::map<std::int64_t, bool> seen;
  for (std::int64_t id : flat.to_vector<std::int64_t>()) {
    if (seen.emplace(id, true).second) unique.push_back(id);
  }
  Shape shape = gradient.shape();
  shape[0] = static_cast<std::int64_t>(unique.size());
  const Tensor g = gradient.to(Device());
  Tensor rows = Tensor::empty(shape, g.dtype());
  const std::size_t row_bytes = g.shape()[0] > 0 ? g.nbytes() / static_cast<std::size_t>(g.shape()[0]) : 0;
  for (std::size_t i = 0; i < unique.size(); ++i) {
    if (unique[i] < 0 || unique[i] >= g.shape()[0]) {
      throw std::out_of_range("Model::fit: embedding id " + std::to_string(unique[i]) + " outside the table's " +
                              std::to_string(g.shape()[0]) + " rows");
    }
    std::memcpy(static_cast<char*>(rows.raw_mutable_data()) + i * row_bytes,
                static_cast<const char*>(g.raw_data()) + static_cast<std::size_t>(unique[i]) * row_bytes, row_bytes);
  }
  return {std::move(unique), std::move(rows)};
}

// The closure: `steps` steps of the model on the worker's next batches.
std::vector<Tensor> train_steps(FunctionContext& ctx, WorkerModel& m) {
  const std::vector<double> params = ctx.arg(2).to_vector<double>();
  if (params.size() != 3 || params[0] < 1) {
    throw std::invalid_argument("troupe.fit.train_step: argument 2 is not {steps, learning rate, first step}");
  }
  const auto steps = static_cast<std::int64_t>(params[0]);
  ShardOptimizer optimizer = m.optimizer;
  optimizer.learning_rate = static_cast<float>(params[1]);
  const auto first_step = static_cast<std::int64_t>(params[2]);
  std::vector<double> losses, rows, hits;
  const bool with_metrics = !m.model->metrics().empty();
  for (std::int64_t s = 0; s < steps; ++s) {
    data::Element batch;
    try {
      batch = ctx.next(0);
    } catch (const OutOfRange&) {
      throw std::invalid_argument("the dataset of fit's DatasetCreator ended on " + ctx.task() + " (after " +
                                  std::to_string(s) + " of this closure's " + std::to_string(steps) +
                                  " batches): under ParameterServerStrategy fit takes steps_per_epoch batches per "
                                  "epoch from each worker's iterator, continued across epochs; repeat() the dataset");
    }
    nn::detail::check_element(batch, "Model::fit");
    const std::vector<Tensor> values = ctx.read_variables(m.names);  // every shard in flight at once
    for (std::size_t i = 0; i < values.size(); ++i) {
      const Shape& shape = m.locals[i].shape();
      m.locals[i].assign(values[i].shape() == shape ? values[i] : values[i].reshape(shape));
    }
    Tensor outputs;
    nn::LossAndGradients lg = nn::detail::batch_gradients(*m.model, batch, first_step + s, &outputs);
    if (m.sparse_first) {
      auto [ids, grad_rows] = touched_rows(batch[0], lg.gradients[0]);
      ctx.apply_gradients(optimizer, m.names[0], ids, grad_rows);
      const std::vector<std::string> rest(m.names.begin() + 1, m.names.end());
      const std::vector<Tensor> rest_g(lg.gradients.begin() + 1, lg.gradients.end());
      if (!rest.empty()) ctx.apply_gradients(optimizer, rest, rest_g);
    } else {
      ctx.apply_gradients(optimizer, m.names, lg.gradients);
    }
    const auto n = static_cast<double>(nn::detail::rows_of(batch));
    losses.push_back(nn::detail::as_double(lg.loss));
    rows.push_back(n);
    hits.push_back(with_metrics && n > 0 ? nn::accuracy(outputs, batch[1]) * n : 0.0);
  }
  return {Tensor::from_vector(losses), Tensor::from_vector(rows), Tensor::from_vector(hits)};
}

}  // namespace

void add_builtin_functions(FunctionRegistry& registry) {
  // The models this worker trained, by their config's text (one per fit; a few kept).
  struct Cache {
    std::mutex mutex;
    std::map<std::string, std::shared_ptr<WorkerModel>> models;
  };
  auto cache = std::make_shared<Cache>();
  registry.add_builtin(nn::detail::fit_train_step, [cache](FunctionContext& ctx) {
    const std::string text = tensor_text(ctx.arg(1));
    std::shared_ptr<WorkerModel> m;
    {
      std::lock_guard<std::mutex> lock(cache->mutex);
      auto it = cache->models.find(text);
      if (it != cache->models.end()) m = it->second;
    }
    if (!m) {
      m = build_worker_model(text, ctx.task());
      std::lock_guard<std::mutex> lock(cache->mutex);
      if (cache->models.size() >= 4) cache->models.clear();
      cache->models.emplace(text, m);
    }
    return train_steps(ctx, *m);
  });
}

}  // namespace troupe::distribute::detail
