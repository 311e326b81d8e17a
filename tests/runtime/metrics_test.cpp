#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>

#include "test_util.hpp"
#include "troupe/nn/metrics.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using troupe::testing::contains;
using troupe::testing::message_of;

namespace {

Tensor floats(std::vector<float> v) { return Tensor::from_vector<float>(v); }
Tensor ints(std::vector<std::int32_t> v) { return Tensor::from_vector<std::int32_t>(v); }

}  // namespace

TEST_CASE("AUC with 3 thresholds gives Keras's documented 0.75 for labels 0 0 1 1 and predictions 0 0.5 0.3 0.9") {
  // By hand, thresholds {-1e-7, 0.5, 1+1e-7} and "positive when above": at -1e-7 every prediction
  // is positive (TPR 1, FPR 1); at 0.5 only 0.9 (TPR 1/2, FPR 0); at 1+1e-7 none (0, 0). The
  // trapezoids: (1 - 0) * (1 + 1/2) / 2 + (0 - 0) * (1/2 + 0) / 2 = 0.75.
  nn::AUC auc(3);
  auc.update_state(ints({0, 0, 1, 1}), floats({0.f, 0.5f, 0.3f, 0.9f}));
  CHECK(auc.result() == doctest::Approx(0.75).epsilon(1e-12));
  CHECK(auc.count() == 4);
  CHECK(auc.name() == "auc");
}

TEST_CASE("AUC with 200 thresholds is the exact ROC area when the thresholds separate the predictions") {
  // Positives scored 0.35, 0.8, 0.9; negatives 0.1, 0.4, 0.6. Of the 9 (positive, negative)
  // pairs the positive is above in 0.35>0.1, 0.8>0.1 0.4 0.6, 0.9>0.1 0.4 0.6: 7, so 7/9.
  nn::AUC auc;
  CHECK(auc.num_thresholds() == 200);
  auc.update_state(ints({1, 0, 1, 0, 1, 0}), floats({0.35f, 0.1f, 0.8f, 0.4f, 0.9f, 0.6f}));
  CHECK(auc.result() == doctest::Approx(7.0 / 9.0).epsilon(1e-9));
}

TEST_CASE("AUC accumulates over batches, the same as one batch, and reset forgets them") {
  nn::AUC whole, parts;
  whole.update_state(ints({1, 0, 1, 0, 1, 0}), floats({0.35f, 0.1f, 0.8f, 0.4f, 0.9f, 0.6f}));
  parts.update_state(ints({1, 0}), floats({0.35f, 0.1f}));
  parts.update_state(Tensor::from_vector<double>({1, 0, 1, 0}), Tensor::from_vector<double>({0.8, 0.4, 0.9, 0.6}));
  CHECK(parts.result() == doctest::Approx(whole.result()).epsilon(1e-12));
  CHECK(parts.count() == 6);
  parts.reset_state();
  CHECK(parts.count() == 0);
  CHECK(parts.result() == 0.0);  // no positives and no negatives: 0, as Keras's divide_no_nan
}

TEST_CASE("AUC of a perfect ranking is 1, of a reversed one 0, and ties in one bucket count half") {
  nn::AUC perfect, reversed, tied;
  perfect.update_state(ints({0, 0, 1, 1}), floats({0.1f, 0.2f, 0.7f, 0.8f}));
  reversed.update_state(ints({1, 1, 0, 0}), floats({0.1f, 0.2f, 0.7f, 0.8f}));
  tied.update_state(ints({0, 1}), floats({0.5f, 0.5f}));
  CHECK(perfect.result() == doctest::Approx(1.0));
  CHECK(reversed.result() == doctest::Approx(0.0));
  CHECK(tied.result() == doctest::Approx(0.5));
}

TEST_CASE("AUC from logits passes them through the sigmoid first") {
  nn::AUC logits(200, true);
  // sigmoid(-2.2) = 0.10, sigmoid(-0.62) = 0.35, sigmoid(1.39) = 0.80, sigmoid(-0.41) = 0.40:
  // positives 0.35 and 0.80, negatives 0.10 and 0.40; 3 of the 4 pairs ranked right (0.35 > 0.10,
  // 0.80 > 0.10 and 0.40), area 3/4.
  logits.update_state(ints({0, 1, 1, 0}), floats({-2.2f, -0.62f, 1.39f, -0.41f}));
  CHECK(logits.result() == doctest::Approx(0.75));
}

TEST_CASE("AUC refuses mismatched sizes, integer predictions, probabilities out of range and too few thresholds") {
  nn::AUC auc;
  CHECK(contains(message_of([&] { auc.update_state(ints({0, 1}), floats({0.5f})); }), "y_true has 2 elements, y_pred 1"));
  CHECK(contains(message_of([&] { auc.update_state(ints({0, 1}), ints({0, 1})); }), "expected float32 or float64"));
  CHECK(contains(message_of([&] { auc.update_state(ints({0, 1}), floats({0.5f, 1.5f})); }),
                 "prediction 1 is 1.5 (expected a probability in [0, 1]"));
  CHECK(contains(message_of([&] { auc.update_state(ints({0, 1}), floats({NAN, 0.5f})); }), "prediction 0 is nan"));
  CHECK(auc.count() == 0);  // a refused batch counts nothing
  CHECK_THROWS_AS(nn::AUC(1), std::invalid_argument);
}

}  // namespace TROUPE_TEST_FILE
