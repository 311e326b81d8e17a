// The MLP of mlp_classifier trained asynchronously with ParameterServerStrategy, as Keras's
// model.fit does it: the model, made in the strategy's scope, has its variables on the ps tasks;
// Model::fit on the chief schedules train-step closures (--steps-per-execution batches each) onto
// the workers, each of which reads the variables, computes the gradients of its own batches and
// sends them; the ps tasks apply --optimizer (Adam by default; SGD, momentum, AdamW) to their
// shards as they arrive, each with its own slots. One binary for every role, chosen by TF_CONFIG:
// "chief" coordinates, "worker" and "ps" serve until the chief leaves.
//
//   troupe-launch --ps 1 -n 2 --chief -- ps_trainer --closures 200
//
// --mode closures schedules hand-written closures instead (forward and backward written out,
// one batch each); --mode local trains the same model on the same data in this one process
// (no cluster), the synchronous run the asynchronous one is compared with.
//
// With --checkpoint-dir DIR (fit), the chief saves a sharded checkpoint (a CheckpointManager of
// model.variables(): every ps task writes its own shards with their optimizer slots) every --checkpoint-every
// steps and at the end, and a run started on a directory that holds one resumes from it. Under
// troupe-launch --max-restarts a lost ps task is restarted alone on its port while the chief and
// the workers wait for it (TROUPE_PS_RESTART_WAIT_S), and fit restores every shard from the last
// checkpoint and goes on from its step; a lost chief (or a ps task that does not come back) ends
// the run, the launcher restarts the cluster, and training goes on from the last checkpoint.
//
// --mode evaluator (or the "evaluator" task of TF_CONFIG) is the sidecar evaluator
// (nn::SidecarEvaluator): in a process of its own, it watches --checkpoint-dir and evaluates each
// new checkpoint of the training on --eval-samples held-out examples of the same generated set
// (drawn after the training's), printing one line per checkpoint and writing eval_loss and
// eval_accuracy to --tensorboard-dir; it stops after --max-evaluations, once it has evaluated
// the checkpoint of --final-step, or when killed.
//
//   ps_trainer --mode evaluator --checkpoint-dir ckpt --tensorboard-dir logs/eval --final-step 400
//
// With --dashboard-port (fit), the chief serves the live dashboard: the loss and throughput, and
// the cluster's closures per second, queue depth, every worker's state and throughput, every ps
// task's bytes and update rate, and the closures lost, retried and cancelled as events
// (docs/dashboard.md); its pause, learning rate, checkpoint and stop apply at closure boundaries.
//
// The chief prints a progress line every 10 completed closures and ends with one line for scripts:
//   result: closures=N done=D retried=R workers_lost=W ps_restarts=P loss_first=X loss_last=Y
//           start_step=S0 step=S
// (done counts closures that completed in this run, each once; loss_first and loss_last are the
// mean losses of its first and last 10 closures; ps_restarts counts the restarts of ps tasks
// under troupe-launch --max-restarts: the launcher's restarts before this run (TROUPE_RESTART_COUNT:
// of the whole cluster, or of a ps task alone), and the ps tasks restarted alone during it; start_step is the step this run resumed from at its start, 0 when
// fresh; step counts the training steps done, start_step included, steps redone after a ps
// task's restart once).

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
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
  std::string mode = "fit";
  int closures = 200;
  int epochs = 1;
  int steps_per_execution = 1;
  std::int64_t batch = 64;
  int hidden = 64;
  float learning_rate = 0;  // 0: the optimizer's default below
  std::int64_t samples = 4096;
  int features = 32;
  int classes = 4;
  int shards = 2;
  int step_delay_ms = 0;
  std::string optimizer = "adam";
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;  // 0: at the end only
  std::string tensorboard_dir;
  std::int64_t eval_samples = 1024;
  int max_evaluations = 0;
  std::int64_t final_step = 0;  // 0: none
  bool quiet = false;
  troupe::examples::MonitorFlags monitor;

  float lr() const {
    if (learning_rate > 0) return learning_rate;
    return optimizer == "sgd" || optimizer == "momentum" ? 0.05f : 0.01f;
  }
};

// The optimizer the ps tasks apply to their shards (--optimizer, with --lr), for the closures.
ShardOptimizer shard_optimizer(const std::string& name, float learning_rate) {
  if (name == "sgd") return ShardOptimizer::sgd(learning_rate);
  if (name == "momentum") return ShardOptimizer::sgd(learning_rate, 0.9f);
  if (name == "adam") return ShardOptimizer::adam(learning_rate);
  return ShardOptimizer::adamw(learning_rate);
}

// The same as Keras's optimizer, for fit (the ps tasks apply it in its place).
std::shared_ptr<nn::Optimizer> model_optimizer(const std::string& name, float learning_rate) {
  if (name == "sgd") return std::make_shared<nn::SGD>(learning_rate);
  if (name == "momentum") return std::make_shared<nn::SGD>(learning_rate, 0.9f);
  if (name == "adam") return std::make_shared<nn::Adam>(learning_rate);
  return std::make_shared<nn::AdamW>(learning_rate);
}

const char* const layers[] = {"dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias", "dense_2/kernel",
                              "dense_2/bias"};

// Every worker's dataset: the generated set, shuffled, repeated, in batches (with --step-delay-ms
// a pause per batch, as a heavier model would take).
data::Dataset blobs(const Flags& f) {
  nn::BlobOptions options;
  options.samples = f.samples;
  options.features = f.features;
  options.classes = f.classes;
  auto d = nn::make_blobs(options);
  auto batches =
      data::Dataset::from_tensor_slices({d.features, d.labels}).shuffle(f.samples, 7).repeat().batch(f.batch, true);
  if (f.step_delay_ms <= 0) return batches;
  return batches.map([ms = f.step_delay_ms](const data::Element& e) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return e;
  });
}

// The MLP as a Keras model, made in the current scope (the strategy's: its variables on the ps
// tasks), with the hand-written closures' initial weights.
nn::Model make_model(const Flags& f) {
  nn::Model model(nn::Sequential({nn::Dense(f.features, f.hidden, nn::Activation::relu, 100, "dense"),
                                  nn::Dense(f.hidden, f.hidden, nn::Activation::relu, 101, "dense_1"),
                                  nn::Dense(f.hidden, f.classes, nn::Activation::none, 102, "dense_2")}));
  model.compile(model_optimizer(f.optimizer, f.lr()), nn::Loss::sparse_categorical_crossentropy());
  return model;
}

// The functions every worker runs for --mode closures (fit's are troupe's own); the chief never
// calls them, but the same binary registers them in every role.
FunctionRegistry make_functions(const Flags& f) {
  FunctionRegistry functions;
  functions.add_dataset("blobs", [f] { return blobs(f); });
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
    return std::vector<Tensor>{loss.loss};
  });
  return functions;
}

double mean(const std::vector<float>& v, std::size_t from, std::size_t to) {
  double s = 0;
  for (std::size_t i = from; i < to; ++i) s += v[i];
  return to > from ? s / static_cast<double>(to - from) : 0.0;
}

// The last line, for scripts.
void print_result(int closures, std::uint64_t done, std::uint64_t retried, std::uint64_t lost,
                  const std::vector<float>& loss, std::int64_t steps, int restarts = 0, std::int64_t start_step = 0) {
  const std::size_t n = loss.size(), k = std::min<std::size_t>(10, n);
  std::cout << "result: closures=" << closures << " done=" << done << " retried=" << retried
            << " workers_lost=" << lost << " ps_restarts=" << restarts << std::setprecision(5)
            << " loss_first=" << mean(loss, 0, k) << " loss_last=" << mean(loss, n - k, n)
            << " start_step=" << start_step << " step=" << steps << std::endl;
}

// A progress line every 10 closures.
void progress(const Flags& f, std::uint64_t done, const std::vector<float>& loss, std::uint64_t retried) {
  const std::size_t i = loss.size();
  if (f.quiet || (i % 10 != 0 && i != static_cast<std::size_t>(f.closures))) return;
  std::cout << "closures " << done << "/" << f.closures << " done, loss " << std::setprecision(4)
            << mean(loss, i >= 10 ? i - 10 : 0, i) << ", retried " << retried << std::endl;
}

// --mode local: the same model on the same data, trained by fit in this process; a "closure" is
// --steps-per-execution steps, as in fit on the cluster.
int train_locally(const Flags& f) {
  nn::Model model = make_model(f);
  std::vector<float> loss;
  double sum = 0;
  int in_closure = 0;
  nn::FitOptions options;
  options.verbose = 0;
  options.on_step_end = [&](std::int64_t, double step_loss) {
    sum += step_loss;
    if (++in_closure < f.steps_per_execution) return;
    loss.push_back(static_cast<float>(sum / in_closure));
    sum = 0;
    in_closure = 0;
    progress(f, loss.size(), loss, 0);
  };
  const std::int64_t steps = static_cast<std::int64_t>(f.closures) * f.steps_per_execution;
  const nn::History h = model.fit(blobs(f), f.epochs, steps / f.epochs, options);
  print_result(f.closures, loss.size(), 0, 0, loss, h.steps);
  return 0;
}

// --mode evaluator: the sidecar evaluator on held-out examples (the generated set's rows after
// the training's --samples, from the same clusters).
int evaluate_checkpoints(const Flags& f) {
  if (f.checkpoint_dir.empty()) {
    throw std::invalid_argument("--mode evaluator needs --checkpoint-dir (the training's checkpoint directory)");
  }
  nn::BlobOptions options;
  options.samples = f.samples + f.eval_samples;
  options.features = f.features;
  options.classes = f.classes;
  const auto d = nn::make_blobs(options);
  const auto held_out = data::Dataset::from_tensor_slices(
                            {d.features.slice(f.samples, options.samples), d.labels.slice(f.samples, options.samples)})
                            .batch(f.batch);
  nn::Model model = make_model(f);
  model.compile(model_optimizer(f.optimizer, f.lr()), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
  nn::SidecarEvaluatorOptions eval;
  eval.tensorboard_dir = f.tensorboard_dir;
  if (f.final_step > 0) eval.final_step = f.final_step;
  eval.out = &std::cout;
  eval.poll_interval = std::chrono::milliseconds(100);
  nn::SidecarEvaluator evaluator(model, held_out, std::filesystem::absolute(f.checkpoint_dir).string(), 0,
                                 f.max_evaluations, eval);
  const auto done = evaluator.start();
  std::cout << "evaluator: " << done.size() << " checkpoint(s) evaluated, the last at step " << evaluator.last_step()
            << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"An MLP trained with ParameterServerStrategy (one binary for every role).", "ps_trainer"};
  troupe::examples::show_defaults(app);
  app.add_option("--mode", f.mode,
                 "fit: Model::fit on the cluster; closures: hand-written closures; local: fit in this one process; "
                 "evaluator: evaluate each checkpoint of --checkpoint-dir as it appears")
      ->check(CLI::IsMember({"fit", "closures", "local", "evaluator"}));
  app.add_option("--closures", f.closures, "training closures the chief schedules")->check(in_range(1, 1 << 24));
  app.add_option("--epochs", f.epochs, "fit: epochs, which share the closures (a divisor of --closures)")
      ->check(in_range(1, 1 << 20));
  app.add_option("--steps-per-execution", f.steps_per_execution, "fit: batches per closure")->check(in_range(1, 1 << 16));
  app.add_option("--batch", f.batch, "batch of each step")->check(in_range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--hidden", f.hidden, "units of each hidden layer")->check(in_range(1, 1 << 16));
  app.add_option("--lr", f.learning_rate, "the optimizer's learning rate (0, the default: 0.05 for sgd and momentum, "
                                          "0.01 for adam and adamw)")
      ->check(positive());
  app.add_option("--optimizer", f.optimizer, "what the ps tasks apply to their shards (momentum: 0.9)")
      ->check(CLI::IsMember({"sgd", "momentum", "adam", "adamw"}));
  app.add_option("--samples", f.samples, "generated set: examples")->check(in_range(std::int64_t{1}, std::int64_t{1} << 26));
  app.add_option("--features", f.features, "generated set: features")->check(in_range(1, 1 << 16));
  app.add_option("--classes", f.classes, "generated set: classes")->check(in_range(2, 1 << 16));
  app.add_option("--shards", f.shards, "shards of each kernel (FixedShardsPartitioner)")->check(in_range(1, 1024));
  app.add_option("--step-delay-ms", f.step_delay_ms, "a pause per batch, as a heavier model would take")
      ->check(in_range(0, 60000));
  CLI::Option* checkpoint_dir = app.add_option("--checkpoint-dir", f.checkpoint_dir,
                                                "fit: sharded checkpoints here (every ps task writes its shards; "
                                                "the same path on every host), resumed from when present; "
                                                "evaluator: the checkpoints it evaluates");
  app.add_option("--checkpoint-every", f.checkpoint_every, "fit: steps between checkpoints (0: at the end only)")
      ->check(in_range(std::int64_t{0}, std::int64_t{1} << 40))
      ->needs(checkpoint_dir);
  app.add_option("--tensorboard-dir", f.tensorboard_dir, "evaluator: eval_loss and eval_accuracy scalars here");
  app.add_option("--eval-samples", f.eval_samples, "evaluator: held-out examples, drawn after --samples")
      ->check(in_range(std::int64_t{1}, std::int64_t{1} << 26));
  app.add_option("--max-evaluations", f.max_evaluations, "evaluator: stop after this many (0: no limit)")
      ->check(in_range(0, 1 << 30));
  app.add_option("--final-step", f.final_step,
                 "evaluator: stop once the checkpoint of this step (the training's last) is evaluated (0: none)")
      ->check(in_range(std::int64_t{0}, std::int64_t{1} << 40));
  app.add_flag("--quiet", f.quiet, "print the result line only");
  troupe::examples::add_monitor_options(app, f.monitor);
  app.callback([&] {
    if (f.mode != "fit" && f.mode != "evaluator" && checkpoint_dir->count() > 0) {
      throw CLI::ValidationError("--checkpoint-dir", "needs --mode fit or evaluator (the mode is " + f.mode + ")");
    }
  });
  return troupe::examples::run_main(app, argc, argv, [&] {
    if (f.mode == "evaluator") return evaluate_checkpoints(f);
    if (f.closures % f.epochs != 0) {
      throw std::invalid_argument("--closures " + std::to_string(f.closures) + " is not a multiple of --epochs " +
                                  std::to_string(f.epochs) + " (every epoch runs as many closures)");
    }
    if (f.mode == "local") return train_locally(f);
    Runtime runtime;
    auto resolver = std::make_shared<TFConfigClusterResolver>();
    if (resolver->task_type() == "evaluator") return evaluate_checkpoints(f);  // TF_CONFIG's sidecar evaluator
    if (serve_if_worker_or_ps(runtime, *resolver, make_functions(f))) return 0;
    if (resolver->task_type() != "chief") {
      throw std::invalid_argument("task type " + resolver->task_type() +
                                  " has no part here (expected chief, worker or ps)");
    }

    ParameterServerStrategy strategy(runtime, resolver, std::make_shared<FixedShardsPartitioner>(f.shards));
    ClusterCoordinator coordinator(strategy);
    if (!f.quiet) {
      std::cout << "ps_trainer: " << strategy.num_workers() << " workers, " << strategy.num_ps() << " ps task(s), "
                << f.closures << " closures of " << (f.mode == "fit" ? f.steps_per_execution : 1) << " batch(es) of "
                << f.batch << ", " << f.optimizer << " (" << f.mode << ")" << std::endl;
    }
    std::vector<float> loss;

    if (f.mode == "fit") {
      // As in Keras: the model made in the strategy's scope has its variables on the ps tasks,
      // sharded by the partitioner; fit schedules the train steps onto the workers.
      std::optional<nn::Model> model;
      {
        auto scope = strategy.scope();
        model.emplace(make_model(f));
      }
      // A checkpoint directory: resume from its newest intact checkpoint (the variables with the
      // ps tasks' slots), then save every --checkpoint-every steps, with no closure in flight.
      std::optional<CheckpointManager> checkpoints;
      std::int64_t start_step = 0;
      if (!f.checkpoint_dir.empty()) {
        checkpoints.emplace(Checkpoint(model->variables()), f.checkpoint_dir, 3);
        start_step = checkpoints->restore_or_initialize().value_or(0);
        if (start_step > 0 && !f.quiet) std::cout << "ps_trainer: resumed at step " << start_step << std::endl;
      }
      std::int64_t saved_at = start_step;
      auto record = std::make_shared<nn::LambdaCallback>();
      record->batch_end = [&](std::int64_t, nn::Logs& logs) {
        loss.push_back(static_cast<float>(logs.at("loss")));
        progress(f, coordinator.closures_done(), loss, coordinator.closures_retried());
        if (checkpoints && f.checkpoint_every > 0 && model->control().step() - saved_at >= f.checkpoint_every) {
          model->control().request_checkpoint();
        }
      };
      record->checkpoint = [&](std::int64_t step, nn::Logs&) {
        if (!checkpoints) return;  // no --checkpoint-dir: the dashboard offers no checkpoint
        checkpoints->save(step);
        saved_at = step;
      };
      nn::FitOptions options;
      options.verbose = 0;
      options.steps_per_execution = f.steps_per_execution;
      options.initial_step = start_step;
      options.callbacks = {record};
      // --dashboard-port: the chief's dashboard, with the cluster's closures, workers and ps tasks;
      // its controls (pause, learning rate, checkpoint, stop) apply at closure boundaries.
      std::unique_ptr<Monitor> monitor;
      if (f.monitor.enabled()) {
        MonitorOptions monitor_options = f.monitor.options(f.batch);
        monitor_options.checkpoints = checkpoints.has_value();
        monitor = std::make_unique<Monitor>(strategy, model->optimizer().get(), monitor_options);
        options.callbacks.push_back(monitor->callback());
      }
      const std::int64_t steps_per_epoch = static_cast<std::int64_t>(f.closures / f.epochs) * f.steps_per_execution;
      const auto t0 = std::chrono::steady_clock::now();
      const nn::History h = model->fit(nn::DatasetCreator("blobs"), f.epochs, steps_per_epoch, options);
      coordinator.join();
      if (monitor && monitor->stopped() && !f.quiet) {
        std::cout << "ps_trainer: stopped from the dashboard after step " << start_step + h.steps << std::endl;
      }
      const std::int64_t step = start_step + h.steps;  // h.steps: this run's
      if (checkpoints && step > saved_at) checkpoints->save(step);
      if (!f.quiet) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::cout << "ps_trainer: " << h.steps << " steps of batch " << f.batch << " in "
                  << std::setprecision(4) << s << " s: " << std::setprecision(6) << static_cast<double>(h.samples) / s
                  << " samples/s" << std::endl;
      }
      print_result(f.closures, coordinator.closures_done(), coordinator.closures_retried(), coordinator.workers_lost(),
                   loss, step,
                   MultiWorkerOptions::from_environment().restart_count + static_cast<int>(coordinator.ps_tasks_restarted()),
                   start_step);
      return 0;
    }

    // --mode closures: hand-written closures over variables made in the strategy's scope.
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
    std::vector<RemoteValue> losses;
    for (int i = 0; i < f.closures; ++i) losses.push_back(coordinator.schedule("train_step", iterator, f.lr()));
    for (int i = 0; i < f.closures; ++i) {
      loss.push_back(coordinator.fetch(losses[static_cast<std::size_t>(i)]).at(0).item<float>());
      progress(f, coordinator.closures_done(), loss, coordinator.closures_retried());
    }
    coordinator.join();
    print_result(f.closures, coordinator.closures_done(), coordinator.closures_retried(), coordinator.workers_lost(),
                 loss, f.closures);
    return 0;
  });
}
