#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "troupe/distribute/reduce_op.hpp"
#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe {

/// tf.GradientTape: records, on the thread that made it, the operations between its construction
/// and its destruction that depend on a variable read in that time, and gives the gradients of a
/// result with respect to variables (reverse mode, in the reverse order of recording).
///
///   GradientTape tape;                        // inside Strategy::run: one tape per replica
///   Tensor logits = model.forward(features);  // Dense layers read their variables: recorded
///   Tensor loss = nn::compute_average_loss(nn::sparse_softmax_cross_entropy_per_example(logits, labels), batch);
///   std::vector<Tensor> grads = tape.gradient(loss, model.trainable_variables());
///
/// Recorded: Tensor's + - * / (tensor-tensor and with a scalar), unary -, reshape and
/// reduce_sum; nn::matmul, relu, dense_forward, every nn::Layer's forward (so Sequential), the
/// per-example losses sparse_softmax_cross_entropy_per_example,
/// softmax_cross_entropy_per_example and mean_squared_error_per_example, and
/// compute_average_loss. Every read of a Variable (value(), read_value()) while the tape records
/// is watched, as TensorFlow watches trainable variables. Other operations give results the tape
/// does not follow: their gradients are zero. Tapes nest; the innermost records.
class GradientTape {
 public:
  /// Starts recording on the calling thread. A persistent tape may compute gradients more than once.
  explicit GradientTape(bool persistent = false);
  /// Stops recording. A tape must be destroyed on the thread that made it, innermost first.
  ~GradientTape();
  GradientTape(const GradientTape&) = delete;
  GradientTape& operator=(const GradientTape&) = delete;

  /// d sum(target) / d source for every source (TensorFlow's output_gradients of ones), each of
  /// its source's shape and dtype; zeros for a source the target does not depend on (TensorFlow's
  /// UnconnectedGradients.ZERO). Nothing is recorded while it runs. A non-persistent tape
  /// answers once: a second call throws std::logic_error. The target must be float32 or float64
  /// (std::invalid_argument otherwise).
  std::vector<Tensor> gradient(const Tensor& target, const std::vector<Variable>& sources);
  /// The same for one variable.
  Tensor gradient(const Tensor& target, const Variable& source);
  /// The gradients all-reduced with `all_reduce` over the replicas of the strategy running this
  /// replica function (Horovod's DistributedGradientTape): each gradient joins a bucket of about
  /// RuntimeOptions::gradient_bucket_bytes as soon as it is final, and the bucket's all-reduce
  /// starts while the tape still differentiates earlier operations. The same bits as
  /// get_replica_context()->all_reduce(all_reduce, gradient(target, sources)); pass them to
  /// Optimizer::apply_gradients with aggregation std::nullopt. Outside a replica function of
  /// several replicas, gradient(target, sources).
  std::vector<Tensor> gradient(const Tensor& target, const std::vector<Variable>& sources,
                               distribute::ReduceOp all_reduce);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe
