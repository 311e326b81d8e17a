#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <regex>
#include <sstream>

#include "test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::cpus;
using troupe::testing::message_of;

namespace {

// Deterministic values in [-1, 1).
Tensor pseudo_random(Shape shape, std::uint64_t seed, DType dtype = DType::f64) {
  Tensor t = nn::glorot_uniform(shape_num_elements(shape), 1, seed, DType::f64);
  const double scale = std::sqrt((static_cast<double>(shape_num_elements(shape)) + 1.0) / 6.0);
  t = (t * scale).reshape(shape);
  return dtype == DType::f64 ? t : t.cast(dtype);
}

// Central finite differences of f at x, element by element.
Tensor numeric_gradient(const std::function<double(const Tensor&)>& f, const Tensor& x, double eps) {
  std::vector<double> values = x.to_vector<double>();
  std::vector<double> grad(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double keep = values[i];
    values[i] = keep + eps;
    const double plus = f(Tensor::from_vector(values, x.shape()));
    values[i] = keep - eps;
    const double minus = f(Tensor::from_vector(values, x.shape()));
    values[i] = keep;
    grad[i] = (plus - minus) / (2 * eps);
  }
  return Tensor::from_vector(grad, x.shape());
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const auto av = a.cast(DType::f64).to_vector<double>();
  const auto bv = b.cast(DType::f64).to_vector<double>();
  double worst = 0;
  for (std::size_t i = 0; i < av.size(); ++i) worst = std::max(worst, std::abs(av[i] - bv[i]));
  return worst;
}

// sum(output * weights): a scalar whose gradient with respect to the output is `weights`.
double weighted_sum(const Tensor& output, const Tensor& weights) {
  const auto o = output.to_vector<double>();
  const auto w = weights.to_vector<double>();
  double s = 0;
  for (std::size_t i = 0; i < o.size(); ++i) s += o[i] * w[i];
  return s;
}

bool bit_identical(const std::vector<Tensor>& components) {
  for (const Tensor& c : components) {
    if (c.nbytes() != components[0].nbytes() ||
        std::memcmp(c.raw_data(), components[0].raw_data(), c.nbytes()) != 0) {
      return false;
    }
  }
  return true;
}

nn::Sequential mlp(int inputs, int hidden, int classes, std::uint64_t seed) {
  return nn::Sequential({nn::Dense(inputs, hidden, nn::Activation::relu, seed),
                         nn::Dense(hidden, hidden, nn::Activation::relu, seed + 1),
                         nn::Dense(hidden, classes, nn::Activation::none, seed + 2)});
}

nn::FitOptions quiet() {
  nn::FitOptions o;
  o.verbose = 0;
  return o;
}

}  // namespace

TEST_CASE("dense_backward matches finite differences for input, kernel and bias, with and without relu") {
  const Tensor x = pseudo_random({5, 4}, 1);
  const Tensor kernel = pseudo_random({4, 3}, 2);
  const Tensor bias = pseudo_random({3}, 3);
  const Tensor weights = pseudo_random({5, 3}, 4);  // d loss / d output
  for (nn::Activation act : {nn::Activation::none, nn::Activation::relu}) {
    CAPTURE(nn::activation_name(act));
    const Tensor out = nn::dense_forward(x, kernel, bias, act);
    const nn::DenseGradients g = nn::dense_backward(x, kernel, out, weights, act);
    const double eps = 1e-6;
    auto num_x = numeric_gradient(
        [&](const Tensor& v) { return weighted_sum(nn::dense_forward(v, kernel, bias, act), weights); }, x, eps);
    auto num_k = numeric_gradient(
        [&](const Tensor& v) { return weighted_sum(nn::dense_forward(x, v, bias, act), weights); }, kernel, eps);
    auto num_b = numeric_gradient(
        [&](const Tensor& v) { return weighted_sum(nn::dense_forward(x, kernel, v, act), weights); }, bias, eps);
    CHECK(max_abs_diff(g.input, num_x) < 1e-8);
    CHECK(max_abs_diff(g.kernel, num_k) < 1e-8);
    CHECK(max_abs_diff(g.bias, num_b) < 1e-8);
  }
  // Relu really masks: some outputs are clamped with these values.
  const Tensor out = nn::dense_forward(x, kernel, bias, nn::Activation::relu);
  const auto o = out.to_vector<double>();
  CHECK(std::count(o.begin(), o.end(), 0.0) > 0);
  CHECK(std::count(o.begin(), o.end(), 0.0) < static_cast<long>(o.size()));
}

TEST_CASE("relu_grad matches finite differences away from 0 and is 0 where the output was clamped") {
  const Tensor x = Tensor::from_vector<double>({-2.0, -0.5, 0.25, 1.5, 3.0, -1.0}, {2, 3});
  const Tensor w = pseudo_random({2, 3}, 9);
  const Tensor y = nn::relu(x);
  CHECK(y.to_vector<double>() == std::vector<double>{0.0, 0.0, 0.25, 1.5, 3.0, 0.0});
  const Tensor g = nn::relu_grad(w, y);
  auto num = numeric_gradient([&](const Tensor& v) { return weighted_sum(nn::relu(v), w); }, x, 1e-6);
  CHECK(max_abs_diff(g, num) < 1e-8);
  const auto gv = g.to_vector<double>();
  CHECK(gv[0] == 0.0);
  CHECK(gv[5] == 0.0);
}

TEST_CASE("a float32 Dense layer's backward agrees with finite differences to float precision") {
  nn::Dense layer(6, 4, nn::Activation::relu, 123);
  const Tensor x = pseudo_random({3, 6}, 5, DType::f32);
  const Tensor w = pseudo_random({3, 4}, 6, DType::f32);
  const Tensor out = layer.forward(x);
  const nn::DenseGradients g = layer.backward(x, out, w);
  // The same computation in float64 on the layer's own float32 weights.
  const Tensor k64 = layer.kernel().value().cast(DType::f64);
  const Tensor b64 = layer.bias().value().cast(DType::f64);
  const Tensor w64 = w.cast(DType::f64);
  auto num_k = numeric_gradient(
      [&](const Tensor& v) {
        return weighted_sum(nn::dense_forward(x.cast(DType::f64), v, b64, nn::Activation::relu), w64);
      },
      k64, 1e-6);
  CHECK(max_abs_diff(g.kernel, num_k) < 1e-5);
  CHECK(g.kernel.dtype() == DType::f32);
  CHECK(layer.kernel().name() == "kernel");
  CHECK(contains(message_of([&] { layer.forward(Tensor::zeros({2, 5})); }), "input of shape [2, 5] (expected [batch, 6])"));
}

TEST_CASE("Glorot-uniform initialisation is deterministic in the seed and within its limit") {
  const Tensor a = nn::glorot_uniform(30, 20, 7);
  const Tensor b = nn::glorot_uniform(30, 20, 7);
  const Tensor c = nn::glorot_uniform(30, 20, 8);
  CHECK(a.equals(b));
  CHECK(!a.equals(c));
  const double limit = std::sqrt(6.0 / 50.0);
  double lo = 0, hi = 0;
  for (float v : a.to_vector<float>()) {
    lo = std::min(lo, static_cast<double>(v));
    hi = std::max(hi, static_cast<double>(v));
  }
  CHECK(lo >= -limit);
  CHECK(hi <= limit);
  CHECK(hi - lo > limit);  // spread over the range, not a constant
}

TEST_CASE("sparse softmax cross-entropy: hand-computed value and a gradient that matches finite differences") {
  const Tensor logits = Tensor::from_vector<double>({1.0, 2.0, 3.0, 0.5, -1.0, 0.0}, {2, 3});
  const Tensor labels = Tensor::from_vector<std::int64_t>({2, 0});
  // Row 0: log(e^1 + e^2 + e^3) - 3; row 1: log(e^0.5 + e^-1 + e^0) - 0.5.
  const double l0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0;
  const double l1 = std::log(std::exp(0.5) + std::exp(-1.0) + std::exp(0.0)) - 0.5;
  const Tensor per = nn::sparse_softmax_cross_entropy_per_example(logits, labels);
  CHECK(per.to_vector<double>()[0] == doctest::Approx(l0).epsilon(1e-12));
  CHECK(per.to_vector<double>()[1] == doctest::Approx(l1).epsilon(1e-12));

  const nn::LossAndGradient mean = nn::sparse_softmax_cross_entropy(logits, labels);
  CHECK(mean.loss.item<double>() == doctest::Approx((l0 + l1) / 2).epsilon(1e-12));
  auto num = numeric_gradient(
      [&](const Tensor& z) { return nn::sparse_softmax_cross_entropy(z, labels).loss.item<double>(); }, logits, 1e-6);
  CHECK(max_abs_diff(mean.gradient, num) < 1e-9);

  const nn::LossAndGradient scaled = nn::sparse_softmax_cross_entropy(logits, labels, 8);
  CHECK(scaled.loss.item<double>() == doctest::Approx((l0 + l1) / 8).epsilon(1e-12));
  auto num8 = numeric_gradient(
      [&](const Tensor& z) { return nn::sparse_softmax_cross_entropy(z, labels, 8).loss.item<double>(); }, logits,
      1e-6);
  CHECK(max_abs_diff(scaled.gradient, num8) < 1e-9);
  CHECK(nn::compute_average_loss(per, 8).item<double>() == doctest::Approx((l0 + l1) / 8).epsilon(1e-12));
}

TEST_CASE("sparse softmax cross-entropy is stable for huge logits and takes int32 [batch, 1] labels") {
  const Tensor logits = Tensor::from_vector<float>({1000.0f, 0.0f, -1000.0f, 1000.0f}, {2, 2});
  const Tensor labels = Tensor::from_vector<int>({0, 0}, {2, 1});
  const nn::LossAndGradient r = nn::sparse_softmax_cross_entropy(logits, labels);
  // Row 0 is certain and right (loss 0); row 1 is certain and wrong (loss 2000).
  CHECK(r.loss.item<float>() == doctest::Approx(1000.0f));
  for (float g : r.gradient.to_vector<float>()) CHECK(std::isfinite(g));
  CHECK(r.gradient.to_vector<float>() == std::vector<float>{0.0f, 0.0f, -0.5f, 0.5f});
  CHECK(nn::softmax(logits).to_vector<float>() == std::vector<float>{1.0f, 0.0f, 0.0f, 1.0f});
}

TEST_CASE("losses reject bad labels and shapes with messages that say what to fix") {
  const Tensor logits = Tensor::zeros({2, 3});
  CHECK(contains(message_of([&] { nn::sparse_softmax_cross_entropy(logits, Tensor::from_vector<std::int64_t>({0, 3})); }),
                 "sparse_softmax_cross_entropy: label 3 in row 1 is out of range for 3 classes (expected 0..2)"));
  CHECK(contains(message_of([&] { nn::sparse_softmax_cross_entropy(logits, Tensor::from_vector<float>({0, 1})); }),
                 "labels are float32 [2] (expected int32 or int64 [2] or [2, 1])"));
  CHECK(contains(message_of([&] { nn::sparse_softmax_cross_entropy(logits, Tensor::from_vector<int>({0, 1}), 0); }),
                 "global_batch_size is 0 (expected a positive number)"));
  CHECK(contains(message_of([&] { nn::mean_squared_error(logits, Tensor::zeros({3, 2})); }),
                 "mean_squared_error: targets of shape [3, 2] for predictions of shape [2, 3]"));
  CHECK(contains(message_of([&] { nn::matmul(Tensor::zeros({2, 3}), Tensor::zeros({2, 3})); }),
                 "matmul: inner dimensions differ: a [2, 3], b [2, 3]"));
}

TEST_CASE("an empty batch gives a zero loss and a zero gradient in both reductions") {
  const Tensor logits = Tensor::zeros({0, 3});
  const Tensor labels = Tensor::from_vector<std::int64_t>({});
  for (const nn::LossAndGradient& r :
       {nn::sparse_softmax_cross_entropy(logits, labels), nn::sparse_softmax_cross_entropy(logits, labels, 4),
        nn::mean_squared_error(logits, Tensor::zeros({0, 3}), 4)}) {
    CHECK(r.loss.item<float>() == 0.0f);
    CHECK(r.gradient.shape() == Shape{0, 3});
  }
}

TEST_CASE("mean squared error: hand-computed value and a gradient that matches finite differences") {
  const Tensor p = Tensor::from_vector<double>({1.0, 2.0, 0.0, -1.0, 0.5, 3.0}, {3, 2});
  const Tensor t = Tensor::from_vector<double>({0.0, 2.0, 1.0, 1.0, 0.5, 1.0}, {3, 2});
  // Per example: (1 + 0)/2, (1 + 4)/2, (0 + 4)/2 -> 0.5, 2.5, 2.0.
  CHECK(nn::mean_squared_error_per_example(p, t).to_vector<double>() == std::vector<double>{0.5, 2.5, 2.0});
  const nn::LossAndGradient mean = nn::mean_squared_error(p, t);
  CHECK(mean.loss.item<double>() == doctest::Approx(5.0 / 3.0).epsilon(1e-12));
  auto num = numeric_gradient([&](const Tensor& v) { return nn::mean_squared_error(v, t).loss.item<double>(); }, p, 1e-6);
  CHECK(max_abs_diff(mean.gradient, num) < 1e-9);
  const nn::LossAndGradient scaled = nn::mean_squared_error(p, t, 10);
  CHECK(scaled.loss.item<double>() == doctest::Approx(0.5).epsilon(1e-12));
  auto num10 =
      numeric_gradient([&](const Tensor& v) { return nn::mean_squared_error(v, t, 10).loss.item<double>(); }, p, 1e-6);
  CHECK(max_abs_diff(scaled.gradient, num10) < 1e-9);
  // Integer or [batch] targets for [batch, 1] predictions are converted.
  const Tensor col = Tensor::from_vector<float>({1.0f, 3.0f}, {2, 1});
  CHECK(nn::mean_squared_error(col, Tensor::from_vector<int>({0, 1})).loss.item<float>() == doctest::Approx(2.5f));
}

TEST_CASE("SGD subtracts learning_rate times the gradient") {
  Variable w(Tensor::from_vector<float>({1.0f, -2.0f}), "w");
  nn::SGD sgd(0.1f);
  sgd.apply_gradients({{Tensor::from_vector<float>({0.5f, -1.0f}), w}});
  CHECK(w.value().to_vector<float>() == std::vector<float>{1.0f - 0.1f * 0.5f, -2.0f + 0.1f * 1.0f});
  CHECK(sgd.iterations().value().item<std::int64_t>() == 1);
  CHECK(sgd.variables().count("sgd/iterations") == 1);
  CHECK(sgd.variables().size() == 1);  // no momentum slot
}

TEST_CASE("SGD with momentum follows the hand-computed velocity over two steps, and nesterov too") {
  Variable w(Tensor::scalar<float>(1.0f), "w");
  nn::SGD sgd(0.1f, 0.9f);
  sgd.apply_gradients({{Tensor::scalar<float>(0.5f), w}});
  // v1 = -0.1 * 0.5 = -0.05; w1 = 0.95.
  CHECK(w.value().item<float>() == doctest::Approx(0.95f).epsilon(1e-7));
  sgd.apply_gradients({{Tensor::scalar<float>(0.5f), w}});
  // v2 = 0.9 * -0.05 - 0.05 = -0.095; w2 = 0.855.
  CHECK(w.value().item<float>() == doctest::Approx(0.855f).epsilon(1e-7));
  CHECK(sgd.variables().at("sgd/momentum/w").value().item<float>() == doctest::Approx(-0.095f).epsilon(1e-7));

  Variable u(Tensor::scalar<float>(1.0f), "u");
  nn::SGD nesterov(0.1f, 0.9f, true);
  nesterov.apply_gradients({{Tensor::scalar<float>(0.5f), u}});
  // v1 = -0.05; u1 = 1 + 0.9 * -0.05 - 0.05 = 0.905.
  CHECK(u.value().item<float>() == doctest::Approx(0.905f).epsilon(1e-7));
  CHECK(contains(message_of([] { nn::SGD(0.1f, 1.0f); }), "sgd: momentum is 1.000000 (expected >= 0.000000 and < 1.000000)"));
}

TEST_CASE("Adam follows the hand-computed first two steps") {
  Variable w(Tensor::from_vector<float>({1.0f, 0.0f}), "w");
  const double lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-7;
  nn::Adam adam(static_cast<float>(lr), static_cast<float>(b1), static_cast<float>(b2), static_cast<float>(eps));
  const std::vector<double> g{0.5, -2.0};
  std::vector<double> m(2, 0.0), v(2, 0.0), expected{1.0, 0.0};
  for (int t = 1; t <= 2; ++t) {
    adam.apply_gradients({{Tensor::from_vector<float>({static_cast<float>(g[0]), static_cast<float>(g[1])}), w}});
    const double lr_t = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
    for (int i = 0; i < 2; ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      expected[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
    }
    const auto got = w.value().to_vector<float>();
    CHECK(got[0] == doctest::Approx(expected[0]).epsilon(1e-6));
    CHECK(got[1] == doctest::Approx(expected[1]).epsilon(1e-6));
    // Step 1 moves each weight by about lr against its gradient's sign: 0.9 and 0.1.
    if (t == 1) {
      CHECK(got[0] == doctest::Approx(0.9f).epsilon(1e-5));
      CHECK(got[1] == doctest::Approx(0.1f).epsilon(1e-5));
    }
  }
  auto vars = adam.variables();
  CHECK(vars.at("adam/iterations").value().item<std::int64_t>() == 2);
  CHECK(vars.at("adam/m/w").value().to_vector<float>()[0] == doctest::Approx(m[0]).epsilon(1e-6));
  CHECK(vars.at("adam/v/w").value().to_vector<float>()[1] == doctest::Approx(v[1]).epsilon(1e-6));
}

TEST_CASE("apply_gradients in replica context sums the replicas' gradients in one collective") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(3));
  auto scope = s.scope();
  Variable w(Tensor::from_vector<float>({1.0f, 1.0f}), "w");
  nn::SGD sgd(0.5f);
  sgd.build({{"w", w}});
  s.run([&] {
    const float id = static_cast<float>(get_replica_context()->replica_id_in_sync_group());
    sgd.apply_gradients({{Tensor::from_vector<float>({id, 1.0f}), w}});  // sum: {0+1+2, 3}
  });
  for (const Tensor& c : s.experimental_local_results(w)) {
    CHECK(c.to_vector<float>() == std::vector<float>{1.0f - 0.5f * 3.0f, 1.0f - 0.5f * 3.0f});
  }
  // Already reduced gradients (the custom loop's all_reduce(MEAN)) are applied as they are.
  s.run([&] {
    auto* ctx = get_replica_context();
    Tensor g = ctx->all_reduce(ReduceOp::mean, Tensor::from_vector<float>({2.0f, 4.0f}));
    sgd.apply_gradients({{g, w}}, std::nullopt);
  });
  for (const Tensor& c : s.experimental_local_results(w)) {
    CHECK(c.to_vector<float>() == std::vector<float>{-0.5f - 1.0f, -0.5f - 2.0f});
  }
  for (const Tensor& c : s.experimental_local_results(sgd.iterations())) CHECK(c.item<std::int64_t>() == 2);
}

TEST_CASE("slots are created through merge_call when an optimizer first meets a variable inside run") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  Variable w(Tensor::scalar<float>(0.0f), "w");
  nn::Adam adam(0.01f);
  s.run([&] { adam.apply_gradients({{Tensor::scalar<float>(1.0f), w}}); });
  auto vars = adam.variables();
  REQUIRE(vars.count("adam/m/w") == 1);
  CHECK(s.experimental_local_results(vars.at("adam/m/w")).size() == 2);  // mirrored like w
  CHECK(bit_identical(s.experimental_local_results(w)));
  CHECK(w.value().item<float>() == doctest::Approx(-0.01f).epsilon(1e-4));
}

TEST_CASE("model and optimizer variables have checkpoint names") {
  nn::Model model(mlp(4, 8, 3, 1));
  model.compile(std::make_shared<nn::Adam>(), nn::Loss::sparse_categorical_crossentropy());
  auto vars = model.variables();
  for (const char* name : {"dense_0/kernel", "dense_0/bias", "dense_2/kernel", "adam/m/dense_0/kernel",
                           "adam/v/dense_2/bias", "adam/iterations"}) {
    CAPTURE(name);
    CHECK(vars.count(name) == 1);
  }
  CHECK(vars.size() == 6 + 12 + 1);
  CHECK(vars.at("dense_1/kernel").shape() == Shape{8, 8});
  CHECK(contains(message_of([] { nn::Sequential({nn::Dense(4, 8), nn::Dense(7, 2)}); }),
                 "layer 1 takes inputs of width 7, the previous layer ('dense_0') outputs 8"));
}

TEST_CASE("a model must be created in the scope of its layers") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  nn::Sequential layers = mlp(4, 8, 2, 1);  // outside the scope: one component
  auto scope = s.scope();
  CHECK(contains(message_of([&] { nn::Model m(layers); }),
                 "has 1 component(s) but the current strategy has 2 local replica(s)"));
}

TEST_CASE("mirrored variables stay bit-identical over 100 training steps on 1, 2 and 4 replicas") {
  const nn::ClassificationData data = nn::make_blobs({512, 8, 3, 2, 2.0f, 1.0f, 5});
  for (int replicas : {1, 2, 4}) {
    CAPTURE(replicas);
    Runtime rt;
    MirroredStrategy s(rt, cpus(replicas));
    auto scope = s.scope();
    nn::Model model(mlp(8, 16, 3, 11));
    model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
    auto ds = data::Dataset::from_tensor_slices({data.features, data.labels}).shuffle(512, 3).repeat().batch(20);
    nn::History h = model.fit(ds, 4, 25, quiet());
    CHECK(h.steps == 100);
    CHECK(h.samples == 2000);
    for (const auto& [name, variable] : model.variables()) {
      CAPTURE(name);
      auto components = s.experimental_local_results(variable);
      CHECK(components.size() == static_cast<std::size_t>(replicas));
      CHECK(bit_identical(components));
    }
    CHECK(model.optimizer()->iterations().value().item<std::int64_t>() == 100);
    CHECK(h.loss.back() < h.loss.front());
  }
}

TEST_CASE("4 replicas follow 1 replica's loss curve with the same global batch") {
  const nn::ClassificationData data = nn::make_blobs({768, 8, 3, 2, 2.0f, 1.0f, 9});
  auto curve = [&](int replicas, std::shared_ptr<nn::Optimizer> (*make)()) {
    Runtime rt;
    MirroredStrategy s(rt, cpus(replicas));
    auto scope = s.scope();
    nn::Model model(mlp(8, 32, 3, 21));
    model.compile(make(), nn::Loss::sparse_categorical_crossentropy());
    std::vector<double> losses;
    nn::FitOptions o = quiet();
    o.on_step_end = [&](std::int64_t, double loss) { losses.push_back(loss); };
    // 768 = 24 batches of 32: every replica gets 8 rows per step.
    model.fit(data::Dataset::from_tensor_slices({data.features, data.labels}).batch(32), 3, -1, o);
    return losses;
  };
  using Make = std::shared_ptr<nn::Optimizer> (*)();
  for (Make make : {Make([] { return std::shared_ptr<nn::Optimizer>(std::make_shared<nn::SGD>(0.1f, 0.9f)); }),
                    Make([] { return std::shared_ptr<nn::Optimizer>(std::make_shared<nn::Adam>(0.005f)); })}) {
    const auto one = curve(1, make);
    const auto four = curve(4, make);
    REQUIRE(one.size() == 72);
    REQUIRE(four.size() == 72);
    double worst = 0;
    for (std::size_t i = 0; i < one.size(); ++i) worst = std::max(worst, std::abs(four[i] - one[i]) / std::abs(one[i]));
    CAPTURE(one.front());
    CAPTURE(one.back());
    CHECK(worst < 1e-4);
    CHECK(one.back() < 0.5 * one.front());
  }
}

TEST_CASE("a 2-hidden-layer MLP reaches 95% training accuracy on the generated set") {
  // mlp_classifier's defaults: make_blobs() (16384 examples, 32 features, 4 classes of 2 clusters),
  // 32 -> 128 relu -> 128 relu -> 4, Adam(0.003), global batch 256; here on 2 replicas.
  const nn::ClassificationData data = nn::make_blobs();
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  nn::Model model(mlp(32, 128, 4, 1));
  model.compile(std::make_shared<nn::Adam>(0.003f), nn::Loss::sparse_categorical_crossentropy());
  const auto before = model.evaluate(data.features, data.labels);
  auto ds = data::Dataset::from_tensor_slices({data.features, data.labels}).shuffle(16384, 1).repeat().batch(256, true);
  nn::History h = model.fit(ds, 4, 64, quiet());
  const auto after = model.evaluate(data.features, data.labels);
  CAPTURE(before.accuracy);
  CAPTURE(h.loss.back());
  CHECK(after.accuracy >= 0.95);
  CHECK(after.loss < 0.5 * before.loss);
  CHECK(after.samples == 16384);
  CHECK(h.loss.size() == 4);
  CHECK(nn::accuracy(model.predict(data.features), data.labels) == doctest::Approx(after.accuracy));

  // A linear model cannot: the hidden layers are needed.
  nn::Model linear(nn::Sequential({nn::Dense(32, 4, nn::Activation::none, 1)}));
  linear.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
  linear.fit(ds, 4, 64, quiet());
  CHECK(linear.evaluate(data.features, data.labels).accuracy < 0.92);
}

TEST_CASE("the quickstart: Dense(2) on width-5 inputs, SGD(0.1), batch 1 per replica on 4 replicas: the loss falls") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(4));
  auto scope = s.scope();
  nn::Model model(nn::Sequential({nn::Dense(5, 2, nn::Activation::none, 7)}));
  model.compile(std::make_shared<nn::SGD>(0.1f), nn::Loss::sparse_categorical_crossentropy());
  const Tensor x = pseudo_random({2, 5}, 3, DType::f32) * 0.5f + 0.5f;  // like np.random.random
  const Tensor y = Tensor::from_vector<std::int64_t>({0, 1}, {2, 1});
  auto dist = s.distribute_datasets_from_function([&](const InputContext& ctx) {
    return data::Dataset::from_tensor_slices({x, y}).repeat().batch(ctx.get_per_replica_batch_size(4), true);
  });
  std::ostringstream out;
  nn::FitOptions o;
  o.out = &out;
  nn::History h = model.fit(dist, 3, 10, o);
  CHECK(h.loss[2] < h.loss[0]);
  CHECK(h.samples == 120);
  CHECK(contains(out.str(), "Epoch 1/3: 10 steps, loss "));
  CHECK(contains(out.str(), "samples/s, "));
  CHECK(contains(out.str(), "Epoch 3/3"));
  CHECK(bit_identical(s.experimental_local_results(model.layers().layer<nn::Dense>(0).kernel())));

  // One step an epoch, in well under a millisecond: "1 step", and a time that is not 0.000 s.
  std::ostringstream short_out;
  o.out = &short_out;
  model.fit(dist, 2, 1, o);
  CHECK(contains(short_out.str(), "Epoch 1/2: 1 step, loss "));
  CHECK_FALSE(contains(short_out.str(), "1 steps"));
  CHECK_FALSE(contains(short_out.str(), "0.000 s"));
  CHECK(std::regex_search(short_out.str(), std::regex("samples/s, ([1-9][0-9.]*|0\\.[0-9]*[1-9][0-9]*) (ms|s), [0-9.]+ms/step\\n")));
}

TEST_CASE("the custom loop form: step_fn with explicit all_reduce(MEAN) and train_step agree") {
  const nn::ClassificationData data = nn::make_blobs({64, 5, 2, 1, 2.0f, 1.0f, 4});
  auto run = [&](bool explicit_loop) {
    Runtime rt;
    MirroredStrategy s(rt, cpus(2));
    auto scope = s.scope();
    nn::Model model(nn::Sequential({nn::Dense(5, 2, nn::Activation::none, 3)}));
    auto sgd = std::make_shared<nn::SGD>(0.1f);
    model.compile(sgd, nn::Loss::sparse_categorical_crossentropy());
    auto dist = s.experimental_distribute_dataset(data::Dataset::from_tensor_slices({data.features, data.labels}).batch(8));
    std::vector<float> losses;
    for (const auto& batch : dist) {
      auto per_replica = s.run(
          [&](const data::Element& inputs) {
            if (!explicit_loop) return model.train_step(inputs, 8);
            // The seed's step_fn: mean loss per replica, gradients averaged over replicas.
            nn::LossAndGradients r = model.compute_gradients(inputs[0], inputs[1], 4);
            auto grads = get_replica_context()->all_reduce(ReduceOp::mean, r.gradients);
            sgd->apply_gradients(nn::zip(grads, model.trainable_variables()), std::nullopt);
            return r.loss;
          },
          batch);
      const Tensor loss = explicit_loop ? s.reduce(ReduceOp::mean, per_replica, std::nullopt)
                                        : s.reduce(ReduceOp::sum, per_replica, std::nullopt);
      losses.push_back(loss.item<float>());
    }
    return losses;
  };
  const auto a = run(true);
  const auto b = run(false);
  REQUIRE(a.size() == 8);
  REQUIRE(b.size() == 8);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-5));
}

TEST_CASE("fit under the default strategy trains a regression with mean squared error") {
  // y = 2 x0 - x1 + 0.5, learnt by one linear layer.
  std::vector<float> xs, ys;
  for (int i = 0; i < 64; ++i) {
    const float a = static_cast<float>(i % 8) / 4.0f - 1.0f, b = static_cast<float>(i / 8) / 4.0f - 1.0f;
    xs.push_back(a);
    xs.push_back(b);
    ys.push_back(2 * a - b + 0.5f);
  }
  nn::Model model(nn::Sequential({nn::Dense(2, 1, nn::Activation::none, 1)}));
  model.compile(std::make_shared<nn::SGD>(0.1f, 0.5f), nn::Loss::mean_squared_error());
  auto ds = data::Dataset::from_tensor_slices({Tensor::from_vector(xs, {64, 2}), Tensor::from_vector(ys, {64, 1})}).batch(16);
  nn::History h = model.fit(ds, 30, -1, quiet());
  CHECK(h.loss.back() < 1e-4);
  const auto k = model.layers().layer<nn::Dense>(0).kernel().value().to_vector<float>();
  CHECK(k[0] == doctest::Approx(2.0f).epsilon(1e-2));
  CHECK(k[1] == doctest::Approx(-1.0f).epsilon(1e-2));
  CHECK(contains(message_of([&] { model.fit(ds.repeat(), 1); }), "the dataset is infinite (repeat()); give steps_per_epoch"));
  CHECK(contains(message_of([&] { nn::Model(mlp(2, 4, 2, 1)).fit(ds, 1); }), "Model::fit: compile the model first"));
}

TEST_CASE("fit resumes at initial_step and reports every step's global count") {
  const nn::ClassificationData data = nn::make_blobs({96, 4, 2, 1, 2.0f, 1.0f, 8});
  nn::Model model(nn::Sequential({nn::Dense(4, 2, nn::Activation::none, 3)}));
  model.compile(std::make_shared<nn::SGD>(0.05f), nn::Loss::sparse_categorical_crossentropy());
  std::vector<std::int64_t> steps;
  nn::FitOptions o = quiet();
  o.initial_step = 7;
  o.on_step_end = [&](std::int64_t step, double) { steps.push_back(step); };
  auto ds = data::Dataset::from_tensor_slices({data.features, data.labels}).repeat().batch(16);
  nn::History h = model.fit(ds, 3, 5, o);  // 15 steps in all, 7 done: epoch 2 from its 3rd step
  CHECK(h.steps == 8);
  CHECK(h.loss.size() == 2);
  REQUIRE(steps.size() == 8);
  CHECK(steps.front() == 8);
  CHECK(steps.back() == 15);
  CHECK(model.optimizer()->iterations().value().item<std::int64_t>() == 8);
}

TEST_CASE("make_blobs is deterministic, balanced and shaped as asked") {
  const auto a = nn::make_blobs({100, 3, 4, 2, 2.0f, 1.0f, 1});
  const auto b = nn::make_blobs({100, 3, 4, 2, 2.0f, 1.0f, 1});
  CHECK(a.features.equals(b.features));
  CHECK(a.labels.equals(b.labels));
  CHECK(a.features.shape() == Shape{100, 3});
  const auto labels = a.labels.to_vector<std::int64_t>();
  CHECK(std::count(labels.begin(), labels.end(), 3) == 25);
  CHECK(contains(message_of([] { nn::make_blobs({10, 0, 2, 1, 1.0f, 1.0f, 1}); }), "make_blobs: samples 10, features 0"));
}

namespace {

// The product op(a) · op(b) by the textbook loop, in double, from row-major values.
std::vector<double> host_matmul(const std::vector<double>& a, std::int64_t a_rows, std::int64_t a_cols, bool ta,
                                const std::vector<double>& b, std::int64_t b_rows, std::int64_t b_cols, bool tb) {
  const std::int64_t m = ta ? a_cols : a_rows, k = ta ? a_rows : a_cols, n = tb ? b_rows : b_cols;
  auto at = [&](std::int64_t i, std::int64_t p) { return ta ? a[p * a_cols + i] : a[i * a_cols + p]; };
  auto bt = [&](std::int64_t p, std::int64_t j) { return tb ? b[j * b_cols + p] : b[p * b_cols + j]; };
  std::vector<double> out(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      for (std::int64_t p = 0; p < k; ++p) out[i * n + j] += at(i, p) * bt(p, j);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("matmul transposes a, b or both as asked, against the hand-computed product") {
  // a [2, 3] and its transpose [3, 2]; b [3, 4] and its transpose [4, 3]. Small integers: every
  // product and sum is exact in float32 and float64.
  const std::vector<double> a{1, 2, 3, -4, 5, 6};
  const std::vector<double> a_t{1, -4, 2, 5, 3, 6};
  const std::vector<double> b{7, -8, 9, 10, 11, 12, -13, 14, 15, 16, 17, -18};
  const std::vector<double> b_t{7, 11, 15, -8, 12, 16, 9, -13, 17, 10, 14, -18};
  // Row 0 of a · b by hand: 1*7 + 2*11 + 3*15 = 74, 1*-8 + 2*12 + 3*16 = 64, ...
  const std::vector<double> product = host_matmul(a, 2, 3, false, b, 3, 4, false);
  CHECK(product == std::vector<double>{74, 64, 34, -16, 117, 188, 1, -78});
  for (DType dtype : {DType::f32, DType::f64}) {
    CAPTURE(dtype_name(dtype));
    auto t = [&](const std::vector<double>& v, Shape s) { return Tensor::from_vector(v, s).cast(dtype); };
    struct form {
      Tensor lhs, rhs;
      bool ta, tb;
    };
    const form forms[] = {{t(a, {2, 3}), t(b, {3, 4}), false, false},
                          {t(a_t, {3, 2}), t(b, {3, 4}), true, false},
                          {t(a, {2, 3}), t(b_t, {4, 3}), false, true},
                          {t(a_t, {3, 2}), t(b_t, {4, 3}), true, true}};
    for (const form& f : forms) {
      CAPTURE(f.ta);
      CAPTURE(f.tb);
      const Tensor out = nn::matmul(f.lhs, f.rhs, f.ta, f.tb);
      CHECK(out.dtype() == dtype);
      CHECK(out.shape() == Shape{2, 4});
      CHECK(out.cast(DType::f64).to_vector<double>() == product);
      // The same operands through the host loop with the same flags: the flags are honoured.
      CHECK(host_matmul(f.lhs.cast(DType::f64).to_vector<double>(), f.lhs.shape()[0], f.lhs.shape()[1], f.ta,
                        f.rhs.cast(DType::f64).to_vector<double>(), f.rhs.shape()[0], f.rhs.shape()[1], f.tb) ==
            product);
    }
    // A transposed operand whose inner dimension does not match is refused.
    CHECK_THROWS_AS(nn::matmul(t(a, {2, 3}), t(b, {3, 4}), true, false), std::invalid_argument);
  }
}

TEST_CASE("argmax gives each row's first largest column as int64") {
  const Tensor x = Tensor::from_vector<float>({0.5f, -1.0f, 3.0f, 2.0f,    // 2
                                               -7.0f, -2.0f, -3.0f, -9.0f, // 1: all negative
                                               4.0f, 1.0f, 4.0f, 0.0f,     // 0: a tie keeps the first
                                               1.0f, 1.0f, 1.0f, 1.0f,     // 0
                                               -1.0f, 0.0f, 2.5f, 2.75f},  // 3: the last column
                                              {5, 4});
  for (DType dtype : {DType::f32, DType::f64}) {
    CAPTURE(dtype_name(dtype));
    const Tensor idx = nn::argmax(x.cast(dtype));
    CHECK(idx.dtype() == DType::i64);
    CHECK(idx.shape() == Shape{5});
    CHECK(idx.to_vector<std::int64_t>() == std::vector<std::int64_t>{2, 1, 0, 0, 3});
  }
  CHECK(nn::argmax(Tensor::zeros({0, 3})).shape() == Shape{0});
  CHECK_THROWS_AS(nn::argmax(Tensor::zeros({2, 0})), std::invalid_argument);
  CHECK_THROWS_AS(nn::argmax(Tensor::zeros({4})), std::invalid_argument);
}

TEST_CASE("set_learning_rate: the next update uses the new rate, with and without momentum") {
  // Plain SGD: w -= lr * g, with lr 0.1 then 0.25. Each step rounds the product, then the
  // difference, to float (volatile keeps the host from fusing them).
  Variable w(Tensor::from_vector<float>({1.0f, -2.0f}), "w");
  nn::SGD sgd(0.1f);
  const std::vector<float> g{0.5f, -1.5f};
  std::vector<float> expected{1.0f, -2.0f};
  auto step = [&](float lr) {
    for (std::size_t i = 0; i < 2; ++i) {
      volatile float delta = lr * g[i];
      expected[i] = expected[i] - delta;
    }
  };
  sgd.apply_gradients({{Tensor::from_vector<float>(g), w}});
  step(0.1f);
  CHECK(w.value().to_vector<float>() == expected);
  sgd.set_learning_rate(0.25f);
  CHECK(sgd.learning_rate() == 0.25f);
  sgd.apply_gradients({{Tensor::from_vector<float>(g), w}});
  step(0.25f);
  CHECK(w.value().to_vector<float>() == expected);
  // By hand: 1 - 0.05 - 0.125 = 0.825 and -2 + 0.15 + 0.375 = -1.475.
  CHECK(w.value().to_vector<float>()[0] == doctest::Approx(0.825).epsilon(1e-7));
  CHECK(w.value().to_vector<float>()[1] == doctest::Approx(-1.475).epsilon(1e-7));

  // Momentum 0.9: v1 = -0.1 * 0.5 = -0.05, u1 = 0.95; at rate 0.5, v2 = 0.9 * -0.05 - 0.5 * 0.5 =
  // -0.295, u2 = 0.655.
  Variable u(Tensor::scalar<float>(1.0f), "u");
  nn::SGD momentum(0.1f, 0.9f);
  momentum.apply_gradients({{Tensor::scalar<float>(0.5f), u}});
  CHECK(u.value().item<float>() == doctest::Approx(0.95).epsilon(1e-7));
  momentum.set_learning_rate(0.5f);
  momentum.apply_gradients({{Tensor::scalar<float>(0.5f), u}});
  CHECK(u.value().item<float>() == doctest::Approx(0.655).epsilon(1e-6));
  CHECK(momentum.variables().at("sgd/momentum/u").value().item<float>() == doctest::Approx(-0.295).epsilon(1e-6));

  // A rate that is not positive is refused and leaves the rate as it was.
  CHECK_THROWS_AS(sgd.set_learning_rate(0.0f), std::invalid_argument);
  CHECK_THROWS_AS(sgd.set_learning_rate(-1.0f), std::invalid_argument);
  CHECK(sgd.learning_rate() == 0.25f);
}

TEST_CASE("evaluate over a dataset weighs each batch by its rows: loss and accuracy against a hand computation") {
  // One linear layer with set weights: logits = x · K + b, 2 features, 3 classes.
  nn::Dense layer(2, 3, nn::Activation::none, 1);
  Variable kernel = layer.kernel();
  Variable bias = layer.bias();
  const std::vector<float> k{1.0f, -1.0f, 0.5f, 2.0f, 0.0f, -1.0f};
  const std::vector<float> b{0.1f, 0.0f, -0.2f};
  kernel.assign(Tensor::from_vector<float>(k, {2, 3}));
  bias.assign(Tensor::from_vector<float>(b));
  nn::Model model(nn::Sequential({layer}));
  model.compile(std::make_shared<nn::SGD>(0.1f), nn::Loss::sparse_categorical_crossentropy());
  const std::vector<float> x{1.0f, 0.0f, 0.0f, 1.0f, -1.0f, 1.0f, 2.0f, -1.0f, 0.5f, 0.5f};
  const std::vector<std::int64_t> y{0, 1, 2, 2, 0};
  // The same loss and accuracy per example in double: log-sum-exp minus the label's logit.
  double loss_sum = 0;
  int hits = 0;
  for (int row = 0; row < 5; ++row) {
    double logits[3];
    for (int c = 0; c < 3; ++c) {
      logits[c] = static_cast<double>(b[static_cast<std::size_t>(c)]);
      for (int f = 0; f < 2; ++f) {
        logits[c] += static_cast<double>(x[static_cast<std::size_t>(row * 2 + f)]) *
                     static_cast<double>(k[static_cast<std::size_t>(f * 3 + c)]);
      }
    }
    const double top = std::max({logits[0], logits[1], logits[2]});
    const double lse = top + std::log(std::exp(logits[0] - top) + std::exp(logits[1] - top) + std::exp(logits[2] - top));
    loss_sum += lse - logits[y[static_cast<std::size_t>(row)]];
    const int best = static_cast<int>(std::max_element(logits, logits + 3) - logits);
    if (best == y[static_cast<std::size_t>(row)]) ++hits;
  }
  // Rows 0, 3 and 4 are predicted right (classes 0, 2, 0), rows 1 and 2 not (both predict 0).
  REQUIRE(hits == 3);
  // Batches of 2, 2 and 1: the mean of the batch means would differ from the mean over examples.
  const auto ds = data::Dataset::from_tensor_slices({Tensor::from_vector(x, {5, 2}), Tensor::from_vector(y)}).batch(2);
  const nn::EvaluateResult r = model.evaluate(ds);
  CHECK(r.samples == 5);
  CHECK(r.loss == doctest::Approx(loss_sum / 5).epsilon(1e-6));
  CHECK(r.accuracy == doctest::Approx(0.6).epsilon(1e-12));
  // The whole set as one batch gives the same.
  const nn::EvaluateResult whole = model.evaluate(Tensor::from_vector(x, {5, 2}), Tensor::from_vector(y));
  CHECK(whole.loss == doctest::Approx(r.loss).epsilon(1e-6));
  CHECK(whole.accuracy == r.accuracy);
  // An empty dataset measures nothing; an uncompiled model is refused.
  const nn::EvaluateResult none = model.evaluate(ds.take(0));
  CHECK(none.samples == 0);
  CHECK(none.loss == 0);
  CHECK(contains(message_of([&] { nn::Model(mlp(2, 4, 3, 1)).evaluate(ds); }), "compile the model first"));
}

TEST_CASE("Sequential::add chains layers, names them, and refuses a width or name that does not fit") {
  nn::Sequential s;
  CHECK(s.layers().empty());
  nn::Dense first(2, 3, nn::Activation::relu, 4);
  nn::Dense second(3, 1, nn::Activation::none, 5);
  s.add(first);
  s.add(second);
  REQUIRE(s.layers().size() == 2);
  CHECK(s.layer_names() == std::vector<std::string>{"dense_0", "dense_1"});
  CHECK(s.trainable_variables().size() == 4);
  CHECK(s.variables().count("dense_1/kernel") == 1);
  // Set weights; the forward pass is relu(x · K1 + b1) · K2 + b2, by hand for x = [1, 2] and [-1, 1]:
  // x · K1 + b1 = [1-4+0.5, 2+2-0.5, 0+6+0] = [-2.5, 3.5, 6] -> relu [0, 3.5, 6] -> 0 + 7 - 6 + 1 = 2;
  // and [-1-2+0.5, -2+1-0.5, 0+3+0] = [-2.5, -1.5, 3] -> [0, 0, 3] -> -3 + 1 = -2.
  Variable(first.kernel()).assign(Tensor::from_vector<float>({1, 2, 0, -2, 1, 3}, {2, 3}));
  Variable(first.bias()).assign(Tensor::from_vector<float>({0.5f, -0.5f, 0}));
  Variable(second.kernel()).assign(Tensor::from_vector<float>({3, 2, -1}, {3, 1}));
  Variable(second.bias()).assign(Tensor::from_vector<float>({1}));
  const Tensor out = s.forward(Tensor::from_vector<float>({1, 2, -1, 1}, {2, 2}));
  CHECK(out.shape() == Shape{2, 1});
  CHECK(out.to_vector<float>() == std::vector<float>{2.0f, -2.0f});
  // The same as a Sequential built from the list.
  CHECK(nn::Sequential({first, second}).forward(Tensor::from_vector<float>({1, 2, -1, 1}, {2, 2})).equals(out));
  // A layer whose inputs do not match the last layer's outputs, or a name used twice.
  CHECK(message_of([&] { s.add(nn::Dense(4, 2)); }) ==
        "Sequential::add: layer 2 takes inputs of width 4, the previous layer ('dense_1') outputs 1");
  nn::Sequential named;
  named.add(nn::Dense(2, 2, nn::Activation::none, 0, "hidden"));
  CHECK(contains(message_of([&] { named.add(nn::Dense(2, 2, nn::Activation::none, 0, "hidden")); }),
                 "a layer named 'hidden' is already in the model"));
  CHECK(s.layers().size() == 2);
  CHECK(named.layers().size() == 1);
}

TEST_CASE("Model::summary prints the layers, output shapes and parameter counts as Keras does") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  nn::Model model(nn::Sequential({nn::Dense(784, 64, nn::Activation::relu, 1),
                                  nn::Dense(64, 10, nn::Activation::none, 2, "logits_with_a_name_too_long_for_its_column")}));
  std::ostringstream out;
  model.summary(out);
  const std::string rule(65, '_');
  const std::string expected = "Model: \"sequential\"\n" + rule + "\n" +
                               " Layer (type)                Output Shape              Param #\n" +
                               std::string(65, '=') + "\n" +
                               " dense_0 (Dense)             (None, 64)                50240\n"
                               "\n"
                               // A name too long for its column goes on in the next line.
                               " logits_with_a_name_too_lon  (None, 10)                650\n"
                               " g_for_its_column (Dense)\n"
                               "\n" +
                               std::string(65, '=') + "\n" +
                               "Total params: 50,890\n"
                               "Trainable params: 50,890\n"
                               "Non-trainable params: 0\n" +
                               rule + "\n";
  CHECK(out.str() == expected);
  // The counts are the variables' sizes.
  std::int64_t elements = 0;
  for (const Variable& v : model.trainable_variables()) elements += v.value().num_elements();
  CHECK(elements == 50890);
}

}  // namespace TROUPE_TEST_FILE
