#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/tensor.hpp"

namespace troupe::nn {

/// The area under the ROC curve of a binary classifier (tf.keras.metrics.AUC with its defaults:
/// curve "ROC", summation "interpolation"), accumulated over batches. As Keras computes it:
/// num_thresholds thresholds evenly spaced over [0, 1] (the first just below 0, the last just
/// above 1, by 1e-7); at each, the true and false positives and negatives of the predictions
/// above it; the area is the trapezoidal sum over the (false positive rate, true positive rate)
/// points. With predictions that no two thresholds fail to separate it is the exact ROC AUC (the
/// chance that a positive is scored above a negative); ties within one bucket count half.
///
///   nn::AUC auc;
///   auc.update_state(labels, probabilities);  // labels 0 or 1, probabilities in [0, 1]
///   double area = auc.result();
class AUC {
 public:
  /// Keras's default number of thresholds.
  static constexpr int default_num_thresholds = 200;

  /// num_thresholds > 1 (std::invalid_argument otherwise). from_logits: the predictions are
  /// logits, passed through the sigmoid first (Keras's from_logits).
  explicit AUC(int num_thresholds = default_num_thresholds, bool from_logits = false, std::string name = "auc");

  /// Adds a batch: y_true (any numeric dtype; 0 is negative, anything else positive) and y_pred
  /// (float32 or float64), the same number of elements, any shapes. A prediction that is NaN,
  /// or outside [0, 1] without from_logits, is std::invalid_argument naming its position and value.
  void update_state(const Tensor& y_true, const Tensor& y_pred);
  /// The area so far (0 when no positive or no negative was seen, as Keras's divide_no_nan gives).
  double result() const;
  /// Forgets every batch.
  void reset_state();

  /// "auc" unless named otherwise: the key of its value in a callback's logs.
  const std::string& name() const noexcept { return name_; }
  int num_thresholds() const noexcept { return static_cast<int>(thresholds_.size()); }
  /// Examples added since the last reset.
  std::int64_t count() const noexcept { return count_; }

 private:
  std::vector<double> thresholds_;
  bool from_logits_;
  std::string name_;
  // Per threshold: true and false positives; the positives and negatives in all.
  std::vector<std::int64_t> true_positives_, false_positives_;
  std::int64_t positives_ = 0, negatives_ = 0, count_ = 0;
};

}  // namespace troupe::nn
