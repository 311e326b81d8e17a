#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "troupe/dtype.hpp"
#include "troupe/nn/embedding.hpp"
#include "troupe/nn/layer.hpp"
#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe::nn {

/// Token ids to vectors plus learned position vectors (KerasNLP's
/// keras_nlp.layers.TokenAndPositionEmbedding; Keras itself has no positional layer): ids
/// [batch, sequence] (int32 or int64, sequence <= sequence_length) -> [batch, sequence,
/// embedding_dim], out[b, t] = token_embedding[ids[b, t]] + position_embedding[t].
///
/// Its two tables, named as KerasNLP names its sublayers, are "token_embedding/embeddings"
/// [vocabulary_size, embedding_dim] and "position_embedding/embeddings" [sequence_length,
/// embedding_dim], uniform in [-0.05, 0.05) (KerasNLP's default "uniform") from `seed` and
/// seed + 1. A shorter sequence uses the first positions. An id out of range is
/// std::invalid_argument as for Embedding. Computed on the host (GPU tensors are copied there
/// and the output back).
class TokenAndPositionEmbedding : public Layer {
 public:
  /// Every size must be positive (std::invalid_argument).
  TokenAndPositionEmbedding(int vocabulary_size, int sequence_length, int embedding_dim, std::uint64_t seed = 0,
                            std::string name = "", DType dtype = DType::f32);

  const char* class_name() const override { return "TokenAndPositionEmbedding"; }
  const char* default_name() const override { return "token_and_position_embedding"; }
  /// {"token_embedding/embeddings", ...}, {"position_embedding/embeddings", ...}.
  std::vector<std::pair<std::string, Variable>> weights() const override;
  /// [-1, -1]: a batch of sequences.
  Shape input_shape() const override { return {-1, -1}; }
  /// [batch, sequence, embedding_dim].
  Shape output_shape(const Shape& input_shape) const override;

  /// The number of ids.
  int vocabulary_size() const noexcept { return token_.input_dim(); }
  /// The longest sequence.
  int sequence_length() const noexcept { return position_.input_dim(); }
  /// The width of a vector.
  int embedding_dim() const noexcept { return token_.output_dim(); }
  /// The token table, [vocabulary_size, embedding_dim].
  const Variable& token_embeddings() const noexcept { return token_.embeddings(); }
  /// The position table, [sequence_length, embedding_dim].
  const Variable& position_embeddings() const noexcept { return position_.embeddings(); }

 protected:
  Tensor call(const Tensor& x, const CallContext& ctx) const override;
  LayerGradients gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output, const CallContext& ctx,
                           bool need_input) const override;
  std::string config_json() const override;

 private:
  Embedding token_;
  Embedding position_;
  std::uint64_t seed_;
};

}  // namespace troupe::nn
