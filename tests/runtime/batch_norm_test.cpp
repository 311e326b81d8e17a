#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "../common/temp_dir.hpp"
#include "gradient_check.hpp"
#include "test_util.hpp"
#include "troupe/nn/batch_normalization.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::cpus;
using troupe::testing::message_of;

using troupe::testing::check_gradients;
using troupe::testing::max_abs_diff;
using troupe::testing::numeric_gradient;
using troupe::testing::pseudo_random;
using troupe::testing::weighted_sum;

namespace {

// Writes a layer's variable (the accessors give const handles).
void set(Variable variable, const Tensor& value) { variable.assign(value); }

nn::CallContext training() {
  nn::CallContext ctx;
  ctx.training = true;
  return ctx;
}

// Per channel (last axis) mean and biased variance of x, in double.
void channel_moments(const Tensor& x, std::vector<double>& mean, std::vector<double>& variance) {
  const auto v = x.cast(DType::f64).to_vector<double>();
  const auto c = static_cast<std::size_t>(x.shape().back());
  const std::size_t rows = v.size() / c;
  mean.assign(c, 0.0);
  variance.assign(c, 0.0);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t k = 0; k < c; ++k) mean[k] += v[r * c + k] / static_cast<double>(rows);
  }
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t k = 0; k < c; ++k) variance[k] += (v[r * c + k] - mean[k]) * (v[r * c + k] - mean[k]) / static_cast<double>(rows);
  }
}

// Every variable's components as bytes.
std::map<std::string, std::vector<std::string>> bits(const std::map<std::string, Variable>& variables) {
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& [name, v] : variables) {
    for (const Tensor& c : v.components()) {
      const Tensor host = c.to(Device());
      out[name].emplace_back(static_cast<const char*>(host.raw_data()), host.nbytes());
    }
  }
  return out;
}

nn::FitOptions quiet() {
  nn::FitOptions o;
  o.verbose = 0;
  return o;
}

}  // namespace

TEST_CASE("BatchNormalization's gradients match finite differences in training and at inference, rank 2 and rank 4") {
  nn::BatchNormalization dense_bn(0.99, 1e-3, true, true, "", DType::f64);
  const Tensor x2 = pseudo_random({6, 3}, 1, DType::f64, 0.5);
  dense_bn.build(x2.shape());
  set(dense_bn.gamma(), Tensor::from_vector<double>({1.5, -0.5, 2.0}, {3}));
  set(dense_bn.beta(), Tensor::from_vector<double>({0.1, 0.2, -0.3}, {3}));
  check_gradients(dense_bn, x2, training());
  // Inference: the moving statistics are constants.
  set(dense_bn.moving_mean(), Tensor::from_vector<double>({0.3, -0.2, 0.1}, {3}));
  set(dense_bn.moving_variance(), Tensor::from_vector<double>({0.5, 2.0, 1.5}, {3}));
  check_gradients(dense_bn, x2, nn::CallContext{});

  // NHWC after a convolution: the statistics span batch, height and width.
  nn::BatchNormalization conv_bn(0.9, 1e-2, true, true, "", DType::f64);
  const Tensor x4 = pseudo_random({2, 3, 3, 2}, 5, DType::f64, -0.25);
  conv_bn.build(x4.shape());
  set(conv_bn.gamma(), Tensor::from_vector<double>({0.7, 1.3}, {2}));
  check_gradients(conv_bn, x4, training());

  // Without scale and center: no trainable variables, the input gradient still right.
  nn::BatchNormalization plain(0.99, 1e-3, false, false, "", DType::f64);
  plain.build(x2.shape());
  CHECK(plain.weights().empty());
  CHECK(plain.non_trainable_weights().size() == 2);
  check_gradients(plain, x2, training());

  // SyncBatchNormalization outside replica context: the same layer, statistics from the sums.
  nn::SyncBatchNormalization sync(0.9, 1e-2, true, true, "", DType::f64);
  sync.build(x4.shape());
  set(sync.gamma(), Tensor::from_vector<double>({0.7, 1.3}, {2}));
  check_gradients(sync, x4, training());
  CHECK(max_abs_diff(sync.forward(x4, training()), conv_bn.forward(x4, training())) < 1e-12);
}

TEST_CASE("BatchNormalization normalises with the batch in training and with the moving statistics at inference") {
  nn::BatchNormalization bn(0.9, 1e-3);
  // Two channels over four rows: channel 0 is 1, 2, 3, 4 (mean 2.5, variance 1.25), channel 1 is
  // 10, 10, 20, 20 (mean 15, variance 25).
  const Tensor x = Tensor::from_vector<float>({1, 10, 2, 10, 3, 20, 4, 20}, {4, 2});
  // Before any training the moving statistics are 0 and 1: inference is x / sqrt(1 + epsilon).
  const auto fresh = bn.forward(x).to_vector<float>();
  CHECK(fresh[0] == doctest::Approx(1.0 / std::sqrt(1.001)));
  CHECK(fresh[7] == doctest::Approx(20.0 / std::sqrt(1.001)));
  CHECK(bn.moving_mean().value().to_vector<float>() == std::vector<float>{0, 0});

  const auto y = bn.forward(x, training()).to_vector<float>();
  CHECK(y[0] == doctest::Approx((1 - 2.5) / std::sqrt(1.25 + 1e-3)).epsilon(1e-6));
  CHECK(y[6] == doctest::Approx((4 - 2.5) / std::sqrt(1.25 + 1e-3)).epsilon(1e-6));
  CHECK(y[1] == doctest::Approx((10 - 15) / std::sqrt(25 + 1e-3)).epsilon(1e-6));
  // One update: moving = moving * 0.9 + batch * 0.1.
  auto mean = bn.moving_mean().value().to_vector<float>();
  auto variance = bn.moving_variance().value().to_vector<float>();
  CHECK(mean[0] == doctest::Approx(0.25));
  CHECK(mean[1] == doctest::Approx(1.5));
  CHECK(variance[0] == doctest::Approx(0.9 + 0.125));
  CHECK(variance[1] == doctest::Approx(0.9 + 2.5));
  // A second batch: channel 0 all 0 (mean 0, variance 0), channel 1 -1, 1 (mean 0, variance 1).
  bn.forward(Tensor::from_vector<float>({0, -1, 0, 1}, {2, 2}), training());
  mean = bn.moving_mean().value().to_vector<float>();
  variance = bn.moving_variance().value().to_vector<float>();
  CHECK(mean[0] == doctest::Approx(0.225));
  CHECK(mean[1] == doctest::Approx(1.35));
  CHECK(variance[0] == doctest::Approx(1.025 * 0.9));
  CHECK(variance[1] == doctest::Approx(3.4 * 0.9 + 0.1));
  // Inference uses them, and changes nothing.
  const auto z = bn.forward(x).to_vector<float>();
  CHECK(z[0] == doctest::Approx((1 - 0.225) / std::sqrt(1.025 * 0.9 + 1e-3)).epsilon(1e-6));
  CHECK(z[3] == doctest::Approx((10 - 1.35) / std::sqrt(3.4 * 0.9 + 0.1 + 1e-3)).epsilon(1e-6));
  CHECK(bn.moving_mean().value().to_vector<float>() == mean);
  // gamma and beta scale and shift.
  set(bn.gamma(), Tensor::from_vector<float>({2, 3}, {2}));
  set(bn.beta(), Tensor::from_vector<float>({1, -1}, {2}));
  const auto scaled = bn.forward(x).to_vector<float>();
  CHECK(scaled[0] == doctest::Approx(2 * z[0] + 1).epsilon(1e-6));
  CHECK(scaled[3] == doctest::Approx(3 * z[3] - 1).epsilon(1e-6));
}

TEST_CASE("BatchNormalization's variables, config, summary and bad arguments") {
  nn::BatchNormalization bn(0.95, 1e-2, true, false, "bn");
  CHECK_FALSE(bn.built());
  CHECK(bn.weights().empty());
  CHECK(bn.non_trainable_weights().empty());
  bn.build({-1, 4, 4, 3});
  REQUIRE(bn.weights().size() == 1);
  CHECK(bn.weights()[0].first == "beta");
  REQUIRE(bn.non_trainable_weights().size() == 2);
  CHECK(bn.non_trainable_weights()[0].first == "moving_mean");
  CHECK(bn.non_trainable_weights()[1].first == "moving_variance");
  CHECK(bn.moving_variance().value().to_vector<float>() == std::vector<float>{1, 1, 1});
  CHECK(bn.count_params() == 9);  // Keras counts the moving statistics too
  CHECK(contains(message_of([&] { bn.gamma(); }), "scale=false"));

  const auto config = nlohmann::json::parse(bn.config());
  CHECK(config["class_name"] == "BatchNormalization");
  CHECK(config["config"]["name"] == "bn");
  CHECK(config["config"]["axis"] == -1);
  CHECK(config["config"]["momentum"] == 0.95);
  CHECK(config["config"]["epsilon"] == 0.01);
  CHECK(config["config"]["center"] == true);
  CHECK(config["config"]["scale"] == false);
  CHECK(config["config"]["synchronized"] == false);
  CHECK(config["config"]["dtype"] == "float32");
  const auto sync = nlohmann::json::parse(nn::SyncBatchNormalization().config());
  CHECK(sync["class_name"] == "SyncBatchNormalization");
  CHECK(sync["config"]["momentum"] == 0.99);
  CHECK(sync["config"]["epsilon"] == 0.001);
  CHECK(sync["config"]["synchronized"] == true);

  CHECK(contains(message_of([] { nn::BatchNormalization(1.5); }), "momentum is 1.5"));
  CHECK(contains(message_of([] { nn::SyncBatchNormalization(0.9, 0.0); }), "SyncBatchNormalization: epsilon is 0"));
  CHECK(contains(message_of([] { nn::BatchNormalization(0.9, 1e-3, true, true, "", DType::i32); }), "dtype int32"));
  CHECK(contains(message_of([&] { bn.forward(Tensor::zeros({2, 5})); }), "expected [batch, ..., 3]"));
  CHECK(contains(message_of([] { nn::BatchNormalization().build({-1, -1}); }), "channels known"));

  // In a Sequential: checkpoint names, the non-trainable list and the summary's split.
  nn::Sequential model({nn::Dense(4, 3), nn::BatchNormalization(), nn::Dense(3, 2)});
  std::vector<std::string> names;
  for (const auto& [name, v] : model.named_non_trainable_variables()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"batch_normalization_0/moving_mean", "batch_normalization_0/moving_variance"});
  CHECK(model.trainable_variables().size() == 6);
  CHECK(model.variables().size() == 8);
  nn::Model m(model);
  std::ostringstream text;
  m.summary(text);
  const std::string summary = text.str();
  CAPTURE(summary);
  CHECK(contains(summary, " batch_normalization_0 (Bat  (None, 3)                 12\n chNormalization)"));  // wrapped
  CHECK(contains(summary, "Total params: 35"));
  CHECK(contains(summary, "Trainable params: 29"));
  CHECK(contains(summary, "Non-trainable params: 6"));
}

TEST_CASE("SyncBatchNormalization across 2 replicas equals BatchNormalization on the whole global batch") {
  const Shape global_shape{8, 2, 2, 3};
  const Tensor x = pseudo_random(global_shape, 11, DType::f32, 0.3);
  const Tensor dy = pseudo_random(global_shape, 12, DType::f32, 0.0);
  // Uneven shares, so that the counts matter: replica 0 gets 3 examples, replica 1 gets 5.
  const Tensor x0 = x.slice(0, 3), x1 = x.slice(3, 8);
  const Tensor dy0 = dy.slice(0, 3), dy1 = dy.slice(3, 8);
  const Tensor gamma = Tensor::from_vector<float>({1.5f, 0.5f, -1.0f}, {3});
  const Tensor beta = Tensor::from_vector<float>({0.1f, 0.0f, 0.2f}, {3});

  // The reference: BatchNormalization on the whole batch, no strategy.
  nn::BatchNormalization reference(0.9);
  reference.build(global_shape);
  set(reference.gamma(), gamma);
  set(reference.beta(), beta);
  const Tensor want_y = reference.forward(x, training());
  const nn::LayerGradients want = reference.backward(x, want_y, dy, training());

  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  std::optional<nn::SyncBatchNormalization> sync;
  std::optional<nn::BatchNormalization> local;
  {
    auto scope = s.scope();
    sync.emplace(0.9);
    sync->build({-1, 2, 2, 3});
    set(sync->gamma(), gamma);
    set(sync->beta(), beta);
    local.emplace(0.9);
    local->build({-1, 2, 2, 3});
  }
  auto xs = s.experimental_distribute_values_from_function(
      [&](const ValueContext& c) { return c.replica_id_in_sync_group == 0 ? x0 : x1; });
  auto dys = s.experimental_distribute_values_from_function(
      [&](const ValueContext& c) { return c.replica_id_in_sync_group == 0 ? dy0 : dy1; });
  auto results = s.run(
      [&](const Tensor& xr, const Tensor& dyr) {
        const Tensor y = sync->forward(xr, training());
        nn::LayerGradients g = sync->backward(xr, y, dyr, training());
        local->forward(xr, training());
        return std::vector<Tensor>{y, g.input, g.variables[0], g.variables[1]};
      },
      xs, dys);
  const Tensor y = concat({results[0][0], results[1][0]}, 0);
  const Tensor dx = concat({results[0][1], results[1][1]}, 0);
  CHECK(max_abs_diff(y, want_y) < 1e-5);
  CHECK(max_abs_diff(dx, want.input) < 1e-5);
  // gamma's and beta's gradients are the replicas' shares: their sum (what the optimizer's
  // all-reduce makes) is the global batch's gradient.
  CHECK(max_abs_diff(results[0][2] + results[1][2], want.variables[0]) < 1e-5);
  CHECK(max_abs_diff(results[0][3] + results[1][3], want.variables[1]) < 1e-5);
  // Not a coincidence of the data: each replica's own batch statistics give other outputs.
  nn::BatchNormalization alone(0.9);
  alone.build(global_shape);
  set(alone.gamma(), gamma);
  set(alone.beta(), beta);
  CHECK(max_abs_diff(results[0][0], alone.forward(x0, training())) > 1e-2);

  // The moving statistics followed the global batch's, the same bits on both replicas.
  for (const Variable* v : {&sync->moving_mean(), &sync->moving_variance()}) {
    const auto components = bits({{"v", *v}}).at("v");
    CHECK(components[0] == components[1]);
  }
  CHECK(max_abs_diff(sync->moving_mean().value(), reference.moving_mean().value()) < 1e-6);
  CHECK(max_abs_diff(sync->moving_variance().value(), reference.moving_variance().value()) < 1e-6);

  // BatchNormalization on 2 replicas: each replica's update from its own batch, averaged (the
  // MEAN aggregation), the same bits on both.
  std::vector<double> m0, v0, m1, v1;
  channel_moments(x0, m0, v0);
  channel_moments(x1, m1, v1);
  const auto got_mean = local->moving_mean().value().to_vector<float>();
  const auto got_variance = local->moving_variance().value().to_vector<float>();
  for (std::size_t k = 0; k < 3; ++k) {
    CHECK(got_mean[k] == doctest::Approx(0.1 * (m0[k] + m1[k]) / 2).epsilon(1e-5));
    CHECK(got_variance[k] == doctest::Approx(0.9 + 0.1 * (v0[k] + v1[k]) / 2).epsilon(1e-5));
  }
  const auto components = bits({{"m", local->moving_mean()}}).at("m");
  CHECK(components[0] == components[1]);
}

TEST_CASE("a CNN with SyncBatchNormalization and BatchNormalization trains by fit on 2 replicas, with or without buckets") {
  // 8x8 images of two classes: a bright top half or a bright bottom half, with noise.
  const std::int64_t n = 256;
  const auto noise = pseudo_random({n, 8, 8, 1}, 21, DType::f32, 0.0).to_vector<float>();
  std::vector<float> pixels(noise.size());
  std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i % 2);
    for (int p = 0; p < 64; ++p) {
      const bool top = p < 32;
      const auto at = static_cast<std::size_t>(i * 64 + p);
      pixels[at] = 0.5f * noise[at] + ((i % 2 == 0) == top ? 1.0f : 0.0f);
    }
  }
  const Tensor features = Tensor::from_vector(pixels, {n, 8, 8, 1});
  const Tensor targets = Tensor::from_vector(labels, {n});
  const auto run = [&](std::size_t bucket_bytes) {
    RuntimeOptions options;
    options.gradient_bucket_bytes = bucket_bytes;
    Runtime rt(options);
    MirroredStrategy s(rt, cpus(2));
    auto scope = s.scope();
    nn::Model model(nn::Sequential({nn::Conv2D(4, 3, {1, 1}, nn::Padding::valid, nn::Activation::none, 3),
                                    nn::SyncBatchNormalization(0.9), nn::MaxPooling2D(2), nn::Flatten(),
                                    nn::Dense(3 * 3 * 4, 8, nn::Activation::none, 4), nn::BatchNormalization(0.9),
                                    nn::Dense(8, 2, nn::Activation::none, 5)}));
    model.compile(std::make_shared<nn::AdamW>(0.01f), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
    auto ds = data::Dataset::from_tensor_slices({features, targets}).shuffle(256, 1).repeat().batch(32);
    model.fit(ds, 3, 8, quiet());
    CHECK(model.evaluate(features, targets).accuracy >= 0.95);
    const auto weights = bits(model.variables());
    REQUIRE(weights.count("sync_batch_normalization_0/moving_mean") == 1);
    REQUIRE(weights.count("batch_normalization_0/moving_variance") == 1);
    REQUIRE(weights.count("adamw/m/batch_normalization_0/gamma") == 1);
    CHECK(weights.count("adamw/m/batch_normalization_0/moving_mean") == 0);  // never trained
    for (const auto& [name, components] : weights) {
      CAPTURE(name);
      CHECK(components[0] == components[1]);
    }
    // Training moved the statistics away from their start.
    CHECK(model.layers().layer<nn::BatchNormalization>(5).moving_variance().value().to_vector<float>() !=
          std::vector<float>(8, 1.0f));
    return weights;
  };
  const auto whole = run(0);
  CHECK(run(200) == whole);  // buckets while backward all-reduces its statistics: the same bits
}

TEST_CASE("a checkpoint saves and restores BatchNormalization's moving statistics") {
  troupe::testing::temp_dir dir;
  const Tensor x = pseudo_random({16, 4}, 31, DType::f32, 0.5);
  const Tensor y = Tensor::from_vector<std::int32_t>(std::vector<std::int32_t>(16, 1), {16});
  std::string path;
  Tensor want;
  std::map<std::string, std::vector<std::string>> saved;
  {
    nn::Model model(nn::Sequential({nn::Dense(4, 3, nn::Activation::none, 1), nn::BatchNormalization(0.5),
                                    nn::Dense(3, 2, nn::Activation::none, 2)}));
    model.compile(std::make_shared<nn::SGD>(0.1f), nn::Loss::sparse_categorical_crossentropy());
    for (int i = 0; i < 3; ++i) model.train_step({x, y}, 16);
    want = model.predict(x);
    Checkpoint ckpt(model.variables());
    path = ckpt.save(dir.file("bn"));
    saved = bits(model.variables());
  }
  nn::Model other(nn::Sequential({nn::Dense(4, 3, nn::Activation::none, 7), nn::BatchNormalization(0.5),
                                  nn::Dense(3, 2, nn::Activation::none, 8)}));
  other.compile(std::make_shared<nn::SGD>(0.1f), nn::Loss::sparse_categorical_crossentropy());
  const auto& bn = other.layers().layer<nn::BatchNormalization>(1);
  CHECK(bn.moving_mean().value().to_vector<float>() == std::vector<float>(3, 0.0f));
  Checkpoint(other.variables()).restore(path);
  CHECK(bits(other.variables()) == saved);
  CHECK(bn.moving_mean().value().to_vector<float>() != std::vector<float>(3, 0.0f));
  CHECK(other.predict(x).equals(want));
}

TEST_CASE("GradientTape follows a training pass through BatchNormalization: its gradients are Sequential::backward's") {
  const Tensor x = pseudo_random({3, 4, 4, 2}, 61, DType::f64, 0.2);
  nn::Sequential stack;
  stack.add(nn::Conv2D(3, 3, 1, nn::Padding::same, nn::Activation::relu, 1, "", DType::f64));
  stack.add(nn::BatchNormalization(0.99, 1e-3, true, true, "", DType::f64));
  stack.add(nn::Flatten());
  const Tensor target = pseudo_random({3, 48}, 62);
  nn::CallContext train = training();
  std::vector<Tensor> by_tape;
  {
    GradientTape tape;
    std::vector<Tensor> activations;
    const Tensor out = stack.forward(x, activations, train);
    const Tensor loss = nn::compute_average_loss(nn::mean_squared_error_per_example(out, target), 3);
    by_tape = tape.gradient(loss, stack.trainable_variables());
  }
  std::vector<Tensor> activations;
  const Tensor out = stack.forward(x, activations, train);
  const nn::LossAndGradient lg = nn::mean_squared_error(out, target, 3);
  const std::vector<Tensor> by_hand = stack.backward(activations, lg.gradient, nullptr, train);
  REQUIRE(by_tape.size() == 4);  // conv kernel, bias; gamma, beta (no moving statistics)
  REQUIRE(by_hand.size() == 4);
  for (std::size_t i = 0; i < by_tape.size(); ++i) {
    CAPTURE(i);
    CHECK(max_abs_diff(by_tape[i], by_hand[i]) < 1e-12);
    CHECK(max_abs_diff(by_tape[i], Tensor::zeros(by_tape[i].shape(), DType::f64)) > 0);
  }
}

TEST_CASE("EarlyStopping's restore_best_weights restores BatchNormalization's moving statistics too") {
  const Tensor x = pseudo_random({32, 4}, 51, DType::f32, 0.5);
  std::vector<std::int32_t> labels(32);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i % 2);
  const Tensor y = Tensor::from_vector(labels, {32});
  nn::Model model(nn::Sequential({nn::Dense(4, 3, nn::Activation::none, 1), nn::BatchNormalization(0.5),
                                  nn::Dense(3, 2, nn::Activation::none, 2)}));
  model.compile(std::make_shared<nn::SGD>(0.05f), nn::Loss::sparse_categorical_crossentropy());
  const auto& bn = model.layers().layer<nn::BatchNormalization>(1);
  std::vector<Tensor> moving_at_epoch_end;
  auto snapshot = std::make_shared<nn::LambdaCallback>();
  snapshot->epoch_end = [&](int epoch, nn::Logs& logs) {
    moving_at_epoch_end.push_back(bn.moving_mean().value());
    logs["val_score"] = std::vector<double>{1.0, 0.5, 0.6, 0.7, 0.8}.at(static_cast<std::size_t>(epoch));
  };
  nn::FitOptions o = quiet();
  o.callbacks = {snapshot, std::make_shared<nn::EarlyStopping>("val_score", 0.0, 2, 0, "min", std::nullopt, true)};
  model.fit(data::Dataset::from_tensor_slices({x, y}).batch(8), 5, -1, o);
  REQUIRE(moving_at_epoch_end.size() == 4);
  CHECK_FALSE(moving_at_epoch_end[1].equals(moving_at_epoch_end[3]));
  CHECK(bn.moving_mean().value().equals(moving_at_epoch_end[1]));
}

TEST_CASE("AdamW decays the weights before Adam's step, as Keras 3 computes it, for three steps") {
  const float lr = 0.1f, wd = 0.05f, b1 = 0.9f, b2 = 0.999f, eps = 1e-7f;
  Variable w(Tensor::from_vector<float>({1.0f, -2.0f, 0.5f}, {3}), "w");
  nn::AdamW opt(lr, wd, b1, b2, eps);
  CHECK(opt.name() == "adamw");
  CHECK(opt.weight_decay() == wd);
  const std::vector<std::vector<float>> grads{{0.5f, 0.1f, -0.3f}, {-0.2f, 0.4f, 0.0f}, {1.0f, -1.0f, 0.25f}};
  // The reference, by hand, in float as Keras computes it.
  std::vector<float> rw{1.0f, -2.0f, 0.5f}, m(3, 0.0f), v(3, 0.0f);
  for (std::size_t t = 1; t <= grads.size(); ++t) {
    opt.apply_gradients({{Tensor::from_vector(grads[t - 1], {3}), w}});
    const double lr_t = lr * std::sqrt(1.0 - std::pow(double(b2), double(t))) / (1.0 - std::pow(double(b1), double(t)));
    for (std::size_t i = 0; i < 3; ++i) {
      rw[i] = rw[i] - rw[i] * wd * lr;  // the decoupled decay, with the plain learning rate
      const float g = grads[t - 1][i];
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      rw[i] = rw[i] - static_cast<float>(lr_t) * m[i] / (std::sqrt(v[i]) + eps);
    }
    const auto got = w.value().to_vector<float>();
    for (std::size_t i = 0; i < 3; ++i) {
      CAPTURE(t);
      CAPTURE(i);
      CHECK(got[i] == doctest::Approx(rw[i]).epsilon(1e-6));
    }
  }
  // The decay is real: plain Adam ends elsewhere; with weight_decay 0 AdamW is Adam, bit for bit.
  Variable a(Tensor::from_vector<float>({1.0f, -2.0f, 0.5f}, {3}), "w");
  Variable b(Tensor::from_vector<float>({1.0f, -2.0f, 0.5f}, {3}), "w");
  nn::Adam adam(lr, b1, b2, eps);
  nn::AdamW no_decay(lr, 0.0f, b1, b2, eps);
  for (const auto& g : grads) {
    adam.apply_gradients({{Tensor::from_vector(g, {3}), a}});
    no_decay.apply_gradients({{Tensor::from_vector(g, {3}), b}});
  }
  CHECK(a.value().equals(b.value()));
  CHECK(max_abs_diff(a.value(), w.value()) > 1e-3);
  // Its slots are checkpointed under its own name.
  const auto names = opt.variables();
  CHECK(names.count("adamw/m/w") == 1);
  CHECK(names.count("adamw/v/w") == 1);
  CHECK(names.count("adamw/iterations") == 1);
  // Keras's defaults, and bad arguments.
  CHECK(nn::AdamW().weight_decay() == 0.004f);
  CHECK(nn::AdamW().learning_rate() == 0.001f);
  CHECK(contains(message_of([] { nn::AdamW(0.001f, -1.0f); }), "adamw: weight_decay is -1"));
  CHECK(contains(message_of([] { nn::AdamW(0.001f, 0.004f, 1.5f); }), "adamw: beta_1 is 1.5"));
}

}  // namespace TROUPE_TEST_FILE
