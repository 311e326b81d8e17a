// GradientTape: every recorded operation's gradient against central finite differences (float64),
// and the tape's rules (what is watched, persistence, nesting, replicas).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <random>

#include "test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::cpus;
using troupe::testing::message_of;

namespace {

Tensor random_f64(Shape shape, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 engine(seed);
  std::vector<double> v(static_cast<std::size_t>(shape_num_elements(shape)));
  for (double& x : v) x = lo + (hi - lo) * (static_cast<double>(engine() >> 11) * 0x1.0p-53);
  return Tensor::from_vector(v, shape);
}

// The scalar sum of every element of t (through recorded reduce_sums and a reshape).
Tensor total(const Tensor& t) {
  Tensor flat = t.reshape({t.num_elements()});
  return reduce_sum(flat, 0);
}

double value_of(const Tensor& t) { return t.to(Device()).cast(DType::f64).item<double>(); }

// Checks tape.gradient(f(), vars) against central differences of f, element by element.
void check_gradients(const std::function<Tensor()>& f, std::vector<Variable> vars, double tolerance = 1e-7) {
  std::vector<Tensor> analytic;
  {
    GradientTape tape;
    const Tensor y = f();
    analytic = tape.gradient(y, vars);
  }
  REQUIRE(analytic.size() == vars.size());
  const double eps = 1e-6;
  for (std::size_t v = 0; v < vars.size(); ++v) {
    CAPTURE(v);
    REQUIRE(analytic[v].shape() == vars[v].shape());
    REQUIRE(analytic[v].dtype() == DType::f64);
    const Tensor keep = vars[v].value();
    std::vector<double> values = keep.to_vector<double>();
    const std::vector<double> got = analytic[v].to_vector<double>();
    for (std::size_t i = 0; i < values.size(); ++i) {
      const double x = values[i];
      values[i] = x + eps;
      vars[v].assign(Tensor::from_vector(values, keep.shape()));
      const double plus = value_of(f());
      values[i] = x - eps;
      vars[v].assign(Tensor::from_vector(values, keep.shape()));
      const double minus = value_of(f());
      values[i] = x;
      const double numeric = (plus - minus) / (2 * eps);
      CAPTURE(i);
      CHECK(got[i] == doctest::Approx(numeric).epsilon(tolerance).scale(1.0));
    }
    vars[v].assign(keep);
  }
}

}  // namespace

TEST_CASE("GradientTape: + - * / between tensors and with scalars, and unary minus, match finite differences") {
  Variable a(random_f64({3, 4}, 1), "a");
  Variable b(random_f64({3, 4}, 2), "b");
  check_gradients(
      [&] {
        const Tensor x = a.value();
        const Tensor y = b.value();
        const Tensor positive = y * y + 1.0;
        const Tensor t = x + y - x * y + x / positive + (x + 2.0) * (x - 0.5) + x * 3.0 + x / 4.0 + (2.0 + y) * (2.0 - x) +
                         3.0 * y + 1.0 / positive - (-x) * y;
        return total(t * t);
      },
      {a, b});
}

TEST_CASE("GradientTape: reshape and reduce_sum along every axis match finite differences") {
  Variable a(random_f64({24}, 3), "a");
  for (int axis : {0, 1, 2}) {
    CAPTURE(axis);
    const Tensor weights_3d = random_f64({2, 3, 4}, 10 + axis);
    check_gradients(
        [&] {
          const Tensor cube = a.value().reshape({2, 3, 4});
          const Tensor summed = reduce_sum(cube * weights_3d, axis);
          return total(summed * summed);
        },
        {a});
  }
}

TEST_CASE("GradientTape: matmul with every transpose matches finite differences") {
  for (int variant = 0; variant < 4; ++variant) {
    const bool ta = variant & 1, tb = variant & 2;
    CAPTURE(ta);
    CAPTURE(tb);
    Variable a(random_f64(ta ? Shape{5, 3} : Shape{3, 5}, 20 + variant), "a");
    Variable b(random_f64(tb ? Shape{4, 5} : Shape{5, 4}, 30 + variant), "b");
    const Tensor w = random_f64({3, 4}, 40);
    check_gradients([&] { return total(nn::matmul(a.value(), b.value(), ta, tb) * w); }, {a, b});
  }
}

TEST_CASE("GradientTape: relu, dense_forward, softmax cross-entropy and compute_average_loss match finite differences") {
  Variable x(random_f64({6, 5}, 50), "x");
  Variable k1(random_f64({5, 7}, 51), "k1");
  Variable b1(random_f64({7}, 52, -0.1, 0.1), "b1");
  Variable k2(random_f64({7, 3}, 53), "k2");
  Variable b2(random_f64({3}, 54), "b2");
  const Tensor labels = Tensor::from_vector(std::vector<std::int64_t>{0, 2, 1, 1, 0, 2}, {6});
  check_gradients(
      [&] {
        const Tensor hidden = nn::dense_forward(x.value(), k1.value(), b1.value(), nn::Activation::relu);
        const Tensor logits = nn::dense_forward(nn::relu(hidden - 0.05), k2.value(), b2.value(), nn::Activation::none);
        return nn::compute_average_loss(nn::sparse_softmax_cross_entropy_per_example(logits, labels), 8);
      },
      {x, k1, b1, k2, b2});
}

TEST_CASE("GradientTape: mean squared error matches finite differences for predictions and targets") {
  Variable p(random_f64({4, 3}, 60), "p");
  Variable t(random_f64({4, 3}, 61), "t");
  check_gradients([&] { return nn::compute_average_loss(nn::mean_squared_error_per_example(p.value(), t.value()), 4); },
                  {p, t});
}

TEST_CASE("GradientTape watches variable reads while it records, sums repeated reads, and answers zeros elsewhere") {
  Variable a(Tensor::from_vector(std::vector<double>{1, 2, 3}), "a");
  Variable unused(Tensor::from_vector(std::vector<double>{5, 5}), "unused");
  const Tensor before = a.value();  // read before the tape: not followed
  GradientTape tape(true);
  const Tensor y = total(a.value() * a.value() + a.value() * 2.0 + before);
  auto g = tape.gradient(y, {a, unused});
  CHECK(g[0].to_vector<double>() == std::vector<double>{4, 6, 8});  // 2a + 2
  CHECK(g[1].to_vector<double>() == std::vector<double>{0, 0});
  // A persistent tape answers again; a result it did not record has zero gradients.
  CHECK(tape.gradient(y, a).to_vector<double>() == std::vector<double>{4, 6, 8});
  CHECK(tape.gradient(total(before), a).to_vector<double>() == std::vector<double>{0, 0, 0});
  // Nothing was recorded while gradients were computed, and an int target is refused.
  CHECK(contains(message_of([&] { tape.gradient(Tensor::scalar<std::int64_t>(1), a); }), "expected float32 or float64"));
}

TEST_CASE("GradientTape: a non-persistent tape answers once - nested tapes record in the innermost") {
  Variable a(Tensor::from_vector(std::vector<double>{3}), "a");
  GradientTape outer;
  const Tensor y_outer = a.value() * 2.0;
  {
    GradientTape inner;
    const Tensor y_inner = a.value() * 5.0;
    CHECK(inner.gradient(y_inner, a).to_vector<double>() == std::vector<double>{5});
    CHECK(message_of([&] { inner.gradient(y_inner, a); }) ==
          "GradientTape::gradient: this tape already computed gradients (make it with persistent = true to ask again)");
  }
  // Recording went back to the outer tape.
  const Tensor z = y_outer + a.value() * 7.0;
  CHECK(outer.gradient(z, a).to_vector<double>() == std::vector<double>{9});
}

TEST_CASE("GradientTape inside run: each replica's tape gives its own gradients, equal to the Dense layers' backward") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  nn::Sequential model({nn::Dense(4, 6, nn::Activation::relu, 71), nn::Dense(6, 3, nn::Activation::none, 72)});
  auto result = s.run([&] {
    const int id = get_replica_context()->replica_id_in_sync_group();
    const Tensor x = nn::glorot_uniform(5, 4, 80 + id) * 3.0f;
    const Tensor labels = Tensor::from_vector(std::vector<std::int64_t>{0, 1, 2, 1, id}, {5});
    GradientTape tape;
    const Tensor logits = model.forward(x);
    const Tensor loss = nn::compute_average_loss(nn::sparse_softmax_cross_entropy_per_example(logits, labels), 10);
    const std::vector<Tensor> taped = tape.gradient(loss, model.trainable_variables());
    std::vector<Tensor> activations;
    const Tensor again = model.forward(x, activations);
    const auto lg = nn::sparse_softmax_cross_entropy(again, labels, 10);
    const std::vector<Tensor> by_hand = model.backward(activations, lg.gradient);
    double worst = 0;
    for (std::size_t i = 0; i < taped.size(); ++i) {
      const auto p = taped[i].to_vector<float>();
      const auto q = by_hand[i].to_vector<float>();
      for (std::size_t k = 0; k < p.size(); ++k) worst = std::max(worst, double(std::abs(p[k] - q[k])));
    }
    return worst;
  });
  for (double worst : result.values()) CHECK(worst < 1e-6);
}

}  // namespace TROUPE_TEST_FILE
