#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../common/free_port.hpp"
#include "../common/temp_dir.hpp"
#include "nn/completion_rate.hpp"
#include "nn/epoch_end.hpp"
#include "test_util.hpp"
#include "troupe/troupe.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::message_of;

namespace {

nn::ClassificationData blobs() {
  nn::BlobOptions o;
  o.samples = 512;
  o.features = 8;
  o.classes = 3;
  return nn::make_blobs(o);
}

// The batches every worker reads (and the one-process run): 16 batches of 32, repeated.
data::Dataset batches() {
  const auto d = blobs();
  return data::Dataset::from_tensor_slices({d.features, d.labels}).batch(32, true).repeat();
}

nn::Sequential mlp() {
  return nn::Sequential({nn::Dense(8, 16, nn::Activation::relu, 1), nn::Dense(16, 3, nn::Activation::none, 2)});
}

std::shared_ptr<nn::Optimizer> optimizer_named(const std::string& name) {
  if (name == "sgd") return std::make_shared<nn::SGD>(0.1f);
  if (name == "momentum") return std::make_shared<nn::SGD>(0.05f, 0.9f);
  if (name == "nesterov") return std::make_shared<nn::SGD>(0.05f, 0.9f, true);
  if (name == "adamw") return std::make_shared<nn::AdamW>(0.01f, 0.01f);
  return std::make_shared<nn::Adam>(0.01f);
}

// A chief's ParameterServerStrategy over in-process servers: `workers` workers, two ps tasks.
struct Cluster {
  explicit Cluster(int workers = 1) {
    const auto a = troupe::testing::loopback_addresses(3 + workers);
    ClusterSpec::JobMap jobs{{"chief", {a[0]}}, {"ps", {a[1], a[2]}}};
    for (int w = 0; w < workers; ++w) jobs["worker"].push_back(a[3 + w]);
    spec.emplace(jobs);
    FunctionRegistry functions;
    functions.add_dataset("blobs", [] { return batches(); });
    // Three ids per example, all below 10, and a label of them.
    functions.add_dataset("ids", [] {
      std::vector<std::int64_t> ids(256 * 3), labels(256);
      for (std::size_t i = 0; i < labels.size(); ++i) {
        for (std::size_t j = 0; j < 3; ++j) ids[i * 3 + j] = static_cast<std::int64_t>((i * 7 + j * 3) % 10);
        labels[i] = (ids[i * 3] + ids[i * 3 + 1]) % 2;
      }
      return data::Dataset::from_tensor_slices({Tensor::from_vector(ids, {256, 3}), Tensor::from_vector(labels)})
          .batch(32, true)
          .repeat();
    });
    functions.add_dataset("three_batches", [] {
      const auto d = blobs();
      return data::Dataset::from_tensor_slices({d.features, d.labels}).batch(32, true).take(3);
    });
    for (int w = 0; w < workers; ++w) {
      runtimes.push_back(std::make_unique<Runtime>());
      servers.push_back(std::make_unique<Server>(*runtimes.back(), *spec, "worker", w, functions, ServerOptions{}));
    }
    for (int p = 0; p < 2; ++p) {
      runtimes.push_back(std::make_unique<Runtime>());
      servers.push_back(std::make_unique<Server>(*runtimes.back(), *spec, "ps", p, FunctionRegistry{}, ServerOptions{}));
    }
    strategy.emplace(chief_rt, std::make_shared<SimpleClusterResolver>(*spec, "chief", 0),
                     std::make_shared<FixedShardsPartitioner>(2), ServerOptions{});
  }

  // The MLP made and compiled in the strategy's scope: its variables on the ps tasks.
  nn::Model model(const std::string& optimizer, std::vector<std::string> metrics = {}) {
    auto scope = strategy->scope();
    nn::Model m(mlp());
    m.compile(optimizer_named(optimizer), nn::Loss::sparse_categorical_crossentropy(), std::move(metrics));
    return m;
  }

  std::optional<ClusterSpec> spec;
  std::vector<std::unique_ptr<Runtime>> runtimes;
  std::vector<std::unique_ptr<Server>> servers;
  Runtime chief_rt;
  std::optional<ParameterServerStrategy> strategy;
};

nn::FitOptions quiet() {
  nn::FitOptions o;
  o.verbose = 0;
  return o;
}

}  // namespace

TEST_CASE("an epoch's end run again (training rolled back to a checkpoint of an earlier epoch) keeps one History entry per epoch, the latest") {
  nn::Model model(mlp());
  model.compile(optimizer_named("sgd"), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
  const nn::FitOptions options = quiet();
  const std::vector<std::shared_ptr<nn::Callback>> callbacks;
  nn::History history;
  bool stopped = false;
  const auto end_epoch = [&](int epoch, double loss) {
    nn::detail::EpochSums sums;
    sums.loss = loss * 4;
    sums.steps = 4;
    sums.samples = 32;
    nn::Logs logs;
    nn::detail::close_epoch({model, options, callbacks, model.control(), history, stopped, 0}, epoch, sums, 1.0, logs);
  };
  end_epoch(0, 3.0);
  end_epoch(1, 2.0);
  end_epoch(2, 1.5);
  // Rolled back into epoch 1: it ends again, then epoch 2 again.
  end_epoch(1, 1.9);
  CHECK(history.epoch == std::vector<int>{0, 1});
  CHECK(history.loss == std::vector<double>{3.0, 1.9});
  CHECK(history.history.at("loss") == std::vector<double>{3.0, 1.9});
  CHECK(history.history.at("accuracy").size() == 2);
  CHECK(history.seconds.size() == 2);
  end_epoch(2, 1.4);
  CHECK(history.epoch == std::vector<int>{0, 1, 2});
  CHECK(history.loss == std::vector<double>{3.0, 1.9, 1.4});
  CHECK(history.samples_per_second.size() == 3);
}

TEST_CASE("fit's rate under ParameterServerStrategy stays level when results are taken in bursts") {
  using troupe::nn::detail::CompletionRate;
  using namespace std::chrono_literals;
  const auto t0 = CompletionRate::Clock::time_point{} + 1s;
  // Two workers, 4 closures in flight, each of 64 samples: every 100 ms two results are taken,
  // the second 10 us after the first (it had arrived while fit waited for the older one): 1280
  // samples/s. Measured from the previous take alone, every second result would read 6.4 M/s.
  CompletionRate rate(4, 1s);
  rate.restart(t0);
  CHECK(rate.samples_per_second() == 0.0);
  CHECK(rate.step_ms() == 0.0);
  double low = 1e30, high = 0;
  for (int i = 1; i <= 50; ++i) {
    const auto at = t0 + std::chrono::milliseconds(100 * i);
    rate.add(at, 1, 64);
    high = std::max(high, rate.samples_per_second());
    if (i > 10) low = std::min(low, rate.samples_per_second());  // once the window spans its second
    rate.add(at + 10us, 1, 64);
    high = std::max(high, rate.samples_per_second());
    if (i > 10) low = std::min(low, rate.samples_per_second());
  }
  CHECK(rate.samples_per_second() == doctest::Approx(1280.0).epsilon(0.01));
  CHECK(rate.step_ms() == doctest::Approx(50.0).epsilon(0.01));
  // Never a spike; over a second and 4 results at least, the bursts move the rate by a tenth at most.
  CHECK(high < 1.15 * 1280.0);
  CHECK(low > 0.85 * 1280.0);
  // A pause of 10 s, then a restart: the pause counts for nothing.
  const auto later = t0 + 15s;
  rate.restart(later);
  rate.add(later + 100ms, 2, 128);
  CHECK(rate.samples_per_second() == doctest::Approx(1280.0));
  CHECK(rate.step_ms() == doctest::Approx(50.0));
}

TEST_CASE("fit under ParameterServerStrategy with one worker gives fit's weights in one process, bit for bit") {
  // One worker runs its closures one at a time, each reading the variables after the ps tasks
  // applied the one before: the updates of one process, with the ps tasks' optimizers (nn's bits).
  for (const std::string name : {"sgd", "momentum", "nesterov", "adam", "adamw"}) {
    CAPTURE(name);
    Cluster cluster;
    nn::Model model = cluster.model(name, {"accuracy"});
    nn::FitOptions options = quiet();
    options.steps_per_execution = name == "adam" ? 3 : 1;
    const nn::History h = model.fit(nn::DatasetCreator("blobs"), 2, 7, options);

    nn::Model local(mlp());
    local.compile(optimizer_named(name), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
    const nn::History expected = local.fit(batches(), 2, 7, quiet());

    REQUIRE(h.loss.size() == 2);
    CHECK(h.steps == 14);
    CHECK(h.samples == 14 * 32);
    CHECK(h.loss == expected.loss);
    CHECK(h.history.at("accuracy") == expected.history.at("accuracy"));
    CHECK(h.loss[1] < h.loss[0]);
    const auto remote = model.trainable_variables();
    const auto here = local.trainable_variables();
    REQUIRE(remote.size() == here.size());
    for (std::size_t i = 0; i < remote.size(); ++i) {
      CAPTURE(remote[i].name());
      CHECK(remote[i].value().equals(here[i].value()));
    }
    CHECK(model.optimizer()->iterations().value().item<std::int64_t>() == 14);
  }
}

TEST_CASE("fit under ParameterServerStrategy with two workers trains asynchronously and the loss falls") {
  Cluster cluster(2);
  nn::Model model = cluster.model("adam");
  const nn::History h = model.fit(nn::DatasetCreator("blobs"), 3, 10, quiet());
  REQUIRE(h.loss.size() == 3);
  CHECK(h.steps == 30);
  CHECK(h.loss[2] < 0.85 * h.loss[0]);  // about 0.7 measured: the mean loss of epoch 3 against epoch 1
  // Unnamed layers made in the scope: each variable found its own name on the ps tasks.
  std::vector<std::string> names;
  for (const auto& v : cluster.strategy->variables()) names.push_back(v.name);
  CHECK(names == std::vector<std::string>{"kernel", "bias", "kernel_1", "bias_1", "adam/iterations"});
}

TEST_CASE("fit under ParameterServerStrategy updates an Embedding's table only in the rows its batches looked up") {
  // AdamW decays every row it updates, gradient or not: a dense update would move rows 10..19.
  Cluster cluster;
  std::optional<nn::Model> model;
  {
    auto scope = cluster.strategy->scope();
    model.emplace(nn::Sequential({nn::Embedding(20, 4, 1), nn::Flatten(), nn::Dense(12, 2, nn::Activation::none, 2)}));
    model->compile(std::make_shared<nn::AdamW>(0.01f, 0.1f), nn::Loss::sparse_categorical_crossentropy());
  }
  const std::vector<float> before = model->trainable_variables()[0].value().to_vector<float>();
  const nn::History h = model->fit(nn::DatasetCreator("ids"), 1, 8, quiet());
  CHECK(h.steps == 8);
  const std::vector<float> after = model->trainable_variables()[0].value().to_vector<float>();
  REQUIRE(after.size() == 80);
  for (std::size_t i = 40; i < 80; ++i) CHECK(after[i] == before[i]);  // rows 10..19: never looked up
  int moved = 0;
  for (std::size_t i = 0; i < 40; ++i) moved += after[i] != before[i] ? 1 : 0;
  CHECK(moved == 40);
}

TEST_CASE("fit under ParameterServerStrategy names each mistake") {
  Cluster cluster;
  nn::Model model = cluster.model("sgd");
  const nn::DatasetCreator creator("blobs");
  CHECK(contains(message_of([&] { model.fit(creator, 1, -1, quiet()); }), "steps_per_epoch is required"));
  nn::FitOptions zero = quiet();
  zero.steps_per_execution = 0;
  CHECK(contains(message_of([&] { model.fit(creator, 1, 4, zero); }), "steps_per_execution is 0"));
  CHECK(contains(message_of([&] { model.fit(batches(), 1, 4, quiet()); }), "pass an nn::DatasetCreator"));
  CHECK(contains(message_of([] { nn::DatasetCreator empty(""); }), "the dataset function's name is empty"));

  // A closure that fails on its worker: the worker and the cause are named, and the coordinator is
  // left clean for the next fit.
  const std::string unknown = message_of([&] { model.fit(nn::DatasetCreator("nope"), 1, 4, quiet()); });
  CAPTURE(unknown);
  CHECK(contains(unknown, "dataset function 'nope' is not registered on /job:worker/replica:0/task:0"));
  const std::string ended = message_of([&] { model.fit(nn::DatasetCreator("three_batches"), 1, 5, quiet()); });
  CAPTURE(ended);
  CHECK(contains(ended, "ended on /job:worker/replica:0/task:0"));
  CHECK(contains(ended, "repeat() the dataset"));
  CHECK(model.fit(creator, 1, 4, quiet()).steps == 4);

  // An optimizer the ps tasks cannot apply is refused before anything is scheduled.
  {
    auto scope = cluster.strategy->scope();
    nn::Model scaled(nn::Sequential({nn::Dense(8, 3, nn::Activation::none, 3, "scaled")}));
    scaled.compile(std::make_shared<nn::LossScaleOptimizer>(std::make_shared<nn::SGD>(0.1f)),
                   nn::Loss::sparse_categorical_crossentropy());
    CHECK(contains(message_of([&] { scaled.fit(creator, 1, 4, quiet()); }), "a LossScaleOptimizer"));
  }
  // A DatasetCreator under another strategy.
  nn::Model local(mlp());
  local.compile(std::make_shared<nn::SGD>(0.1f), nn::Loss::sparse_categorical_crossentropy());
  CHECK(contains(message_of([&] { local.fit(creator, 1, 4, quiet()); }), "trains under ParameterServerStrategy only"));
  nn::FitOptions two = quiet();
  two.steps_per_execution = 2;
  CHECK(contains(message_of([&] { local.fit(batches(), 1, 4, two); }), "steps_per_execution is 2"));
  // troupe's own names are troupe's.
  FunctionRegistry r;
  CHECK(contains(message_of([&] { r.add("troupe.fit.train_step", [](FunctionContext&) { return std::vector<Tensor>{}; }); }),
                 "names troupe's own functions"));
}

TEST_CASE("fit under ParameterServerStrategy runs callbacks and controls at closure boundaries") {
  Cluster cluster;
  nn::Model model = cluster.model("sgd");
  const nn::DatasetCreator creator("blobs");

  SUBCASE("steps_per_execution: one batch callback per closure, with its last step's index") {
    auto calls = std::make_shared<std::vector<std::int64_t>>();
    auto steps = std::make_shared<std::vector<std::int64_t>>();
    auto cb = std::make_shared<nn::LambdaCallback>();
    cb->batch_end = [calls](std::int64_t batch, nn::Logs& logs) {
      calls->push_back(batch);
      CHECK(logs.count("loss") == 1);
    };
    nn::FitOptions options = quiet();
    options.steps_per_execution = 3;
    options.callbacks = {cb};
    options.on_step_end = [steps](std::int64_t step, double) { steps->push_back(step); };
    const nn::History h = model.fit(creator, 2, 7, options);
    CHECK(*calls == std::vector<std::int64_t>{2, 5, 6, 2, 5, 6});
    CHECK(h.steps == 14);
    CHECK(steps->size() == 14);
    CHECK(steps->back() == 14);
  }
  SUBCASE("a learning rate reaches the closures scheduled after it; a stop ends training") {
    auto rates = std::make_shared<std::vector<double>>();
    auto cb = std::make_shared<nn::LambdaCallback>();
    nn::Model* m = &model;
    cb->batch_end = [rates, m](std::int64_t batch, nn::Logs& logs) {
      rates->push_back(logs.at("learning_rate"));
      if (batch == 1) m->control().set_learning_rate(0.25);
      if (batch == 5) m->control().request_stop("enough");
    };
    nn::FitOptions options = quiet();
    options.callbacks = {cb};
    const nn::History h = model.fit(creator, 3, 8, options);
    CHECK(h.stop_reason == "enough");
    CHECK(h.steps >= 6);
    CHECK(h.steps <= 8);  // the closures in flight at the stop finish, nothing more is scheduled
    CHECK(h.stopped_at_step == h.steps);
    REQUIRE(rates->size() >= 6);
    CHECK((*rates)[0] == doctest::Approx(0.1));
    CHECK(rates->back() == doctest::Approx(0.25));
    CHECK(model.optimizer()->learning_rate() == doctest::Approx(0.25f));
  }
  SUBCASE("a checkpoint waits for the closures in flight; a pause holds until resumed") {
    auto checkpoints = std::make_shared<std::vector<std::int64_t>>();
    auto seen_iterations = std::make_shared<std::vector<std::int64_t>>();
    auto pauses = std::make_shared<std::atomic<int>>(0);
    auto resumes = std::make_shared<std::atomic<int>>(0);
    struct Watch : nn::Callback {
      std::shared_ptr<std::vector<std::int64_t>> checkpoints, iterations;
      std::shared_ptr<std::atomic<int>> pauses, resumes;
      nn::Model* model = nullptr;
      void on_train_batch_end(std::int64_t batch, nn::Logs&) override {
        if (batch == 2) model->control().request_checkpoint();
        if (batch == 4) model->control().pause();
      }
      void on_checkpoint(std::int64_t step, nn::Logs&) override {
        checkpoints->push_back(step);
        iterations->push_back(model->optimizer()->iterations().value().item<std::int64_t>());
      }
      void on_pause(std::int64_t) override {
        ++*pauses;
        std::thread([m = model] {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          m->control().resume();
        }).detach();
      }
      void on_resume(std::int64_t) override { ++*resumes; }
    };
    auto watch = std::make_shared<Watch>();
    watch->checkpoints = checkpoints;
    watch->iterations = seen_iterations;
    watch->pauses = pauses;
    watch->resumes = resumes;
    watch->model = &model;
    nn::FitOptions options = quiet();
    options.callbacks = {watch};
    const auto t0 = std::chrono::steady_clock::now();
    const nn::History h = model.fit(creator, 1, 8, options);
    CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(100));
    CHECK(h.steps == 8);
    CHECK(h.stop_reason.empty());
    REQUIRE(checkpoints->size() == 1);
    CHECK((*checkpoints)[0] >= 3);
    CHECK((*seen_iterations)[0] == (*checkpoints)[0]);  // every closure counted had been applied
    CHECK(pauses->load() == 1);
    CHECK(resumes->load() == 1);
  }
}

namespace {

// Every trainable variable of `a` and `b` has the same bits.
void check_same_weights(const nn::Model& a, const nn::Model& b) {
  const auto x = a.trainable_variables();
  const auto y = b.trainable_variables();
  REQUIRE(x.size() == y.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    CAPTURE(i);
    CHECK(x[i].value().equals(y[i].value()));
  }
}

}  // namespace

TEST_CASE("Model::save under ParameterServerStrategy keeps Adam's slots: load_model rebuilds it without a cluster and on the ps tasks again") {
  troupe::testing::temp_dir dir("ps-save");
  Cluster cluster;
  nn::Model model = cluster.model("adam");
  model.fit(nn::DatasetCreator("blobs"), 1, 5, quiet());
  const std::string saved = dir.file("model");
  model.save(saved);
  CHECK(std::filesystem::is_regular_file(std::filesystem::path(saved) / "variables" / "manifest.json"));
  const Tensor x = blobs().features.slice(0, 64);
  const Tensor trained = model.predict(x);

  nn::Model local = nn::load_model(saved);  // no strategy: this process's variables
  CHECK(local.predict(x).equals(trained));
  CHECK(local.optimizer()->iterations().value().item<std::int64_t>() == 5);
  std::optional<nn::Model> again;  // in the strategy's scope: new variables on the ps tasks
  {
    auto scope = cluster.strategy->scope();
    again.emplace(nn::load_model(saved));
  }
  CHECK(again->predict(x).equals(trained));
  // Adam's moments and steps came back with the weights: 5 more steps continue the saved model's
  // training bit for bit, on the ps tasks and here (each fit starts the datasets over).
  model.fit(nn::DatasetCreator("blobs"), 1, 5, quiet());
  again->fit(nn::DatasetCreator("blobs"), 1, 5, quiet());
  local.fit(batches(), 1, 5, quiet());
  check_same_weights(again.value(), model);
  check_same_weights(local, model);
  CHECK(again->optimizer()->iterations().value().item<std::int64_t>() == 10);
}

TEST_CASE("ModelCheckpoint under ParameterServerStrategy writes sharded checkpoints that a model without a cluster restores") {
  troupe::testing::temp_dir dir("ps-model-ckpt");
  Cluster cluster;
  nn::Model model = cluster.model("momentum");
  auto checkpoint = std::make_shared<nn::ModelCheckpoint>(dir.file("epoch-{epoch}"), "loss");
  nn::FitOptions options = quiet();
  options.callbacks = {checkpoint};
  model.fit(nn::DatasetCreator("blobs"), 2, 4, options);
  REQUIRE(checkpoint->saved().size() == 2);
  CHECK(std::filesystem::is_regular_file(std::filesystem::path(checkpoint->saved()[1]) / "manifest.json"));

  // The weights, the momentum slots and the step, into this process's copy of the model.
  nn::Model local(mlp());
  local.compile(optimizer_named("momentum"), nn::Loss::sparse_categorical_crossentropy());
  Checkpoint restored(local.variables());
  restored.restore(checkpoint->saved()[1]);
  CHECK(restored.step() == 8);
  check_same_weights(local, model);
  CHECK(local.optimizer()->iterations().value().item<std::int64_t>() == 8);
  model.fit(nn::DatasetCreator("blobs"), 1, 3, quiet());
  local.fit(batches(), 1, 3, quiet());
  check_same_weights(local, model);
  // What it does not hold is named: another optimizer's step and slots.
  nn::Model adam(mlp());
  adam.compile(optimizer_named("adam"), nn::Loss::sparse_categorical_crossentropy());
  CHECK(contains(message_of([&] { Checkpoint(adam.variables()).restore(checkpoint->saved()[1]); }),
                 "no variable 'adam/iterations' in it"));
  Checkpoint adam_slot({{"sgd/m/dense_0/kernel", local.variables().at("sgd/momentum/dense_0/kernel")}});
  CHECK(contains(message_of([&] { adam_slot.restore(checkpoint->saved()[1]); }),
                 "no slot 'm' of variable 'dense_0/kernel' for 'sgd/m/dense_0/kernel': the ps tasks' optimizer kept 'momentum'"));
}

}  // namespace TROUPE_TEST_FILE
