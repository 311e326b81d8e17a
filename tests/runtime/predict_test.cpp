#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "troupe/nn/conv.hpp"
#include "troupe/nn/flatten.hpp"
#include "troupe/nn/model.hpp"
#include "troupe/nn/pooling.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::cpus;

namespace {

nn::Sequential cnn() {
  return nn::Sequential({nn::Conv2D(4, 3, 1, nn::Padding::same, nn::Activation::relu, 1), nn::MaxPooling2D(2),
                         nn::Flatten(), nn::Dense(4 * 4 * 4, 3, nn::Activation::none, 2)});
}

struct Outcome {
  std::vector<float> predictions;
  nn::EvaluateResult evaluated;
  nn::EvaluateResult one_batch;
  std::vector<float> few;  // fewer rows than replicas
};

// The same weights (from the seeds) under `strategy`: predictions of 37 rows, and evaluate over
// batches of 10 (the last one 7 rows) and over one batch.
Outcome run(Strategy& strategy) {
  auto scope = strategy.scope();
  nn::Model model(cnn());
  model.build({-1, 8, 8, 1});
  model.compile(std::make_shared<nn::SGD>(0.1f), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
  const Tensor x = nn::glorot_uniform(37 * 64, 1, 5).reshape({37, 8, 8, 1});
  std::vector<std::int64_t> labels;
  for (int i = 0; i < 37; ++i) labels.push_back(i % 3);
  const Tensor y = Tensor::from_vector(labels, {37});
  Outcome out;
  out.predictions = model.predict(x).to_vector<float>();
  out.evaluated = model.evaluate(data::Dataset::from_tensor_slices({x, y}).batch(10));
  out.one_batch = model.evaluate(x, y);
  out.few = model.predict(x.slice(0, 2)).to_vector<float>();
  return out;
}

}  // namespace

TEST_CASE("Model::predict and evaluate split over 4 replicas give the one-replica results, each row counted once") {
  Runtime rt;
  MirroredStrategy one(rt, cpus(1));
  MirroredStrategy four(rt, cpus(4));
  const Outcome a = run(one);
  const Outcome b = run(four);
  // Each row's output depends on that row and the weights only, in its order: the products of a
  // share of the rows may round differently (another blocking) than those of the whole batch, in
  // the last bits only.
  REQUIRE(b.predictions.size() == a.predictions.size());
  for (std::size_t i = 0; i < a.predictions.size(); ++i) {
    CAPTURE(i);
    CHECK(b.predictions[i] == doctest::Approx(a.predictions[i]).epsilon(1e-5));
  }
  CHECK(b.few == a.few);  // fewer rows than replicas: computed whole, as one replica does
  CHECK(b.evaluated.samples == 37);
  CHECK(b.one_batch.samples == 37);
  CHECK(b.evaluated.accuracy == a.evaluated.accuracy);
  CHECK(b.evaluated.loss == doctest::Approx(a.evaluated.loss).epsilon(1e-6));
  CHECK(b.one_batch.loss == doctest::Approx(a.one_batch.loss).epsilon(1e-6));
  CHECK(b.one_batch.accuracy == a.one_batch.accuracy);
  // The accuracy evaluate reports is that of predict's outputs.
  int hits = 0;
  for (int i = 0; i < 37; ++i) {
    int best = 0;
    for (int c = 1; c < 3; ++c) best = b.predictions[i * 3 + c] > b.predictions[i * 3 + best] ? c : best;
    hits += best == i % 3;
  }
  CHECK(b.one_batch.accuracy == doctest::Approx(hits / 37.0));
}

TEST_CASE("Model::predict and evaluate refuse to run inside a replica function") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  nn::Model model(nn::Sequential({nn::Dense(2, 2)}));
  model.compile(std::make_shared<nn::SGD>(0.1f), nn::Loss::mean_squared_error());
  CHECK_THROWS_AS(s.run([&] { return model.predict(Tensor::zeros({4, 2})); }), ReplicaError);
}

}  // namespace TROUPE_TEST_FILE
