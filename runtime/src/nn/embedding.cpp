#include "troupe/nn/embedding.hpp"

#include <cstring>
#include <random>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "nn/eigen_maps.hpp"
#include "nn/layer_checks.hpp"

namespace troupe::nn {

namespace {

// Uniform in [-0.05, 0.05) from mt19937_64 (its sequence is fixed by the standard, so the bits are
// the same everywhere).
Tensor uniform_table(int rows, int cols, std::uint64_t seed, DType dtype) {
  if (dtype != DType::f32 && dtype != DType::f64) {
    throw std::invalid_argument("Embedding: dtype " + std::string(dtype_name(dtype)) + " (expected float32 or float64)");
  }
  std::mt19937_64 engine(seed);
  Tensor out = Tensor::empty({rows, cols}, dtype);
  eigen::dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = out.mutable_data<T>();
    for (std::int64_t i = 0; i < out.num_elements(); ++i) {
      const double unit = static_cast<double>(engine() >> 11) * 0x1.0p-53;
      p[i] = static_cast<T>((2.0 * unit - 1.0) * 0.05);
    }
  });
  return out;
}

}  // namespace

Embedding::Embedding(int input_dim, int output_dim, std::uint64_t seed, std::string name, DType dtype)
    : Layer(std::move(name)),
      input_dim_(detail::positive("Embedding", input_dim, "input_dim")),
      output_dim_(detail::positive("Embedding", output_dim, "output_dim")),
      seed_(seed),
      dtype_(dtype),
      embeddings_(uniform_table(input_dim, output_dim, seed, dtype),
                  detail::variable_name(this->name(), "embeddings")) {}

Shape Embedding::output_shape(const Shape& input_shape) const {
  if (input_shape.empty()) {
    throw std::invalid_argument(who() + ": ids of shape [] (expected a batch: [batch] or [batch, sequence])");
  }
  Shape out = input_shape;
  out.push_back(output_dim_);
  return out;
}

std::vector<std::int64_t> Embedding::checked_ids(const Tensor& ids_in) const {
  if (ids_in.dtype() != DType::i32 && ids_in.dtype() != DType::i64) {
    throw std::invalid_argument(who() + ": ids are " + std::string(dtype_name(ids_in.dtype())) + " " +
                                shape_to_string(ids_in.shape()) + " (expected int32 or int64)");
  }
  output_shape(ids_in.shape());
  const Tensor ids = detail::on_host(ids_in);
  const Tensor wide = ids.dtype() == DType::i64 ? ids : ids.cast(DType::i64);
  std::vector<std::int64_t> out(static_cast<std::size_t>(wide.num_elements()));
  if (!out.empty()) std::memcpy(out.data(), wide.data<std::int64_t>(), out.size() * sizeof(std::int64_t));
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i] < 0 || out[i] >= input_dim_) {
      throw std::invalid_argument(who() + ": id " + std::to_string(out[i]) + " at position " + std::to_string(i) +
                                  " of the ids " + shape_to_string(ids_in.shape()) + " is out of range (expected 0.." +
                                  std::to_string(input_dim_ - 1) + ": input_dim is " + std::to_string(input_dim_) + ")");
    }
  }
  return out;
}

Tensor Embedding::call(const Tensor& x, const CallContext&) const {
  const std::vector<std::int64_t> ids = checked_ids(x);
  const Tensor table = detail::on_host(embeddings_.value());
  Tensor out = Tensor::empty(output_shape(x.shape()), table.dtype());
  const std::size_t row_bytes = static_cast<std::size_t>(output_dim_) * dtype_size(table.dtype());
  const auto* from = static_cast<const char*>(table.raw_data());
  auto* to = static_cast<char*>(out.raw_mutable_data());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    std::memcpy(to + i * row_bytes, from + static_cast<std::size_t>(ids[i]) * row_bytes, row_bytes);
  }
  return detail::like_device(out, x);
}

LayerGradients Embedding::gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output,
                                    const CallContext&, bool) const {
  detail::check_grad_output(who(), grad_output, output);
  const std::vector<std::int64_t> ids = checked_ids(x);
  if (output.shape() != output_shape(x.shape())) {
    throw std::invalid_argument(who() + ": output of shape " + shape_to_string(output.shape()) + " for ids " +
                                shape_to_string(x.shape()) + " (expected " + shape_to_string(output_shape(x.shape())) +
                                ", what forward gives)");
  }
  const Tensor g = detail::on_host(grad_output);
  Tensor table_grad = Tensor::zeros({input_dim_, output_dim_}, g.dtype());
  eigen::dispatch_float(g.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* gi = g.data<T>();
    T* d = table_grad.mutable_data<T>();
    // In the order of the ids: the same bits on every run.
    for (std::size_t i = 0; i < ids.size(); ++i) {
      T* row = d + ids[i] * output_dim_;
      const T* src = gi + static_cast<std::int64_t>(i) * output_dim_;
      for (int k = 0; k < output_dim_; ++k) row[k] += src[k];
    }
  });
  LayerGradients out;
  out.variables.push_back(detail::like_device(table_grad, grad_output));
  return out;
}

std::string Embedding::config_json() const {
  return nlohmann::json{{"input_dim", input_dim_},
                        {"output_dim", output_dim_},
                        {"seed", seed_},
                        {"dtype", std::string(dtype_name(dtype_))}}
      .dump();
}

}  // namespace troupe::nn
