// The MLP of mlp_classifier trained asynchronously with ParameterServerStrategy: the variables,
// made in the strategy's scope, live on the ps tasks, the chief schedules training closures onto
// the workers, and each worker reads the variables, computes the gradients of one batch of its
// own dataset and sends the gradients; the ps tasks apply --optimizer (SGD by default; momentum,
// Adam, AdamW) to their shards as they arrive, each with its own slots. One
// binary for every role, chosen by TF_CONFIG: "chief" coordinates, "worker" and "ps" serve until
// the chief leaves.
//
//   troupe-launch --ps 1 -n 2 --chief -- ps_trainer --closures 200
//
// The chief prints a progress line every 10 completed closures and ends with one line for scripts:
//   result: closures=N done=D retried=R workers_lost=W loss_first=X loss_last=Y
// (done counts closures that completed, each once; loss_first and loss_last are the mean losses
// of the first and the last 10 closures).

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <memory>
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
  int closures = 200;
  std::int64_t batch = 64;
  int hidden = 64;
  float learning_rate = 0.05f;
  std::int64_t samples = 4096;
  int features = 32;
  int classes = 4;
  int shards = 2;
  int step_delay_ms = 0;
  std::string optimizer = "sgd";
  bool quiet = false;
};

// The optimizer the ps tasks apply to their shards (--optimizer, with --lr).
ShardOptimizer shard_optimizer(const std::string& name, float learning_rate) {
  if (name == "sgd") return ShardOptimizer::sgd(learning_rate);
  if (name == "momentum") return ShardOptimizer::sgd(learning_rate, 0.9f);
  if (name == "adam") return ShardOptimizer::adam(learning_rate);
  return ShardOptimizer::adamw(learning_rate);
}

const char* const layers[] = {"dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias", "dense_2/kernel",
                              "dense_2/bias"};

// The functions every worker runs; the chief never calls them, but the same binary registers them
// in every role.
FunctionRegistry make_functions(const Flags& f) {
  FunctionRegistry functions;
  functions.add_dataset("blobs", [f] {
    nn::BlobOptions options;
    options.samples = f.samples;
    options.features = f.features;
    options.classes = f.classes;
    auto d = nn::make_blobs(options);
    return data::Dataset::from_tensor_slices({d.features, d.labels}).shuffle(f.samples, 7).repeat().batch(f.batch, true);
  });
  // One step on the next batch of the worker's iterator (arg 0) with learning rate arg 1: the
  // gradients go to the ps tasks, which apply --optimizer with the slots beside each shard;
  // returns the batch's loss.
  functions.add("train_step", [f](FunctionContext& ctx) {
    const data::Element batch = ctx.next(0);
    const float lr = ctx.arg(1).item<float>();
    const std::vector<std::string> names(std::begin(layers), std::end(layers));
    const std::vector<Tensor> w = ctx.read_variables(names);  // every shard in flight at once
    const Tensor h1 = nn::dense_forward(batch[0], w[0], w[1], nn::Activation::relu);
    const Tensor h2 = nn::dense_forward(h1, w[2], w[3], nn::Activation::relu);
    const Tensor logits = nn::dense_forward(h2, w[4], w[5], nn::Activation::none);
    const auto loss = nn::sparse_softmax_cross_entropy(logits, batch[1]);
    const auto g3 = nn::dense_backward(h2, w[4], logits, loss.gradient, nn::Activation::none);
    const auto g2 = nn::dense_backward(h1, w[2], h2, g3.input, nn::Activation::relu);
    const auto g1 = nn::dense_backward(batch[0], w[0], h1, g2.input, nn::Activation::relu, false);
    ctx.apply_gradients(shard_optimizer(f.optimizer, lr), names,
                        {g1.kernel, g1.bias, g2.kernel, g2.bias, g3.kernel, g3.bias});
    if (f.step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(f.step_delay_ms));
    return std::vector<Tensor>{loss.loss};
  });
  return functions;
}

double mean(const std::vector<float>& v, std::size_t from, std::size_t to) {
  double s = 0;
  for (std::size_t i = from; i < to; ++i) s += v[i];
  return to > from ? s / static_cast<double>(to - from) : 0.0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"An MLP trained with ParameterServerStrategy (one binary for every role).", "ps_trainer"};
  troupe::examples::show_defaults(app);
  app.add_option("--closures", f.closures, "training closures the chief schedules")->check(in_range(1, 1 << 24));
  app.add_option("--batch", f.batch, "batch of each closure")->check(in_range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--hidden", f.hidden, "units of each hidden layer")->check(in_range(1, 1 << 16));
  app.add_option("--lr", f.learning_rate, "the optimizer's learning rate")->check(positive());
  app.add_option("--optimizer", f.optimizer, "what the ps tasks apply to their shards (momentum: 0.9)")
      ->check(CLI::IsMember({"sgd", "momentum", "adam", "adamw"}));
  app.add_option("--samples", f.samples, "generated set: examples")->check(in_range(std::int64_t{1}, std::int64_t{1} << 26));
  app.add_option("--features", f.features, "generated set: features")->check(in_range(1, 1 << 16));
  app.add_option("--classes", f.classes, "generated set: classes")->check(in_range(2, 1 << 16));
  app.add_option("--shards", f.shards, "shards of each kernel (FixedShardsPartitioner)")->check(in_range(1, 1024));
  app.add_option("--step-delay-ms", f.step_delay_ms, "a pause in each closure, as a heavier model would take")
      ->check(in_range(0, 60000));
  app.add_flag("--quiet", f.quiet, "print the result line only");
  return troupe::examples::run_main(app, argc, argv, [&] {
    Runtime runtime;
    auto resolver = std::make_shared<TFConfigClusterResolver>();
    if (serve_if_worker_or_ps(runtime, *resolver, make_functions(f))) return 0;
    if (resolver->task_type() != "chief") {
      throw std::invalid_argument("task type " + resolver->task_type() +
                                  " has no part here (expected chief, worker or ps)");
    }

    ParameterServerStrategy strategy(runtime, resolver, std::make_shared<FixedShardsPartitioner>(f.shards));
    ClusterCoordinator coordinator(strategy);
    // As in TensorFlow, variables made in the strategy's scope live on the ps tasks, sharded by
    // the partitioner; the workers' train_step reaches them by name.
    const std::int64_t sizes[] = {f.features, f.hidden, f.hidden, f.classes};
    std::vector<Variable> weights;
    {
      auto scope = strategy.scope();
      for (int l = 0; l < 3; ++l) {
        weights.emplace_back(nn::glorot_uniform(sizes[l], sizes[l + 1], 100 + l), layers[2 * l]);
        weights.emplace_back(Tensor::zeros({sizes[l + 1]}), layers[2 * l + 1]);
      }
    }
    auto iterator = coordinator.create_per_worker_dataset("blobs").make_iterator();
    if (!f.quiet) {
      std::cout << "ps_trainer: " << strategy.num_workers() << " workers, " << strategy.num_ps() << " ps task(s), "
                << f.closures << " closures of batch " << f.batch << std::endl;
    }

    std::vector<RemoteValue> losses;
    for (int i = 0; i < f.closures; ++i) losses.push_back(coordinator.schedule("train_step", iterator, f.learning_rate));
    std::vector<float> loss(static_cast<std::size_t>(f.closures));
    for (int i = 0; i < f.closures; ++i) {
      loss[static_cast<std::size_t>(i)] = coordinator.fetch(losses[static_cast<std::size_t>(i)]).at(0).item<float>();
      if (!f.quiet && ((i + 1) % 10 == 0 || i + 1 == f.closures)) {
        std::cout << "closures " << coordinator.closures_done() << "/" << f.closures << " done, loss "
                  << std::setprecision(4) << mean(loss, static_cast<std::size_t>(std::max(0, i - 9)),
                                                  static_cast<std::size_t>(i + 1))
                  << ", retried " << coordinator.closures_retried() << std::endl;
      }
    }
    coordinator.join();
    const std::size_t n = loss.size(), k = std::min<std::size_t>(10, n);
    std::cout << "result: closures=" << f.closures << " done=" << coordinator.closures_done()
              << " retried=" << coordinator.closures_retried() << " workers_lost=" << coordinator.workers_lost()
              << std::setprecision(5) << " loss_first=" << mean(loss, 0, k) << " loss_last=" << mean(loss, n - k, n)
              << std::endl;
    return 0;
  });
}
