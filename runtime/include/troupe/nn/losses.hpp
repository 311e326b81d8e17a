#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "troupe/tensor.hpp"

/// Losses with their gradients. Each comes in two reductions:
/// - the mean over the batch (tf.keras.losses' default), and
/// - the sum over the batch divided by a given global batch size, which is what
///   tf.nn.compute_average_loss does in a replica function: each replica's loss is its share of
///   the global mean, so gradients summed over replicas equal the gradient of the global mean,
///   whatever the number of replicas.
/// An empty batch gives a loss of 0 and a zero gradient.
namespace troupe::nn {

/// A scalar loss and its gradient with respect to the predictions (same shape and dtype).
struct LossAndGradient {
  Tensor loss;      ///< scalar, the predictions' dtype
  Tensor gradient;  ///< d loss / d predictions
};

/// Per-example softmax cross-entropy of logits [batch, classes] (float32 or float64) against
/// integer labels (int32 or int64, [batch] or [batch, 1]) in 0..classes-1, computed stably
/// (log-sum-exp with the row's maximum subtracted). Returns [batch].
/// A label out of range throws std::invalid_argument naming its row.
Tensor sparse_softmax_cross_entropy_per_example(const Tensor& logits, const Tensor& labels);
/// Mean over the batch (tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)).
/// Logits [batch, ..., classes] with labels [batch, ...] (a sequence model's: a label per
/// position) give the mean over every position, as Keras's loss does.
LossAndGradient sparse_softmax_cross_entropy(const Tensor& logits, const Tensor& labels);
/// Sum over the batch divided by global_batch_size (> 0); for logits [batch, ..., classes], the
/// sum over every position divided by global_batch_size times the positions of one example.
LossAndGradient sparse_softmax_cross_entropy(const Tensor& logits, const Tensor& labels,
                                             std::int64_t global_batch_size);

/// Per-example softmax cross-entropy of logits [batch, classes] (float32 or float64) against
/// targets of the same shape (one-hot rows or probabilities, converted to the logits' dtype),
/// -Σ targets · log_softmax(logits), computed stably. Returns [batch].
Tensor softmax_cross_entropy_per_example(const Tensor& logits, const Tensor& targets);
/// Mean over the batch (tf.keras.losses.CategoricalCrossentropy(from_logits=True)).
LossAndGradient softmax_cross_entropy(const Tensor& logits, const Tensor& targets);
/// Sum over the batch divided by global_batch_size (> 0).
LossAndGradient softmax_cross_entropy(const Tensor& logits, const Tensor& targets, std::int64_t global_batch_size);

/// Per-example mean over the last axis of (predictions - targets)^2; targets must have the
/// predictions' shape (or their element count, e.g. [batch] for [batch, 1]) and are converted to
/// their dtype. Returns [batch].
Tensor mean_squared_error_per_example(const Tensor& predictions, const Tensor& targets);
/// Mean over the batch (tf.keras.losses.MeanSquaredError).
LossAndGradient mean_squared_error(const Tensor& predictions, const Tensor& targets);
/// Sum over the batch divided by global_batch_size (> 0).
LossAndGradient mean_squared_error(const Tensor& predictions, const Tensor& targets, std::int64_t global_batch_size);

/// tf.nn.compute_average_loss: the sum of per_example_loss [batch] divided by global_batch_size.
Tensor compute_average_loss(const Tensor& per_example_loss, std::int64_t global_batch_size);

/// A loss for Model::compile: its name and fn(predictions, targets, global_batch_size), the
/// sum-over-global-batch reduction above. The compiled losses compute in float32: float16 and
/// bfloat16 predictions (a mixed-precision model's) are cast to float32 first, and the gradient
/// is float32.
struct Loss {
  std::string name;
  std::function<LossAndGradient(const Tensor&, const Tensor&, std::int64_t)> fn;
  /// Whether the outputs are logits (false only for categorical_crossentropy(false)): what
  /// Model::save records with the name.
  bool from_logits = true;

  /// Softmax cross-entropy from logits with integer labels.
  static Loss sparse_categorical_crossentropy();
  /// Cross-entropy with one-hot (or probability) targets (Keras's categorical_crossentropy):
  /// from_logits, softmax cross-entropy of the outputs (computed stably); otherwise the outputs
  /// are probabilities (a softmax's), -Σ targets · log(p) with p clipped to [1e-7, 1 - 1e-7] as
  /// Keras clips it (no gradient where clipped).
  static Loss categorical_crossentropy(bool from_logits = true);
  /// Mean squared error.
  static Loss mean_squared_error();
};

}  // namespace troupe::nn
