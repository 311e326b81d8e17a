#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/dtype.hpp"
#include "troupe/nn/layer.hpp"
#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe::nn {

/// Normalises each channel over the batch (tf.keras.layers.BatchNormalization with axis=-1, the
/// channels last: [batch, units] after Dense, [batch, height, width, channels] after Conv2D, any
/// rank >= 2). Per channel c, over every other axis:
///  - training: y = gamma · (x - mean) / sqrt(variance + epsilon) + beta with the batch's mean
///    and biased variance, and the moving statistics follow them as Keras updates them:
///    moving = moving · momentum + batch · (1 - momentum);
///  - inference: the same with moving_mean and moving_variance in place of the batch's.
///
/// gamma (ones, when scale) and beta (zeros, when center) are trainable: weights() lists them and
/// backward gives their gradients. moving_mean (zeros) and moving_variance (ones) are not:
/// non_trainable_weights() lists them, so checkpoints save them ("<layer>/moving_mean"), and no
/// gradient or optimizer sees them. All four are created by build() when the channel count is
/// first known, of `dtype` (float32 or float64).
///
/// Under a strategy every replica normalises with its own batch (Keras's default). The moving
/// statistics are mirrored variables with aggregation MEAN: in replica context each replica
/// computes its update from its own batch and the replicas' updates are averaged (one
/// all-reduce of both, over every worker) before each replica writes the result, so every
/// replica and worker holds the same bits. That is the value TensorFlow reads from its
/// per-replica (ON_READ, MEAN) moving statistics: the mean over replicas of each replica's own
/// moving average, which is the moving average of the replicas' mean batch statistics.
///
/// Computed on the host (GPU tensors are copied there and the output back).
class BatchNormalization : public Layer {
 public:
  /// 0 <= momentum <= 1 and epsilon > 0 (std::invalid_argument otherwise).
  explicit BatchNormalization(double momentum = 0.99, double epsilon = 1e-3, bool center = true, bool scale = true,
                              std::string name = "", DType dtype = DType::f32);

  const char* class_name() const override { return "BatchNormalization"; }
  const char* default_name() const override { return "batch_normalization"; }
  /// {"gamma", gamma} (when scale), {"beta", beta} (when center) once built.
  std::vector<std::pair<std::string, Variable>> weights() const override;
  /// {"moving_mean", ...}, {"moving_variance", ...} once built.
  std::vector<std::pair<std::string, Variable>> non_trainable_weights() const override;
  /// Any rank >= 2 (output_shape checks the channels once built).
  Shape input_shape() const override { return {}; }
  /// The input's shape.
  Shape output_shape(const Shape& input_shape) const override;
  /// Creates the variables for input_shape's last size (which must be known and positive).
  void build(const Shape& input_shape) const override;
  bool built() const override;

  /// The channels normalised; -1 until built.
  int units() const;
  /// The momentum of the moving statistics.
  double momentum() const noexcept { return momentum_; }
  /// Added to the variance.
  double epsilon() const noexcept { return epsilon_; }
  /// The scale, [units] (std::logic_error until built, or without scale).
  const Variable& gamma() const;
  /// The offset, [units] (std::logic_error until built, or without center).
  const Variable& beta() const;
  /// The moving mean, [units] (std::logic_error until built).
  const Variable& moving_mean() const;
  /// The moving (biased) variance, [units] (std::logic_error until built).
  const Variable& moving_variance() const;

 protected:
  /// For SyncBatchNormalization: the same layer whose batch statistics span every replica.
  BatchNormalization(double momentum, double epsilon, bool center, bool scale, std::string name, DType dtype,
                     bool synchronized);

  Tensor call(const Tensor& x, const CallContext& ctx) const override;
  LayerGradients gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output, const CallContext& ctx,
                           bool need_input) const override;
  std::string config_json() const override;

 private:
  struct State;  // what build() makes, shared by copies
  void check_input(const Tensor& x) const;
  const Variable& built_variable(const char* what) const;

  double momentum_;
  double epsilon_;
  bool center_;
  bool scale_;
  DType dtype_;
  bool synchronized_;
  std::shared_ptr<State> state_;
};

/// BatchNormalization whose batch statistics are those of the global batch
/// (tf.keras.layers.experimental.SyncBatchNormalization; Keras 3's synchronized=True): in
/// replica context each replica sums its channels (sum, sum of squares, count) and the sums are
/// all-reduced over every replica and worker, as TensorFlow does, giving mean = sum / count and
/// variance = sum of squares / count - mean². The backward pass all-reduces the sums it needs
/// (of the gradient and of the gradient times the normalised input) the same way, so the
/// output and the gradients equal BatchNormalization's on the whole global batch; gamma's and
/// beta's gradients are the replica's shares, which the optimizer's all-reduce (SUM) adds up.
/// The moving statistics are then the same on every replica and are written without a further
/// collective. Every replica must call it in training (each call is a collective). Outside
/// replica context, or with one replica, it is BatchNormalization with the statistics computed
/// from the sums.
class SyncBatchNormalization : public BatchNormalization {
 public:
  /// As BatchNormalization's.
  explicit SyncBatchNormalization(double momentum = 0.99, double epsilon = 1e-3, bool center = true, bool scale = true,
                                  std::string name = "", DType dtype = DType::f32);

  const char* class_name() const override { return "SyncBatchNormalization"; }
  const char* default_name() const override { return "sync_batch_normalization"; }
};

}  // namespace troupe::nn
