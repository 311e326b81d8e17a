#include "troupe/nn/position_embedding.hpp"

#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "nn/eigen_maps.hpp"
#include "nn/layer_checks.hpp"

namespace troupe::nn {

TokenAndPositionEmbedding::TokenAndPositionEmbedding(int vocabulary_size, int sequence_length, int embedding_dim,
                                                     std::uint64_t seed, std::string name, DType dtype)
    : Layer(std::move(name)),
      token_(detail::positive("TokenAndPositionEmbedding", vocabulary_size, "vocabulary_size"),
             detail::positive("TokenAndPositionEmbedding", embedding_dim, "embedding_dim"), seed, "token_embedding",
             dtype),
      position_(detail::positive("TokenAndPositionEmbedding", sequence_length, "sequence_length"), embedding_dim,
                seed + 1, "position_embedding", dtype),
      seed_(seed) {}

std::vector<std::pair<std::string, Variable>> TokenAndPositionEmbedding::weights() const {
  return {{"token_embedding/embeddings", token_.embeddings()}, {"position_embedding/embeddings", position_.embeddings()}};
}

Shape TokenAndPositionEmbedding::output_shape(const Shape& input_shape) const {
  if (input_shape.size() != 2 || input_shape[1] > sequence_length() || input_shape[1] == 0) {
    throw std::invalid_argument(who() + ": ids of shape " + shape_to_string(input_shape) +
                                " (expected [batch, sequence] with sequence 1.." + std::to_string(sequence_length()) +
                                ", the sequence_length)");
  }
  return {input_shape[0], input_shape[1], embedding_dim()};
}

Tensor TokenAndPositionEmbedding::call(const Tensor& x, const CallContext& ctx) const {
  output_shape(x.shape());
  // The token rows (checked ids), then each position's row added.
  Tensor out = detail::on_host(token_.forward(x, ctx));
  const Tensor positions = detail::on_host(position_.embeddings().value());
  const std::int64_t batch = x.shape()[0], length = x.shape()[1], dim = embedding_dim();
  eigen::dispatch_float(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* o = out.mutable_data<T>();
    const T* p = positions.data<T>();
    for (std::int64_t b = 0; b < batch; ++b) {
      for (std::int64_t i = 0; i < length * dim; ++i) o[b * length * dim + i] += p[i];
    }
  });
  return detail::like_device(out, x);
}

LayerGradients TokenAndPositionEmbedding::gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output,
                                                    const CallContext& ctx, bool) const {
  detail::check_grad_output(who(), grad_output, output);
  if (output.shape() != output_shape(x.shape())) {
    throw std::invalid_argument(who() + ": output of shape " + shape_to_string(output.shape()) + " for ids " +
                                shape_to_string(x.shape()) + " (expected " + shape_to_string(output_shape(x.shape())) +
                                ", what forward gives)");
  }
  LayerGradients out;
  out.variables.push_back(token_.backward(x, output, grad_output, ctx, false).variables.at(0));
  const Tensor g = detail::on_host(grad_output);
  const std::int64_t batch = x.shape()[0], length = x.shape()[1], dim = embedding_dim();
  Tensor d = Tensor::zeros({sequence_length(), dim}, g.dtype());
  eigen::dispatch_float(g.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* gi = g.data<T>();
    T* o = d.mutable_data<T>();
    // In batch order: the same bits on every run.
    for (std::int64_t b = 0; b < batch; ++b) {
      for (std::int64_t i = 0; i < length * dim; ++i) o[i] += gi[b * length * dim + i];
    }
  });
  out.variables.push_back(detail::like_device(d, grad_output));
  return out;
}

std::string TokenAndPositionEmbedding::config_json() const {
  return nlohmann::json{{"vocabulary_size", vocabulary_size()},
                        {"sequence_length", sequence_length()},
                        {"embedding_dim", embedding_dim()},
                        {"seed", seed_},
                        {"dtype", std::string(dtype_name(token_.embeddings().dtype()))}}
      .dump();
}

}  // namespace troupe::nn
