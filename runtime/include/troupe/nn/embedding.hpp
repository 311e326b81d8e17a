#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "troupe/dtype.hpp"
#include "troupe/nn/layer.hpp"
#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe::nn {

/// A lookup table from ids to vectors (tf.keras.layers.Embedding): ids (int32 or int64, any
/// shape, usually [batch, sequence]) -> their rows of `embeddings` [input_dim, output_dim], the
/// output shape the ids' followed by output_dim. The table is uniform in [-0.05, 0.05) from
/// `seed` (Keras's default initializer), of `dtype` (float32 or float64).
///
/// An id outside 0..input_dim-1 is std::invalid_argument naming the id, its position and the
/// range. The gradient of the table is a dense [input_dim, output_dim] tensor (zeros but the
/// rows looked up); ids have no gradient. Computed on the host (GPU tensors are copied there and
/// the output back).
class Embedding : public Layer {
 public:
  /// input_dim (the number of ids) and output_dim must be positive (std::invalid_argument).
  Embedding(int input_dim, int output_dim, std::uint64_t seed = 0, std::string name = "", DType dtype = DType::f32);

  const char* class_name() const override { return "Embedding"; }
  const char* default_name() const override { return "embedding"; }
  std::vector<std::pair<std::string, Variable>> weights() const override { return {{"embeddings", embeddings_}}; }
  /// [-1, -1]: a batch of sequences (any rank is taken).
  Shape input_shape() const override { return {-1, -1}; }
  /// The ids' shape followed by output_dim.
  Shape output_shape(const Shape& input_shape) const override;

  /// The number of ids.
  int input_dim() const noexcept { return input_dim_; }
  /// The width of a vector.
  int output_dim() const noexcept { return output_dim_; }
  /// The table, [input_dim, output_dim].
  const Variable& embeddings() const noexcept { return embeddings_; }

 protected:
  Tensor call(const Tensor& x, const CallContext& ctx) const override;
  LayerGradients gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output, const CallContext& ctx,
                           bool need_input) const override;
  std::string config_json() const override;

 private:
  // The ids as int64, each checked against the range.
  std::vector<std::int64_t> checked_ids(const Tensor& ids) const;

  int input_dim_;
  int output_dim_;
  std::uint64_t seed_;
  DType dtype_;
  Variable embeddings_;
};

}  // namespace troupe::nn
