#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <csignal>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "../common/temp_dir.hpp"
#include "test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::cpus;
using troupe::testing::message_of;

namespace {

nn::FitOptions quiet() {
  nn::FitOptions o;
  o.verbose = 0;
  return o;
}

nn::Sequential small_mlp(std::uint64_t seed) {
  return nn::Sequential({nn::Dense(8, 16, nn::Activation::relu, seed), nn::Dense(16, 3, nn::Activation::none, seed + 1)});
}

nn::ClassificationData blobs(std::int64_t samples) {
  nn::BlobOptions o;
  o.samples = samples;
  o.features = 8;
  o.classes = 3;
  return nn::make_blobs(o);
}

// 64 rows of 8 features in batches of 8; the rows of batch `nan_batch` (0-based) hold a NaN.
data::Dataset batches_with_nan(int nan_batch) {
  nn::ClassificationData d = blobs(64);
  std::vector<float> x = d.features.to_vector<float>();
  x[static_cast<std::size_t>(nan_batch * 8 * 8)] = std::numeric_limits<float>::quiet_NaN();
  return data::Dataset::from_tensor_slices({Tensor::from_vector(x, d.features.shape()), d.labels}).batch(8);
}

std::vector<Tensor> weights_of(const nn::Model& model) {
  std::vector<Tensor> out;
  for (const Variable& v : model.trainable_variables()) out.push_back(v.value());
  return out;
}

bool same_weights(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].equals(b[i])) return false;
  }
  return true;
}

// A callback that puts a made-up monitored value into the epoch's logs, from a list.
std::shared_ptr<nn::LambdaCallback> feed(const std::string& name, std::vector<double> values) {
  auto c = std::make_shared<nn::LambdaCallback>();
  c->epoch_end = [name, values](int epoch, nn::Logs& logs) { logs[name] = values.at(static_cast<std::size_t>(epoch)); };
  return c;
}

}  // namespace

TEST_CASE("TerminateOnNaN stops fit at the step whose loss is NaN, and no checkpoint is written after it") {
  testing::temp_dir dir("nan");
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  nn::Model model(small_mlp(1));
  model.compile(std::make_shared<nn::SGD>(0.05f), nn::Loss::sparse_categorical_crossentropy());
  auto checkpoint = std::make_shared<nn::ModelCheckpoint>(dir.file("ckpt-{step}"), "loss", 0, false, false, "auto", 1);
  auto probe = std::make_shared<nn::LambdaCallback>();
  int epoch_ends = 0;
  std::vector<std::int64_t> requested;
  probe->batch_end = [&](std::int64_t, nn::Logs&) { model.control().request_checkpoint(); };
  probe->checkpoint = [&](std::int64_t step, nn::Logs&) { requested.push_back(step); };
  probe->epoch_end = [&](int, nn::Logs&) { ++epoch_ends; };
  nn::FitOptions o = quiet();
  o.callbacks = {std::make_shared<nn::TerminateOnNaN>(), checkpoint, probe};
  // Batch 5 of the first epoch: step 6.
  nn::History h = model.fit(batches_with_nan(5), 3, -1, o);
  CHECK(h.non_finite_step == 6);
  CHECK(h.steps == 6);
  CHECK(h.stopped_at_step == 6);
  CHECK(contains(h.stop_reason, "TerminateOnNaN: the loss is nan at step 6 (epoch 1, batch 6)"));
  CHECK(epoch_ends == 0);  // the poisoned epoch is not reported
  CHECK(h.loss.size() == 1);
  REQUIRE(checkpoint->saved().size() == 5);
  CHECK(checkpoint->saved().back() == dir.file("ckpt-5.ckpt"));
  CHECK_FALSE(std::filesystem::exists(dir.file("ckpt-6.ckpt")));
  CHECK(requested == std::vector<std::int64_t>{1, 2, 3, 4, 5});
  // The last checkpoint holds finite weights.
  nn::Model restored(small_mlp(99));
  restored.compile(std::make_shared<nn::SGD>(0.05f), nn::Loss::sparse_categorical_crossentropy());
  Checkpoint(restored.variables()).restore(dir.file("ckpt-5.ckpt"));
  for (const Tensor& w : weights_of(restored)) {
    for (float v : w.to_vector<float>()) REQUIRE(std::isfinite(v));
  }

  // Without TerminateOnNaN training goes on, as in Keras, and ModelCheckpoint still refuses.
  nn::Model model2(small_mlp(1));
  model2.compile(std::make_shared<nn::SGD>(0.05f), nn::Loss::sparse_categorical_crossentropy());
  testing::temp_dir dir2("nan2");
  auto checkpoint2 = std::make_shared<nn::ModelCheckpoint>(dir2.file("ckpt-{step}"), "loss", 0, false, false, "auto", 1);
  o.callbacks = {checkpoint2};
  nn::History h2 = model2.fit(batches_with_nan(5), 2, -1, o);
  CHECK(h2.steps == 16);
  CHECK(h2.non_finite_step == 6);
  CHECK(h2.stop_reason.empty());
  CHECK(checkpoint2->saved().size() == 5);
}

TEST_CASE("EarlyStopping stops fit after patience epochs without an improvement, with Keras's rules") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  const nn::ClassificationData d = blobs(128);
  const data::Dataset batches = data::Dataset::from_tensor_slices({d.features, d.labels}).batch(32);
  struct Case {
    std::vector<double> values;
    std::string monitor;
    double min_delta;
    int patience;
    std::optional<double> baseline;
    int stopped_epoch;  // 0: ran every epoch
    int best_epoch;
  };
  const std::vector<Case> cases = {
      {{1.0, 0.5, 0.6, 0.7, 0.4, 0.3}, "val_score", 0.0, 2, std::nullopt, 3, 1},
      {{1.0, 0.95, 0.9, 0.85, 0.8, 0.75}, "val_score", 0.1, 1, std::nullopt, 1, 0},
      {{1.0, 0.95, 0.9, 0.85, 0.8, 0.75}, "val_score", 0.01, 1, std::nullopt, 0, 5},
      {{0.5, 0.6, 0.55, 0.58, 0.7, 0.8}, "val_accuracy", 0.0, 2, std::nullopt, 3, 1},  // "acc": higher is better
      {{0.9, 0.8, 0.7, 0.6, 0.5, 0.4}, "val_score", 0.0, 2, 0.5, 1, 1},                // never beats the baseline
  };
  for (const Case& c : cases) {
    CAPTURE(c.monitor);
    CAPTURE(c.min_delta);
    nn::Model model(small_mlp(3));
    model.compile(std::make_shared<nn::SGD>(0.05f), nn::Loss::sparse_categorical_crossentropy());
    auto early = std::make_shared<nn::EarlyStopping>(c.monitor, c.min_delta, c.patience, 0, "auto", c.baseline);
    nn::FitOptions o = quiet();
    o.callbacks = {feed(c.monitor, c.values), early};
    nn::History h = model.fit(batches, 6, -1, o);
    CHECK(early->stopped_epoch() == c.stopped_epoch);
    CHECK(h.loss.size() == static_cast<std::size_t>(c.stopped_epoch == 0 ? 6 : c.stopped_epoch + 1));
    CHECK(h.steps == static_cast<std::int64_t>(h.loss.size()) * 4);
    CHECK(early->best_epoch() == c.best_epoch);
    if (c.stopped_epoch == 0) {
      CHECK(h.stop_reason.empty());
    } else {
      CHECK(contains(h.stop_reason, "EarlyStopping: " + c.monitor + " did not improve"));
    }
  }

  // restore_best_weights: the model ends with the weights of the best epoch's end.
  nn::Model model(small_mlp(3));
  model.compile(std::make_shared<nn::SGD>(0.05f), nn::Loss::sparse_categorical_crossentropy());
  std::vector<std::vector<Tensor>> at_epoch_end;
  auto snapshot = std::make_shared<nn::LambdaCallback>();
  snapshot->epoch_end = [&](int, nn::Logs&) { at_epoch_end.push_back(weights_of(model)); };
  nn::FitOptions o = quiet();
  o.callbacks = {snapshot, feed("val_score", {1.0, 0.5, 0.6, 0.7, 0.8}),
                 std::make_shared<nn::EarlyStopping>("val_score", 0.0, 2, 0, "min", std::nullopt, true)};
  model.fit(batches, 5, -1, o);
  REQUIRE(at_epoch_end.size() == 4);
  CHECK_FALSE(same_weights(at_epoch_end[1], at_epoch_end[3]));
  CHECK(same_weights(weights_of(model), at_epoch_end[1]));
  for (const Variable& v : model.trainable_variables()) {
    const auto components = s.experimental_local_results(v);
    CHECK(components[0].equals(components[1]));
  }

  CHECK(contains(message_of([] { nn::EarlyStopping("loss", 0, 0, 0, "largest"); }),
                 "EarlyStopping: mode \"largest\" (expected \"auto\", \"min\" or \"max\")"));
  CHECK(contains(message_of([] { nn::EarlyStopping("loss", -1); }), "min_delta"));
}

TEST_CASE("LearningRateScheduler sets the rate every epoch, and the updates use it") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(1));
  auto scope = s.scope();
  const nn::ClassificationData d = blobs(16);
  nn::Model model(nn::Sequential({nn::Dense(8, 3, nn::Activation::none, 5)}));
  model.compile(std::make_shared<nn::SGD>(0.5f), nn::Loss::sparse_categorical_crossentropy());
  auto schedule = [](int epoch, double lr) { return epoch == 0 ? 0.1 : lr * 0.5; };
  std::vector<double> logged;
  std::vector<double> worst_error;
  std::vector<Tensor> before;
  Tensor gradient;
  auto probe = std::make_shared<nn::LambdaCallback>();
  probe->batch_begin = [&](std::int64_t, nn::Logs&) {
    before = weights_of(model);
    gradient = model.compute_gradients(d.features, d.labels, 16).gradients[0];
  };
  probe->batch_end = [&](std::int64_t, nn::Logs& logs) {
    logged.push_back(logs.at("learning_rate"));
    // SGD: kernel -= learning_rate * gradient.
    const auto expected = (before[0] - gradient * static_cast<float>(logs.at("learning_rate"))).to_vector<float>();
    const auto got = weights_of(model)[0].to_vector<float>();
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - expected[i]));
    worst_error.push_back(worst);
  };
  nn::FitOptions o = quiet();
  o.callbacks = {std::make_shared<nn::LearningRateScheduler>(schedule), probe};
  nn::History h = model.fit(data::Dataset::from_tensors({d.features, d.labels}), 4, -1, o);
  REQUIRE(logged.size() == 4);
  CHECK(logged[0] == doctest::Approx(0.1).epsilon(1e-6));
  CHECK(logged[1] == doctest::Approx(0.05).epsilon(1e-6));
  CHECK(logged[2] == doctest::Approx(0.025).epsilon(1e-6));
  CHECK(logged[3] == doctest::Approx(0.0125).epsilon(1e-6));
  for (double e : worst_error) CHECK(e < 1e-6);
  CHECK(model.optimizer()->learning_rate() == doctest::Approx(0.0125).epsilon(1e-6));

  auto bad = std::make_shared<nn::LearningRateScheduler>([](int epoch, double) { return epoch == 2 ? -1.0 : 0.1; });
  o.callbacks = {bad};
  CHECK(contains(message_of([&] { model.fit(data::Dataset::from_tensors({d.features, d.labels}), 4, -1, o); }),
                 "LearningRateScheduler: the schedule returned -1.000000 for epoch 2"));
}

TEST_CASE("ModelCheckpoint writes per epoch with Keras's file names, per steps, and only improvements") {
  testing::temp_dir dir("ckpt");
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  const nn::ClassificationData d = blobs(80);
  const data::Dataset batches = data::Dataset::from_tensor_slices({d.features, d.labels}).batch(8);  // 10 steps
  nn::Model model(small_mlp(7));
  model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
  std::vector<std::vector<Tensor>> at_epoch_end;
  auto snapshot = std::make_shared<nn::LambdaCallback>();
  snapshot->epoch_end = [&](int, nn::Logs&) { at_epoch_end.push_back(weights_of(model)); };
  auto every_epoch = std::make_shared<nn::ModelCheckpoint>(dir.file("model-{epoch:02d}-{loss:.3f}"), "loss");
  auto every_4 = std::make_shared<nn::ModelCheckpoint>(dir.file("steps/s{step}"), "loss", 0, false, true, "auto", 4);
  auto best = std::make_shared<nn::ModelCheckpoint>(dir.file("best/e{epoch}"), "val_score", 0, true);
  nn::FitOptions o = quiet();
  o.callbacks = {snapshot, feed("val_score", {1.0, 0.5, 0.7, 0.3}), every_epoch, every_4, best};
  nn::History h = model.fit(batches, 4, -1, o);
  REQUIRE(every_epoch->saved().size() == 4);
  for (int e = 0; e < 4; ++e) {
    std::ostringstream name;
    name << "model-0" << e + 1 << "-" << std::fixed << std::setprecision(3) << h.loss[static_cast<std::size_t>(e)]
         << ".ckpt";
    CHECK(every_epoch->saved()[static_cast<std::size_t>(e)] == dir.file(name.str()));
    CHECK(std::filesystem::exists(dir.file(name.str())));
  }
  // The second epoch's file restores the second epoch's weights, optimizer slots included.
  nn::Model restored(small_mlp(70));
  restored.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
  Checkpoint(restored.variables()).restore(every_epoch->saved()[1]);
  CHECK(same_weights(weights_of(restored), at_epoch_end[1]));

  std::vector<std::string> expected_steps;
  for (int step = 4; step <= 40; step += 4) expected_steps.push_back(dir.file("steps/s" + std::to_string(step) + ".ckpt"));
  CHECK(every_4->saved() == expected_steps);
  // save_weights_only: the layers' variables, not Adam's slots.
  nn::Model weights_only(small_mlp(71));
  Checkpoint(weights_only.layers().variables()).restore(every_4->saved().back());
  CHECK(same_weights(weights_of(weights_only), at_epoch_end[3]));
  CHECK(contains(message_of([&] {
                   nn::Model m(small_mlp(72));
                   m.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
                   Checkpoint(m.variables()).restore(every_4->saved().back());
                 }),
                 every_4->saved().back()));

  CHECK(best->saved() ==
        std::vector<std::string>{dir.file("best/e1.ckpt"), dir.file("best/e2.ckpt"), dir.file("best/e4.ckpt")});

  CHECK(contains(message_of([&] { nn::ModelCheckpoint(""); }), "ModelCheckpoint: the filepath is empty"));
  CHECK(contains(message_of([&] { nn::ModelCheckpoint(dir.file("x-{epoch")); }), "has a '{' without '}'"));
  auto unknown = std::make_shared<nn::ModelCheckpoint>(dir.file("x-{val_nope}"));
  o.callbacks = {unknown};
  CHECK(contains(message_of([&] { model.fit(batches, 1, -1, o); }), "the filepath names \"val_nope\", which is not in the logs"));
}

TEST_CASE("TrainingControl stops, pauses, resumes, checkpoints and sets the learning rate at step boundaries") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  const nn::ClassificationData d = blobs(64);
  const data::Dataset batches = data::Dataset::from_tensor_slices({d.features, d.labels}).repeat().batch(8);
  nn::Model model(small_mlp(11));
  model.compile(std::make_shared<nn::SGD>(0.1f), nn::Loss::sparse_categorical_crossentropy());

  // Stop from a callback after step 5.
  auto stopper = std::make_shared<nn::LambdaCallback>();
  stopper->batch_end = [&](std::int64_t, nn::Logs&) {
    if (model.control().step() == 5) model.control().stop_training("enough");
  };
  nn::FitOptions o = quiet();
  o.callbacks = {stopper};
  nn::History h = model.fit(batches, 3, 10, o);
  CHECK(h.steps == 5);
  CHECK(h.stop_reason == "enough");
  CHECK(h.stopped_at_step == 5);

  // Pause after step 3 from a callback; another thread sees training held, sets the rate and
  // resumes; a checkpoint requested at step 2 reaches on_checkpoint at step 2.
  std::vector<std::int64_t> paused_at, resumed_at, checkpoints;
  std::map<std::int64_t, double> rate_at;
  auto probe = std::make_shared<nn::LambdaCallback>();
  probe->batch_end = [&](std::int64_t, nn::Logs& logs) {
    const std::int64_t step = model.control().step();
    rate_at[step] = logs.at("learning_rate");
    if (step == 2) model.control().request_checkpoint();
    if (step == 3) model.control().pause();
  };
  probe->checkpoint = [&](std::int64_t step, nn::Logs&) { checkpoints.push_back(step); };
  struct Watch : nn::Callback {
    std::vector<std::int64_t>* paused;
    std::vector<std::int64_t>* resumed;
    void on_pause(std::int64_t step) override { paused->push_back(step); }
    void on_resume(std::int64_t step) override { resumed->push_back(step); }
  };
  auto watch = std::make_shared<Watch>();
  watch->paused = &paused_at;
  watch->resumed = &resumed_at;
  bool held = false;
  std::thread steer([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!model.control().paused() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    const std::int64_t step = model.control().step();
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    held = model.control().paused() && step == 3 && model.control().step() == 3;
    model.control().set_learning_rate(0.025);
    model.control().resume();
  });
  o.callbacks = {probe, watch};
  h = model.fit(batches, 1, 10, o);
  steer.join();
  CHECK(held);
  CHECK(h.steps == 10);
  CHECK(h.stop_reason.empty());
  CHECK(paused_at == std::vector<std::int64_t>{3});
  CHECK(resumed_at == std::vector<std::int64_t>{3});
  CHECK(checkpoints == std::vector<std::int64_t>{2});
  CHECK(rate_at.at(3) == doctest::Approx(0.1));
  CHECK(rate_at.at(4) == doctest::Approx(0.025));
  CHECK(model.optimizer()->learning_rate() == doctest::Approx(0.025));
  CHECK(contains(message_of([&] { model.control().set_learning_rate(-2); }), "set_learning_rate: -2"));
}

TEST_CASE("fit computes accuracy and validation metrics into the logs and History") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  const nn::ClassificationData d = blobs(512);
  const nn::ClassificationData v = [] {
    nn::BlobOptions o;
    o.samples = 128;
    o.features = 8;
    o.classes = 3;
    o.seed = 2;
    return nn::make_blobs(o);
  }();
  nn::Model model(small_mlp(13));
  CHECK(contains(message_of([&] {
                   model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy(), {"f1"});
                 }),
                 "Model::compile: unknown metric 'f1'"));
  model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
  std::vector<double> step_accuracy;
  auto probe = std::make_shared<nn::LambdaCallback>();
  probe->batch_end = [&](std::int64_t, nn::Logs& logs) { step_accuracy.push_back(logs.at("accuracy")); };
  nn::FitOptions o = quiet();
  o.validation_data = data::Dataset::from_tensor_slices({v.features, v.labels}).batch(64);
  o.callbacks = {probe};
  const data::Dataset batches = data::Dataset::from_tensor_slices({d.features, d.labels}).batch(64);
  nn::History h = model.fit(batches, 5, -1, o);
  for (const char* name : {"loss", "accuracy", "val_loss", "val_accuracy"}) {
    CAPTURE(name);
    REQUIRE(h.history.count(name) == 1);
    CHECK(h.history.at(name).size() == 5);
  }
  CHECK(h.history.at("loss") == h.loss);
  // The epoch's accuracy is the mean over its examples of the steps' (equal batches).
  double mean = 0;
  for (std::size_t i = 16; i < 24; ++i) mean += step_accuracy[i] / 8;
  CHECK(h.history.at("accuracy")[2] == doctest::Approx(mean).epsilon(1e-12));
  for (double a : step_accuracy) CHECK((a >= 0 && a <= 1));
  CHECK(h.history.at("accuracy").back() > 0.6);  // 3 classes: chance is 1/3
  CHECK(h.history.at("accuracy").back() > h.history.at("accuracy").front());
  const nn::EvaluateResult after = model.evaluate(data::Dataset::from_tensor_slices({v.features, v.labels}).batch(64));
  CHECK(h.history.at("val_loss").back() == after.loss);
  CHECK(h.history.at("val_accuracy").back() == after.accuracy);
}

namespace {

// The pieces a terminal shows of `text`: each line, and in it each redraw (after a '\r'), without
// the erase-to-end sequences. `last` receives each line's final piece.
std::vector<std::string> redraws(const std::string& text, std::vector<std::string>* last = nullptr) {
  std::vector<std::string> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::string clean;
    for (std::size_t at = 0; at < line.size();) {
      if (line.compare(at, 3, "\x1b[K") == 0) {
        at += 3;
      } else {
        clean += line[at++];
      }
    }
    std::vector<std::string> pieces;
    std::istringstream parts(clean);
    for (std::string piece; std::getline(parts, piece, '\r');) {
      if (!piece.empty()) pieces.push_back(piece);
    }
    if (pieces.empty()) continue;
    if (last != nullptr) last->push_back(pieces.back());
    out.insert(out.end(), pieces.begin(), pieces.end() - 1);
  }
  return out;
}

// Restores COLUMNS when it goes.
struct ColumnsGuard {
  std::optional<std::string> before;
  ColumnsGuard() {
    if (const char* c = std::getenv("COLUMNS")) before = c;
  }
  ~ColumnsGuard() {
    if (before) {
      setenv("COLUMNS", before->c_str(), 1);
    } else {
      unsetenv("COLUMNS");
    }
  }
};

}  // namespace

TEST_CASE("the progress bar fits the width it is given and ends an epoch in the format it ran in") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  const nn::ClassificationData d = blobs(160);
  nn::Model model(small_mlp(23));
  model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
  const data::Dataset batches = data::Dataset::from_tensor_slices({d.features, d.labels}).batch(16);  // 10 steps
  const std::regex end_line("^10/10 \\[=+\\] - [0-9]+s [0-9.]+ms/step - loss: [0-9.]+ - accuracy: [0-9.]+$");
  ColumnsGuard columns;
  unsetenv("COLUMNS");
  for (int width : {200, 60, 40, 24}) {
    CAPTURE(width);
    std::ostringstream tty;
    nn::ProgbarOptions bar;
    bar.out = &tty;
    bar.terminal = true;
    bar.width = width;
    nn::FitOptions o;
    o.verbose = 0;
    o.callbacks = {std::make_shared<nn::ProgbarLogger>(bar)};
    model.fit(batches, 2, 10, o);
    std::vector<std::string> ends;
    const std::vector<std::string> drawn = redraws(tty.str(), &ends);
    REQUIRE(!drawn.empty());
    for (const std::string& piece : drawn) {
      CAPTURE(piece);
      CHECK(piece.size() <= static_cast<std::size_t>(width - 1));  // never reaches the last column
      CHECK(std::regex_search(piece, std::regex("^ ?[0-9]+/10 \\[[=>.]+\\] - ETA: ")));
    }
    // Each epoch: its header, then its bar ended where it stood, every value kept.
    REQUIRE(ends.size() == 4);
    CHECK(ends[0] == "Epoch 1/2");
    CHECK(ends[2] == "Epoch 2/2");
    for (const std::string& end : {ends[1], ends[3]}) {
      CAPTURE(end);
      CHECK(end.rfind("10/10 ", 0) == 0);
      CHECK(contains(end, "ms/step - loss: "));
      CHECK(contains(end, " - accuracy: "));
      if (width == 200) CHECK(std::regex_search(end, end_line));
    }
    if (width == 200) CHECK(contains(drawn.back(), "[==============================] - ETA: 0s - "));
    if (width == 60) CHECK(std::regex_search(drawn.back(), std::regex("^10/10 \\[={10,29}\\] - ETA: ")));
    if (width <= 40) CHECK(!contains(drawn.back(), "accuracy"));  // the last values go first
  }

  // Asked: COLUMNS, else 80 (an ostringstream is no terminal to ask).
  for (const char* value : {"50", "abc", ""}) {
    CAPTURE(value);
    if (*value != '\0') {
      setenv("COLUMNS", value, 1);
    } else {
      unsetenv("COLUMNS");
    }
    const int expected = std::string(value) == "50" ? 50 : 80;
    CHECK(nn::ProgbarLogger::terminal_columns(false) == expected);
    std::ostringstream tty;
    nn::FitOptions o;
    o.out = &tty;
    o.terminal = true;
    model.fit(batches, 1, 10, o);
    for (const std::string& piece : redraws(tty.str())) CHECK(piece.size() <= static_cast<std::size_t>(expected - 1));
  }
  nn::ProgbarOptions bad;
  bad.width = -3;
  CHECK(contains(message_of([&] { nn::ProgbarLogger logger(bad); }), "ProgbarLogger: width -3"));
}

TEST_CASE("the progress bar is redrawn on a terminal, one line per epoch otherwise") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  const nn::ClassificationData d = blobs(160);
  nn::Model model(small_mlp(17));
  model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
  const data::Dataset batches = data::Dataset::from_tensor_slices({d.features, d.labels}).batch(16);  // 10 steps
  ColumnsGuard columns;
  setenv("COLUMNS", "200", 1);  // room for the whole bar
  std::ostringstream tty;
  nn::FitOptions o;
  o.out = &tty;
  o.terminal = true;
  model.fit(batches, 2, 10, o);
  const std::string t = tty.str();
  CHECK(t.rfind("Epoch 1/2\n", 0) == 0);
  CHECK(contains(t, "\r10/10 [==============================] - ETA: 0s - "));
  CHECK(contains(t, "ms/step - loss: "));
  CHECK(contains(t, " - accuracy: "));
  // The epoch ends as it ran: the bar, its time and ms/step, the epoch's values.
  CHECK(std::regex_search(t, std::regex("Epoch 2/2\n[\\s\\S]*\r10/10 \\[={30}\\] - [0-9]+s [0-9.]+ms/step - loss: "
                                        "[0-9.]+ - accuracy: [0-9.]+\x1b\\[K\n$")));
  CHECK(std::count(t.begin(), t.end(), '\n') == 4);
  // Without steps_per_epoch the length of an epoch is unknown until it ends.
  std::ostringstream unknown;
  o.out = &unknown;
  model.fit(batches, 1, -1, o);
  CHECK(contains(unknown.str(), "\r1/Unknown - "));
  CHECK(contains(unknown.str(), "\r10/10 [==============================] - "));

  std::ostringstream file;
  o.out = &file;
  o.terminal = false;
  model.fit(batches, 2, -1, o);
  const std::string f = file.str();
  CHECK(f.find('\r') == std::string::npos);
  CHECK(std::count(f.begin(), f.end(), '\n') == 2);
  CHECK(std::regex_search(f, std::regex("^Epoch 1/2: 10 steps, loss [0-9.e-]+, accuracy 0\\.[0-9]{4}, [0-9]+ samples/s, "
                                        "[0-9.]+ m?s, [0-9.]+ms/step\\nEpoch 2/2: ")));
}

namespace {
volatile std::sig_atomic_t previous_handler_ran = 0;
extern "C" void previous_handler(int) { previous_handler_ran = 1; }
}  // namespace

TEST_CASE("StopOnSignal stops a paused fit with a checkpoint, and gives the signal back afterwards") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  const nn::ClassificationData d = blobs(64);
  nn::Model model(small_mlp(19));
  model.compile(std::make_shared<nn::SGD>(0.1f), nn::Loss::sparse_categorical_crossentropy());
  struct sigaction mine {}, before {};
  mine.sa_handler = previous_handler;
  sigemptyset(&mine.sa_mask);
  REQUIRE(sigaction(SIGUSR1, &mine, &before) == 0);

  auto stop = std::make_shared<nn::StopOnSignal>(std::vector<int>{SIGUSR1});
  std::vector<std::int64_t> checkpoints;
  auto probe = std::make_shared<nn::LambdaCallback>();
  probe->batch_end = [&](std::int64_t, nn::Logs&) {
    if (model.control().step() == 3) model.control().pause();
  };
  probe->checkpoint = [&](std::int64_t step, nn::Logs&) { checkpoints.push_back(step); };
  std::thread sender([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!model.control().paused() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    kill(getpid(), SIGUSR1);
  });
  nn::FitOptions o = quiet();
  o.callbacks = {stop, probe};
  const nn::History h =
      model.fit(data::Dataset::from_tensor_slices({d.features, d.labels}).repeat().batch(8), 1, 10, o);
  sender.join();
  CHECK(h.steps == 3);
  CHECK(h.stopped_at_step == 3);
  CHECK(h.stop_reason == "interrupted by SIGUSR1");
  CHECK(stop->received() == SIGUSR1);
  CHECK(checkpoints == std::vector<std::int64_t>{3});
  CHECK(previous_handler_ran == 0);
  // After fit the handler installed before it is back.
  kill(getpid(), SIGUSR1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (previous_handler_ran == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(previous_handler_ran == 1);
  sigaction(SIGUSR1, &before, nullptr);
  CHECK(contains(message_of([] { nn::StopOnSignal({SIGKILL}); }), "StopOnSignal: signal 9 cannot be caught"));
}

}  // namespace TROUPE_TEST_FILE
