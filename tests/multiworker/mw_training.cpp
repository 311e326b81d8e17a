// mw_worker's modes that train and checkpoint: checkpoint, preempt, train, outside, steer, model.
#include "mw_modes.hpp"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <troupe/troupe.hpp>

using namespace troupe;
using namespace troupe::distribute;

namespace mw {

namespace {

// The weights of `model` as one hash, after checking that every local replica holds the same bits.
std::uint64_t model_weights(MultiWorkerMirroredStrategy& s, const nn::Model& model) {
  std::vector<Tensor> weights;
  for (const Variable& v : model.trainable_variables()) {
    const auto components = s.experimental_local_results(v);
    for (const Tensor& c : components) {
      expect_eq(hash_bits({c}), hash_bits({components.front()}), "local replicas' " + v.name() + " identical");
    }
    weights.push_back(components.front());
  }
  return hash_bits(weights);
}

}  // namespace

// Every worker saves through a CheckpointManager into one shared directory: only the chief's file
// stays; on_read values are aggregated over all workers; every worker restores the chief's file.
int checkpoint(MultiWorkerMirroredStrategy& s, const std::string& dir) {
  const int n = s.num_replicas_in_sync();
  const int task = s.cluster_resolver()->task_id();
  auto scope = s.scope();
  Variable w(Tensor::full({4}, 1.5, DType::f32), "w");
  Variable seen(Tensor::scalar<float>(0.0f), "seen", VariableSynchronization::on_read, VariableAggregation::sum);
  s.run([&] { seen.assign_add(Tensor::scalar<float>(1.0f)); });
  expect_eq(seen.value().item<float>(), float(n), "on_read SUM aggregated over every worker");
  CheckpointManager manager(Checkpoint({{"w", w}, {"seen", seen}}), dir, 2);
  const std::string written = manager.save(7);
  expect_eq(written.find(task == 0 ? "ckpt-7.ckpt" : ".tmp.ckpt") != std::string::npos, true, "chief writes the real path");
  std::cout << "wrote " << written << "\n";
  w.assign(Tensor::zeros({4}));
  seen.assign(Tensor::scalar<float>(100.0f));
  // Every worker restores the chief's file once it exists (the chief saved before answering the
  // sum below, which every worker waits for).
  s.reduce(ReduceOp::sum, s.experimental_distribute_values_from_function([](const ValueContext&) {
    return Tensor::scalar<int>(1);
  }), std::nullopt);
  auto step = manager.restore_or_initialize();
  expect_eq(step.has_value() && *step == 7, true, "restored step 7");
  for (const Tensor& c : s.experimental_local_results(w)) {
    expect_eq(c.to_vector<float>(), std::vector<float>(4, 1.5f), "w restored into every component");
  }
  expect_eq(seen.value().item<float>(), float(n), "on_read restored so that it sums back");
  return failures == 0 ? 0 : 1;
}


// PreemptionCheckpointHandler on its own: 10 steps, each adding every replica's 1 to a mirrored
// counter through an all-reduce. A termination watcher on worker MW_WATCH_TASK (1) alone says stop
// once 5 steps are done: every worker must save at step 5 and exit with restart_exit_code (75).
// Run again, every worker restores step 5 and runs steps 6..10.
int preempt(MultiWorkerMirroredStrategy& s, const std::string& dir) {
  const char* watch = std::getenv("MW_WATCH_TASK");
  const int watcher = watch != nullptr ? std::atoi(watch) : 1;
  const int task = s.cluster_resolver()->task_id();
  auto scope = s.scope();
  Variable count(Tensor::scalar<float>(0.0f), "count");
  CheckpointManager manager(Checkpoint({{"count", count}}), dir, 3);
  TerminationConfig config;
  PreemptionCheckpointHandler* handler_ptr = nullptr;
  bool fresh = false;  // the watcher speaks in the first run only
  config.termination_watcher_fn = [&] { return fresh && task == watcher && handler_ptr->total_run_calls() == 5; };
  PreemptionCheckpointHandler handler(s, manager, config);
  handler_ptr = &handler;
  const std::int64_t start = handler.total_run_calls();
  fresh = start == 0;
  std::cout << "starting at step " << start << std::endl;
  expect_eq(count.value().item<float>(), float(start * s.num_replicas_in_sync()), "the counter restored");
  while (handler.total_run_calls() < 10) {
    handler.run([&] {
      auto sums = s.run([] { return get_replica_context()->all_reduce(ReduceOp::sum, Tensor::scalar<float>(1.0f)); });
      count.assign_add(s.experimental_local_results(sums).front());
    });
  }
  expect_eq(start, std::int64_t{5}, "the second run starts from the preemption checkpoint");
  expect_eq(count.value().item<float>(), float(10 * s.num_replicas_in_sync()), "10 steps counted in all");
  return failures == 0 ? 0 : 1;
}


// An MLP trained with Adam, each replica on its own batch: prints the kernel path, a hash of a
// forward pass on a batch every worker shares (it differs between paths: their products round
// differently), and after every step a hash of the weights (identical on every worker, whatever
// its path: the gradients are all-reduced and the update gives the same bits everywhere).
// With `cnn`, the same for a small CNN: Conv2D(8, 3x3, same, relu) -> MaxPooling2D(2) -> Flatten
// -> Dense(10) on 8x8 images of 3 channels (the convolution's products take each path's kernels).
int train(MultiWorkerMirroredStrategy& s, bool cnn) {
  const int n = s.num_replicas_in_sync();
  const int steps = 12;
  const std::int64_t batch = 32, in = cnn ? 8 * 8 * 3 : 96, hidden = 64, classes = 10;
  auto scope = s.scope();
  nn::Sequential model;
  if (cnn) {
    model.add(nn::Conv2D(8, 3, 1, nn::Padding::same, nn::Activation::relu, 1));
    model.add(nn::MaxPooling2D(2));
    model.add(nn::Flatten());
    model.add(nn::Dense(4 * 4 * 8, classes, nn::Activation::none, 2));
    model.build({-1, 8, 8, 3});
  } else {
    model.add(nn::Dense(in, hidden, nn::Activation::relu, 1));
    model.add(nn::Dense(hidden, hidden, nn::Activation::relu, 2));
    model.add(nn::Dense(hidden, classes, nn::Activation::none, 3));
  }
  // A batch of inputs: [batch, in] rows, or the same values as [batch, 8, 8, 3] images.
  const auto input = [&](std::uint64_t seed) {
    const Tensor x = nn::glorot_uniform(batch, in, seed) * 4.0f;
    return cnn ? x.reshape({batch, 8, 8, 3}) : x;
  };
  auto optimizer = std::make_shared<nn::Adam>(0.01f);
  std::cout << "path " << Runtime::cpu_kernel_path() << "\n";
  const Tensor probe = input(99);
  std::cout << "probe " << hash_bits({model.forward(probe)}) << "\n";
  for (int step = 0; step < steps; ++step) {
    s.run([&] {
      auto* ctx = get_replica_context();
      const int id = ctx->replica_id_in_sync_group();
      const Tensor x = input(static_cast<std::uint64_t>(1000 + step * 64 + id));
      std::vector<std::int64_t> y(batch);
      for (std::int64_t i = 0; i < batch; ++i) y[i] = (i * 7 + step + id) % classes;
      std::vector<Tensor> activations;
      const Tensor logits = model.forward(x, activations);
      const auto lg = nn::sparse_softmax_cross_entropy(logits, Tensor::from_vector(y, {batch}), batch * n);
      const std::vector<Tensor> grads = model.backward(activations, lg.gradient);
      optimizer->apply_gradients(nn::zip(grads, model.trainable_variables()), ReduceOp::sum);
    });
    std::vector<Tensor> weights;
    for (const Variable& v : model.trainable_variables()) {
      const auto components = s.experimental_local_results(v);
      for (const Tensor& c : components) {
        expect_eq(hash_bits({c}), hash_bits({components.front()}), "local replicas' " + v.name() + " identical");
      }
      weights.push_back(components.front());
    }
    std::cout << "step " << step << " weights " << hash_bits(weights) << "\n";
  }
  return failures == 0 ? 0 : 1;
}


// A strategy's variables in main, outside its scope, after training (TensorFlow's semantics): an
// on_read ONLY_FIRST_REPLICA counter incremented in 50 steps reads 50, an on_read SUM metric reads
// its sum over every replica of every worker, a mirrored variable its first component; assign
// writes every component; a CheckpointManager saves (only the chief's file stays) and restores.
int outside(MultiWorkerMirroredStrategy& s, const std::string& dir) {
  const int n = s.num_replicas_in_sync();
  std::optional<Variable> w, counter, metric;
  {
    auto scope = s.scope();
    w.emplace(Tensor::full({4}, 1.5, DType::f32), "w");
    counter.emplace(Tensor::scalar<float>(0.0f), "counter", VariableSynchronization::on_read,
                    VariableAggregation::only_first_replica);
    metric.emplace(Tensor::scalar<float>(0.0f), "metric", VariableSynchronization::on_read, VariableAggregation::sum);
  }
  for (int step = 0; step < 50; ++step) {
    s.run([&] {
      counter->assign_add(Tensor::scalar<float>(1.0f));
      metric->assign_add(Tensor::scalar<float>(2.0f));
    });
  }
  expect_eq(has_strategy(), false, "no strategy in main");
  expect_eq(counter->value().item<float>(), 50.0f, "the counter reads 50 outside the scope");
  expect_eq(metric->value().item<float>(), 100.0f * float(n), "the metric reads its sum over every worker");
  expect_eq(w->value().to_vector<float>(), std::vector<float>(4, 1.5f), "w reads its first component");
  w->assign(Tensor::full({4}, 2.5, DType::f32));
  for (const Tensor& c : s.experimental_local_results(*w)) {
    expect_eq(c.to_vector<float>(), std::vector<float>(4, 2.5f), "assign outside the scope writes every component");
  }
  CheckpointManager manager(Checkpoint({{"w", *w}, {"counter", *counter}, {"metric", *metric}}), dir, 2);
  const std::string written = manager.save(3);
  const bool chief = expected_rank(*s.cluster_resolver()) == 0;
  expect_eq(written.find(chief ? "ckpt-3.ckpt" : ".tmp.ckpt") != std::string::npos, true,
            "only the chief writes the real path, outside the scope too");
  w->assign(Tensor::zeros({4}));
  counter->assign(Tensor::scalar<float>(0.0f));
  metric->assign(Tensor::scalar<float>(0.0f));
  // Every worker restores the chief's file once it exists (the chief saved before this sum).
  s.reduce(ReduceOp::sum, s.experimental_distribute_values_from_function([](const ValueContext&) {
    return Tensor::scalar<int>(1);
  }), std::nullopt);
  auto step = manager.restore_or_initialize();
  expect_eq(step.has_value() && *step == 3, true, "restored step 3 outside the scope");
  for (const Tensor& c : s.experimental_local_results(*w)) {
    expect_eq(c.to_vector<float>(), std::vector<float>(4, 2.5f), "w restored into every component");
  }
  expect_eq(counter->value().item<float>(), 50.0f, "the counter restored");
  expect_eq(metric->value().item<float>(), 100.0f * float(n), "the metric restored so that it sums back");
  return failures == 0 ? 0 : 1;
}


// Model::fit steered from one worker at a time: worker 1 pauses after step 5 and, from another
// thread, sets the learning rate and resumes; the chief requests a checkpoint after step 12 and a
// stop after step 20. Every worker must apply each at the same step (requests ride on the next
// step's reduction; a pause's are agreed in their own collective), and end with the same weights.
// That reduction also gives every worker every replica's loss and every worker's step-time parts
// of the step before, and the stop's reason code (stopped_for).
int steer(MultiWorkerMirroredStrategy& s) {
  const int task = s.cluster_resolver()->task_id();
  auto scope = s.scope();
  nn::BlobOptions blobs;
  blobs.samples = 1024;
  const nn::ClassificationData d = nn::make_blobs(blobs);
  nn::Model model(nn::Sequential({nn::Dense(blobs.features, 32, nn::Activation::relu, 1),
                                  nn::Dense(32, blobs.classes, nn::Activation::none, 2)}));
  model.compile(std::make_shared<nn::SGD>(0.05f), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
  std::int64_t paused = 0, resumed = 0, checkpoint = 0, rate_changed = 0, rate_hook = 0;
  int replica_losses = 0, worker_parts = 0;  // at step 3: keys in the logs
  bool parts_positive = true;
  auto probe = std::make_shared<nn::LambdaCallback>();
  probe->batch_end = [&](std::int64_t, nn::Logs& logs) {
    const std::int64_t step = model.control().step();
    if (step == 3) {
      for (const auto& [name, value] : logs) {
        if (name.rfind("loss/replica_", 0) == 0 && std::isfinite(value)) ++replica_losses;
        if (name.rfind("worker_", 0) == 0 && name.find("/time/step_ms") != std::string::npos) {
          ++worker_parts;
          parts_positive = parts_positive && value > 0;
        }
      }
    }
    if (rate_changed == 0 && std::abs(logs.at("learning_rate") - 0.0125) < 1e-9) rate_changed = step;
    if (task == 1 && step == 5) model.control().pause();
    if (task == 0 && step == 12) model.control().request_checkpoint();
    if (task == 0 && step == 20) model.control().request_stop("stop from the chief");
  };
  probe->checkpoint = [&](std::int64_t step, nn::Logs&) { checkpoint = step; };
  struct Watch : nn::Callback {
    std::int64_t* paused;
    std::int64_t* resumed;
    void on_pause(std::int64_t step) override { *paused = step; }
    void on_resume(std::int64_t step) override { *resumed = step; }
    void on_learning_rate(std::int64_t step, double) override { *rate_hook = step; }
    std::int64_t* rate_hook;
  };
  auto watch = std::make_shared<Watch>();
  watch->paused = &paused;
  watch->resumed = &resumed;
  watch->rate_hook = &rate_hook;
  std::thread steering;
  if (task == 1) {
    steering = std::thread([&] {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!model.control().paused() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      model.control().set_learning_rate(0.0125);
      model.control().resume();
    });
  }
  nn::FitOptions options;
  options.verbose = 0;
  options.callbacks = {probe, watch};
  const auto batches = data::Dataset::from_tensor_slices({d.features, d.labels}).repeat().batch(32, true);
  const nn::History h = model.fit(batches, 2, 20, options);
  if (steering.joinable()) steering.join();
  std::vector<Tensor> weights;
  for (const Variable& v : model.trainable_variables()) weights.push_back(v.value());
  std::cout << "steer paused=" << paused << " resumed=" << resumed << " rate_changed=" << rate_changed
            << " checkpoint=" << checkpoint << " stopped=" << h.stopped_at_step << " steps=" << h.steps
            << " rate_hook=" << rate_hook << " replica_losses=" << replica_losses << " worker_parts=" << worker_parts
            << (parts_positive ? "" : " (not positive)")
            << " stopped_for_chief=" << model.control().stopped_for("stop from the chief")
            << " stopped_for_other=" << model.control().stopped_for("stopped from the dashboard")
            << " weights=" << hash_bits(weights) << "\n";
  std::cout << "reason " << h.stop_reason << "\n";
  return 0;
}


// nn::Model trained through train_step (or, with `via_fit`, through Model::fit with a metric, the
// way examples/mlp_classifier trains), whose gradients are all-reduced in buckets of
// TROUPE_GRADIENT_BUCKET_BYTES while the backward pass runs (0: one all-reduce after it): after
// every step a hash of the weights, which must not depend on the buckets.
int model_train(MultiWorkerMirroredStrategy& s, bool via_fit) {
  const int n = s.num_replicas_in_sync();
  const std::int64_t batch = 16, in = 96, hidden = 64, classes = 10;
  auto scope = s.scope();
  nn::Model model(nn::Sequential({nn::Dense(in, hidden, nn::Activation::relu, 1),
                                  nn::Dense(hidden, hidden, nn::Activation::relu, 2),
                                  nn::Dense(hidden, classes, nn::Activation::none, 3)}));
  if (via_fit) {
    model.compile(std::make_shared<nn::SGD>(0.05f, 0.9f), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
    const std::int64_t samples = 6 * batch * n;
    std::vector<std::int64_t> y(static_cast<std::size_t>(samples));
    for (std::int64_t i = 0; i < samples; ++i) y[static_cast<std::size_t>(i)] = (i * 3 + i / 7) % classes;
    const auto batches = data::Dataset::from_tensor_slices(
                             {nn::glorot_uniform(samples, in, 2000) * 4.0f, Tensor::from_vector(y, {samples})})
                             .batch(batch * n, true);
    auto probe = std::make_shared<nn::LambdaCallback>();
    int step = 0;
    probe->batch_end = [&](std::int64_t, nn::Logs&) {
      std::cout << "step " << step++ << " weights " << model_weights(s, model) << "\n";
    };
    nn::FitOptions options;
    options.verbose = 0;
    options.callbacks = {probe};
    const nn::History h = model.fit(batches, 1, 6, options);
    expect_eq(h.steps, std::int64_t{6}, "fit took 6 steps");
    // The wait for the other worker is a part of the exposed time.
    expect_eq(model.optimizer()->exposed_peer_wait_time() <= model.optimizer()->exposed_all_reduce_time(), true,
              "the exposed wait for another worker within the exposed time");
    std::cout << "exposed " << (model.optimizer()->exposed_all_reduce_time().count() > 0 ? "measured" : "none") << "\n";
    return failures == 0 ? 0 : 1;
  }
  model.compile(std::make_shared<nn::SGD>(0.05f, 0.9f), nn::Loss::sparse_categorical_crossentropy());
  // MW_DIE_AT_STEP: worker 1 dies there, while the others' buckets are on the ring.
  const char* die_at = std::getenv("MW_DIE_AT_STEP");
  for (int step = 0; step < 6; ++step) {
    if (die_at != nullptr && std::atoi(die_at) == step && s.cluster_resolver()->task_id() == 1) {
      std::cout << "dying" << std::endl;
      kill(getpid(), SIGKILL);
    }
    s.run([&] {
      const int id = get_replica_context()->replica_id_in_sync_group();
      const Tensor x = nn::glorot_uniform(batch, in, 2000 + step * 64 + id) * 4.0f;
      std::vector<std::int64_t> y(batch);
      for (std::int64_t i = 0; i < batch; ++i) y[i] = (i * 3 + step + id) % classes;
      return model.train_step({x, Tensor::from_vector(y, {batch})}, batch * n);
    });
    std::cout << "step " << step << " weights " << model_weights(s, model) << "\n";
  }
  // A collective after the buckets uses the ring in the same order on every worker.
  const auto total = s.run([] { return get_replica_context()->all_reduce(ReduceOp::sum, Tensor::full({3}, 1.0f)); });
  expect_eq(s.experimental_local_results(total).front().to_vector<float>(), std::vector<float>(3, static_cast<float>(n)),
            "an all_reduce after bucketed steps");
  std::cout << "exposed " << (model.optimizer()->exposed_all_reduce_time().count() > 0 ? "measured" : "none") << "\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace mw
