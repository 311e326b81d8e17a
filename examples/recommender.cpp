// A click-through recommender trained asynchronously with ParameterServerStrategy, as Keras's
// model.fit does it: user and item embeddings, sharded over the ps tasks, with dense layers on top,
// on generated click data. One binary for every role, chosen by TF_CONFIG: "chief" coordinates,
// "worker" and "ps" serve until the chief leaves.
//
//   troupe-launch --ps 2 -n 2 --chief -- recommender --epochs 5 --dashboard-port 8080
//
// The data: --users users and --items items, each with a hidden taste vector and a bias; a user
// clicks an item with probability sigmoid(taste_u . taste_i + bias_u + bias_i). Every process
// generates the same examples (a fixed seed): random (user, item) pairs with their click drawn
// from that probability, the first --samples for training, the next --eval-samples held out.
//
// The model: one Embedding table whose first --users rows are the users' vectors and the next
// --items rows the items' (an example is the pair of ids [user, users + item]), split by the
// partitioner into 2 shards that the ps tasks hold (users mostly on one, items on the other, with
// 2 ps tasks); Flatten, a ReLU Dense layer and a Dense layer of 2 logits (no click, click), with
// the softmax cross-entropy, which for two classes is the logistic loss. The workers update only
// the table's rows their batches looked up (with Adam's slots beside them on the ps tasks).
//
// At the end of every epoch the chief computes the AUC (nn::AUC, Keras's AUC) of the held-out
// clicks with the weights the ps tasks hold then, prints it, and puts it in the epoch's logs as
// val_auc: with --dashboard-port the dashboard draws it, beside the loss, the cluster's closures
// and its ps tasks (docs/dashboard.md). The last line is one line for scripts:
//   result: epochs=E steps=S closures_done=D retried=R loss_first=X loss_last=Y auc_start=A0 auc=A
// (loss_first and loss_last are the first and last epochs' mean losses; auc_start the held-out
// AUC of the untrained model, auc after the last epoch).

#include <chrono>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <troupe/troupe.hpp>

#include "example_cli.hpp"

using troupe::examples::in_range;
using troupe::examples::positive;

using namespace troupe;
using namespace troupe::distribute;

namespace {

struct Flags {
  int users = 200;
  int items = 100;
  int taste = 4;  // the hidden taste vectors' size
  int dim = 8;    // the embeddings' size
  int hidden = 32;
  std::int64_t samples = 40000;
  std::int64_t eval_samples = 4000;
  int epochs = 5;
  std::int64_t steps_per_epoch = 40;
  int steps_per_execution = 1;
  std::int64_t batch = 128;
  float learning_rate = 0.01f;
  std::uint64_t seed = 7;
  int step_delay_ms = 0;
  bool quiet = false;
  troupe::examples::MonitorFlags monitor;
};

// The generated clicks: ids [n, 2] (user, users + item) and labels [n] (1: clicked).
struct Clicks {
  Tensor ids;
  Tensor labels;
};

// Every process draws the same examples: the first `f.samples` for training, then the held-out.
Clicks generate(const Flags& f, bool held_out) {
  std::mt19937_64 rng(f.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const double scale = 1.5 / std::sqrt(static_cast<double>(f.taste));
  std::vector<double> user_taste(static_cast<std::size_t>(f.users * f.taste)),
      item_taste(static_cast<std::size_t>(f.items * f.taste)), user_bias(static_cast<std::size_t>(f.users)),
      item_bias(static_cast<std::size_t>(f.items));
  for (auto& v : user_taste) v = normal(rng) * std::sqrt(scale);
  for (auto& v : item_taste) v = normal(rng) * std::sqrt(scale);
  for (auto& v : user_bias) v = 0.5 * normal(rng);
  for (auto& v : item_bias) v = normal(rng) - 0.5;
  std::uniform_int_distribution<int> user(0, f.users - 1), item(0, f.items - 1);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  const std::int64_t skip = held_out ? f.samples : 0, n = held_out ? f.eval_samples : f.samples;
  std::vector<std::int32_t> ids;
  std::vector<std::int32_t> labels;
  ids.reserve(static_cast<std::size_t>(2 * n));
  labels.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < skip + n; ++i) {
    const int u = user(rng), j = item(rng);
    double logit = user_bias[static_cast<std::size_t>(u)] + item_bias[static_cast<std::size_t>(j)];
    for (int k = 0; k < f.taste; ++k) {
      logit += user_taste[static_cast<std::size_t>(u * f.taste + k)] * item_taste[static_cast<std::size_t>(j * f.taste + k)];
    }
    const bool click = coin(rng) < 1.0 / (1.0 + std::exp(-logit));
    if (i < skip) continue;
    ids.push_back(u);
    ids.push_back(f.users + j);
    labels.push_back(click ? 1 : 0);
  }
  return {Tensor::from_vector<std::int32_t>(ids).reshape({n, 2}), Tensor::from_vector<std::int32_t>(labels)};
}

// The embeddings sharded over the ps tasks (made in the strategy's scope), the dense layers on top.
nn::Model make_model(const Flags& f) {
  nn::Model model(nn::Sequential({nn::Embedding(f.users + f.items, f.dim, 11, "embedding"), nn::Flatten(),
                                  nn::Dense(2 * f.dim, f.hidden, nn::Activation::relu, 12, "dense"),
                                  nn::Dense(f.hidden, 2, nn::Activation::none, 13, "dense_1")}));
  model.compile(std::make_shared<nn::Adam>(f.learning_rate), nn::Loss::sparse_categorical_crossentropy(),
                {"accuracy"});
  return model;
}

// The held-out AUC of the model as the ps tasks hold it: P(click) is the softmax's second class,
// the sigmoid of the logits' difference.
double held_out_auc(const nn::Model& model, const Clicks& held_out) {
  const std::vector<float> logits = model.predict(held_out.ids).to_vector<float>();
  std::vector<float> margin(logits.size() / 2);
  for (std::size_t i = 0; i < margin.size(); ++i) margin[i] = logits[2 * i + 1] - logits[2 * i];
  nn::AUC auc(nn::AUC::default_num_thresholds, true);
  auc.update_state(held_out.labels, Tensor::from_vector<float>(margin));
  return auc.result();
}

FunctionRegistry make_functions(const Flags& f) {
  FunctionRegistry functions;
  functions.add_dataset("clicks", [f] {
    const Clicks c = generate(f, false);
    auto batches =
        data::Dataset::from_tensor_slices({c.ids, c.labels}).shuffle(f.samples, f.seed + 1).repeat().batch(f.batch, true);
    if (f.step_delay_ms <= 0) return batches;
    return batches.map([ms = f.step_delay_ms](const data::Element& e) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      return e;
    });
  });
  return functions;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"A click-through recommender (user and item embeddings on the ps tasks) trained with "
               "ParameterServerStrategy (one binary for every role).",
               "recommender"};
  troupe::examples::show_defaults(app);
  app.add_option("--users", f.users, "generated users")->check(in_range(1, 1 << 22));
  app.add_option("--items", f.items, "generated items")->check(in_range(1, 1 << 22));
  app.add_option("--taste", f.taste, "the size of the hidden taste vectors the clicks come from")->check(in_range(1, 1024));
  app.add_option("--dim", f.dim, "the size of the learned embeddings")->check(in_range(1, 4096));
  app.add_option("--hidden", f.hidden, "units of the hidden Dense layer")->check(in_range(1, 1 << 16));
  app.add_option("--samples", f.samples, "training examples")->check(in_range(std::int64_t{1}, std::int64_t{1} << 26));
  app.add_option("--eval-samples", f.eval_samples, "held-out examples, drawn after the training's, for the AUC")
      ->check(in_range(std::int64_t{2}, std::int64_t{1} << 26));
  app.add_option("--epochs", f.epochs, "epochs")->check(in_range(1, 1 << 20));
  app.add_option("--steps-per-epoch", f.steps_per_epoch, "steps of each epoch")
      ->check(in_range(std::int64_t{1}, std::int64_t{1} << 40));
  app.add_option("--steps-per-execution", f.steps_per_execution, "batches per closure")->check(in_range(1, 1 << 16));
  app.add_option("--batch", f.batch, "batch of each step")->check(in_range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--lr", f.learning_rate, "Adam's learning rate")->check(positive());
  app.add_option("--seed", f.seed, "the generated data's seed");
  app.add_option("--step-delay-ms", f.step_delay_ms, "a pause per batch, as a heavier model would take")
      ->check(in_range(0, 60000));
  app.add_flag("--quiet", f.quiet, "print the result line only");
  troupe::examples::add_monitor_options(app, f.monitor);
  return troupe::examples::run_main(app, argc, argv, [&] {
    if (f.steps_per_epoch % f.steps_per_execution != 0) {
      throw std::invalid_argument("--steps-per-epoch " + std::to_string(f.steps_per_epoch) +
                                  " is not a multiple of --steps-per-execution " +
                                  std::to_string(f.steps_per_execution));
    }
    Runtime runtime;
    auto resolver = std::make_shared<TFConfigClusterResolver>();
    if (serve_if_worker_or_ps(runtime, *resolver, make_functions(f))) return 0;
    if (resolver->task_type() != "chief") {
      throw std::invalid_argument("task type " + resolver->task_type() +
                                  " has no part here (expected chief, worker or ps)");
    }
    // Two shards of every variable, placed round-robin over the ps tasks: with 2 ps tasks the
    // table's first half (the users) on one, its second (mostly items) on the other.
    ParameterServerStrategy strategy(runtime, resolver, std::make_shared<FixedShardsPartitioner>(2));
    ClusterCoordinator coordinator(strategy);
    std::optional<nn::Model> model;
    {
      auto scope = strategy.scope();
      model.emplace(make_model(f));
    }
    const Clicks held_out = generate(f, true);
    if (!f.quiet) {
      std::cout << "recommender: " << strategy.num_workers() << " workers, " << strategy.num_ps() << " ps task(s), "
                << f.users << " users, " << f.items << " items, " << f.epochs << " epochs of " << f.steps_per_epoch
                << " steps of " << f.batch << std::endl;
    }
    const double auc_start = held_out_auc(*model, held_out);
    double auc = auc_start;
    // Each epoch's held-out AUC, as val_auc in its logs: the callbacks after this one (the
    // dashboard's) see it.
    auto measure = std::make_shared<nn::LambdaCallback>();
    measure->epoch_end = [&](int epoch, nn::Logs& logs) {
      auc = held_out_auc(*model, held_out);
      logs["val_auc"] = auc;
      if (!f.quiet) {
        std::cout << "epoch " << epoch + 1 << "/" << f.epochs << ": loss " << std::setprecision(4) << logs["loss"]
                  << ", accuracy " << logs["accuracy"] << ", val_auc " << auc << std::endl;
      }
    };
    nn::FitOptions options;
    options.verbose = 0;
    options.steps_per_execution = f.steps_per_execution;
    options.callbacks = {measure};
    std::unique_ptr<Monitor> monitor;
    if (f.monitor.enabled()) {
      MonitorOptions monitor_options = f.monitor.options(f.batch);
      monitor_options.checkpoints = false;  // this sample saves none
      monitor = std::make_unique<Monitor>(strategy, model->optimizer().get(), monitor_options);
      options.callbacks.push_back(monitor->callback());
    }
    const nn::History h = model->fit(nn::DatasetCreator("clicks"), f.epochs, f.steps_per_epoch, options);
    coordinator.join();
    const double loss_first = h.loss.empty() ? NAN : h.loss.front(), loss_last = h.loss.empty() ? NAN : h.loss.back();
    std::cout << "result: epochs=" << h.loss.size() << " steps=" << h.steps
              << " closures_done=" << coordinator.closures_done() << " retried=" << coordinator.closures_retried()
              << std::setprecision(4) << " loss_first=" << loss_first << " loss_last=" << loss_last
              << " auc_start=" << auc_start << " auc=" << auc << std::endl;
    return 0;
  });
}
