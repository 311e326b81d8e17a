#include "troupe/nn/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace troupe::nn {

AUC::AUC(int num_thresholds, bool from_logits, std::string name) : from_logits_(from_logits), name_(std::move(name)) {
  if (num_thresholds < 2) {
    throw std::invalid_argument("AUC: num_thresholds is " + std::to_string(num_thresholds) + " (expected 2 or more)");
  }
  // Keras: [0 - epsilon, 1/(n-1), ..., (n-2)/(n-1), 1 + epsilon].
  constexpr double epsilon = 1e-7;
  thresholds_.resize(static_cast<std::size_t>(num_thresholds));
  for (int i = 0; i < num_thresholds; ++i) thresholds_[static_cast<std::size_t>(i)] = static_cast<double>(i) / (num_thresholds - 1);
  thresholds_.front() = -epsilon;
  thresholds_.back() = 1 + epsilon;
  reset_state();
}

void AUC::reset_state() {
  true_positives_.assign(thresholds_.size(), 0);
  false_positives_.assign(thresholds_.size(), 0);
  positives_ = negatives_ = count_ = 0;
}

void AUC::update_state(const Tensor& y_true, const Tensor& y_pred) {
  if (y_true.num_elements() != y_pred.num_elements()) {
    throw std::invalid_argument("AUC::update_state: y_true has " + std::to_string(y_true.num_elements()) +
                                " elements, y_pred " + std::to_string(y_pred.num_elements()) + " (expected as many)");
  }
  if (y_pred.dtype() != DType::f32 && y_pred.dtype() != DType::f64) {
    throw std::invalid_argument("AUC::update_state: y_pred is " + std::string(dtype_name(y_pred.dtype())) +
                                " (expected float32 or float64 probabilities" +
                                (from_logits_ ? std::string(" or logits)") : std::string(")")));
  }
  const std::vector<double> truth = y_true.to(Device()).cast(DType::f64).to_vector<double>();
  const std::vector<double> pred = y_pred.to(Device()).cast(DType::f64).to_vector<double>();
  // Checked whole before anything is counted: a bad batch leaves the state as it was.
  for (std::size_t i = 0; i < pred.size(); ++i) {
    const double p = pred[i];
    if (std::isnan(p) || (!from_logits_ && (p < 0 || p > 1))) {
      std::ostringstream what;
      what << "AUC::update_state: prediction " << i << " is " << p
           << (from_logits_ ? " (expected a number)" : " (expected a probability in [0, 1]; pass from_logits for logits)");
      throw std::invalid_argument(what.str());
    }
  }
  // The thresholds are sorted: a prediction is above the first k of them, k found by bisection.
  std::vector<std::int64_t> tp_above(thresholds_.size() + 1, 0), fp_above(thresholds_.size() + 1, 0);
  for (std::size_t i = 0; i < pred.size(); ++i) {
    const double p = from_logits_ ? 1.0 / (1.0 + std::exp(-pred[i])) : pred[i];
    const auto k = static_cast<std::size_t>(std::lower_bound(thresholds_.begin(), thresholds_.end(), p) - thresholds_.begin());
    // thresholds_[0..k-1] < p: the prediction is positive at each of them.
    if (truth[i] != 0) {
      ++tp_above[k];
      ++positives_;
    } else {
      ++fp_above[k];
      ++negatives_;
    }
  }
  // Positive at threshold t when its k > t: suffix sums.
  std::int64_t tp = 0, fp = 0;
  for (std::size_t t = thresholds_.size(); t-- > 0;) {
    tp += tp_above[t + 1];
    fp += fp_above[t + 1];
    true_positives_[t] += tp;
    false_positives_[t] += fp;
  }
  count_ += static_cast<std::int64_t>(pred.size());
}

double AUC::result() const {
  if (positives_ == 0 || negatives_ == 0) return 0.0;
  const auto rate = [](std::int64_t part, std::int64_t whole) { return static_cast<double>(part) / static_cast<double>(whole); };
  double area = 0;
  for (std::size_t t = 0; t + 1 < thresholds_.size(); ++t) {
    const double tpr = rate(true_positives_[t], positives_), next_tpr = rate(true_positives_[t + 1], positives_);
    const double fpr = rate(false_positives_[t], negatives_), next_fpr = rate(false_positives_[t + 1], negatives_);
    area += (fpr - next_fpr) * (tpr + next_tpr) / 2;
  }
  return area;
}

}  // namespace troupe::nn
