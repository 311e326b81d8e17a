#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/dtype.hpp"
#include "troupe/nn/layer.hpp"
#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe::nn {

/// Multi-head self-attention (tf.keras.layers.MultiHeadAttention called as
/// layer(x, x, use_causal_mask=...)): for x [batch, sequence, dim], each head h projects
/// Q = x·Wq[h] + bq[h], K = x·Wk[h] + bk[h] (key_dim wide), V = x·Wv[h] + bv[h] (value_dim
/// wide), attends with softmax(Q·Kᵀ / √key_dim) (with use_causal_mask, position t attends to
/// positions 0..t only: the others get probability exactly 0) times V, and the heads'
/// results, concatenated, are projected back to dim: out = concat·Wo + bo.
///
/// Its variables have Keras's names and shapes: "query/kernel" [dim, num_heads, key_dim],
/// "query/bias" [num_heads, key_dim], "key/..." the same, "value/kernel" [dim, num_heads,
/// value_dim], "value/bias" [num_heads, value_dim], "attention_output/kernel" [num_heads,
/// value_dim, dim], "attention_output/bias" [dim]. build() makes them when dim is first known
/// (see Layer::build): kernels Glorot-uniform over their 2-D view ([dim, num_heads·key_dim]...)
/// from seed, seed + 1, seed + 2 and seed + 3, biases zeros, of `dtype` (float32 or float64).
///
/// With `dropout` (Keras's argument) a training call drops that fraction of the attention
/// probabilities (after the softmax, before they weigh V) and scales the others by
/// 1 / (1 - dropout), as Dropout does; at inference nothing is dropped. The mask is Dropout's
/// counter-based stream (Dropout::mask, with seed + 4) over [batch, heads, length, length]: every
/// replica draws its own, a rerun draws the same, a run resumed by BackupAndRestore draws the
/// uninterrupted run's, and backward recomputes it from the same CallContext.
///
/// Since a layer of a Sequential takes one tensor, the query, key and value are the same input
/// (self-attention) and the causal mask is fixed at construction rather than passed to each
/// call. attention_axes and a different output width are not offered.
/// Computed on the host with Eigen's matrix products, the products of the projections over the
/// whole batch at once (GPU tensors are copied there and the output back); backward recomputes
/// the attention probabilities from the input rather than keeping them.
class MultiHeadAttention : public Layer {
 public:
  /// num_heads and key_dim must be positive; value_dim -1 means key_dim; dropout in [0, 1)
  /// (std::invalid_argument).
  MultiHeadAttention(int num_heads, int key_dim, bool use_causal_mask = false, std::uint64_t seed = 0,
                     std::string name = "", int value_dim = -1, DType dtype = DType::f32, double dropout = 0.0);

  const char* class_name() const override { return "MultiHeadAttention"; }
  const char* default_name() const override { return "multi_head_attention"; }
  /// The eight variables (names above), once built; nothing before.
  std::vector<std::pair<std::string, Variable>> weights() const override;
  /// [-1, -1, -1]: a batch of sequences of vectors.
  Shape input_shape() const override { return {-1, -1, -1}; }
  /// The input's shape.
  Shape output_shape(const Shape& input_shape) const override;
  /// Creates the variables for input_shape's last size (known and positive).
  void build(const Shape& input_shape) const override;
  bool built() const override;

  /// The number of heads.
  int num_heads() const noexcept { return num_heads_; }
  /// The width of each head's queries and keys.
  int key_dim() const noexcept { return key_dim_; }
  /// The width of each head's values.
  int value_dim() const noexcept { return value_dim_; }
  /// Whether position t attends only to positions up to t.
  bool use_causal_mask() const noexcept { return causal_; }
  /// The fraction of attention probabilities a training call drops.
  double dropout() const noexcept { return dropout_; }
  bool uses_random_stream() const override { return dropout_ > 0.0; }
  /// The width of the inputs and outputs; -1 until built.
  int dim() const;

 protected:
  Tensor call(const Tensor& x, const CallContext& ctx) const override;
  LayerGradients gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output, const CallContext& ctx,
                           bool need_input) const override;
  std::string config_json() const override;

 private:
  struct State;  // what build() makes, shared by copies
  // The dropout mask of a call over its `elements` probabilities ([batch, heads, length, length],
  // float64); none when nothing is dropped (inference, or dropout 0).
  std::optional<Tensor> attention_mask(std::int64_t elements, const CallContext& ctx) const;
  void check_input(const Tensor& x) const;
  // The variables' values on the host, in weights() order.
  std::vector<Tensor> host_values() const;

  int num_heads_;
  int key_dim_;
  int value_dim_;
  bool causal_;
  double dropout_;
  std::uint64_t seed_;
  DType dtype_;
  std::shared_ptr<State> state_;
};

}  // namespace troupe::nn
