#include "troupe/nn/losses.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "elements.hpp"
#include "gpu/gpu.hpp"
#include "tape.hpp"
#include "eigen_maps.hpp"

namespace troupe::nn {

using namespace troupe::nn::eigen;
namespace gpu = troupe::detail::gpu;

namespace {

std::int64_t checked_global_batch(std::int64_t global_batch_size, const char* op) {
  if (global_batch_size <= 0) {
    throw std::invalid_argument(std::string(op) + ": global_batch_size is " + std::to_string(global_batch_size) +
                                " (expected a positive number)");
  }
  return global_batch_size;
}

Tensor scalar_of(DType dtype, double value) {
  return dtype == DType::f64 ? Tensor::scalar<double>(value) : Tensor::scalar<float>(static_cast<float>(value));
}

// Softmax cross-entropy of every row. Fills per_example (when not null) and, when grad is not
// null, the gradient of sum(per_example) * scale. Returns that scaled sum as a scalar of the
// logits' dtype, on their device: GPU operands are computed there by one kernel (gpu.hpp), and
// only a bad label is read back.
Tensor device_softmax_cross_entropy(const Tensor& logits_in, const Tensor& labels_in, double scale,
                                    Tensor* per_example, Tensor* grad, const char* op) {
  const Device where = logits_in.is_gpu() ? logits_in.device() : labels_in.device();
  const Tensor logits = logits_in.to(where);
  check_float(logits, op);
  check_rank(logits, 2, op, "logits");
  const std::int64_t rows = logits.shape()[0];
  const std::int64_t classes = logits.shape()[1];
  const Tensor labels = labels_as_i64(labels_in.to(where), rows, op);
  Tensor pe = Tensor::empty({rows}, logits.dtype(), where);
  Tensor g = grad != nullptr ? Tensor::empty(logits.shape(), logits.dtype(), where) : Tensor();
  Tensor total = Tensor::zeros({}, logits.dtype(), where);
  if (rows > 0) {
    if (classes == 0) {
      throw std::invalid_argument(std::string(op) + ": label in row 0 is out of range for 0 classes");
    }
    const std::int64_t bad = gpu::sparse_softmax_xent(
        where.index(), logits.raw_data(), static_cast<const std::int64_t*>(labels.raw_data()), pe.raw_mutable_data(),
        grad != nullptr ? g.raw_mutable_data() : nullptr, total.raw_mutable_data(), rows, classes, scale,
        troupe::detail::to_scalar_type(logits.dtype()));
    if (bad >= 0) {
      const std::int64_t label = labels.to(Device()).data<std::int64_t>()[bad];
      throw std::invalid_argument(std::string(op) + ": label " + std::to_string(label) + " in row " +
                                  std::to_string(bad) + " is out of range for " + std::to_string(classes) +
                                  " classes (expected 0.." + std::to_string(classes - 1) + ")");
    }
  }
  if (per_example != nullptr) *per_example = pe;
  if (grad != nullptr) *grad = g;
  return total;
}

Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels, double scale, Tensor* per_example,
                             Tensor* grad, const char* op) {
  if (logits.is_gpu() || labels.is_gpu()) return device_softmax_cross_entropy(logits, labels, scale, per_example, grad, op);
  check_float(logits, op);
  check_rank(logits, 2, op, "logits");
  const std::int64_t rows = logits.shape()[0];
  const std::int64_t classes = logits.shape()[1];
  Tensor y = labels_as_i64(labels, rows, op);
  const std::int64_t* label = y.data<std::int64_t>();
  for (std::int64_t i = 0; i < rows; ++i) {
    if (label[i] < 0 || label[i] >= classes) {
      throw std::invalid_argument(std::string(op) + ": label " + std::to_string(label[i]) + " in row " +
                                  std::to_string(i) + " is out of range for " + std::to_string(classes) +
                                  " classes (expected 0.." + std::to_string(classes - 1) + ")");
    }
  }
  if (per_example) *per_example = Tensor::empty({rows}, logits.dtype());
  if (grad) *grad = Tensor::empty(logits.shape(), logits.dtype());
  double total = 0.0;
  if (rows == 0) return scalar_of(logits.dtype(), total);
  dispatch_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using Column = Eigen::Array<T, Eigen::Dynamic, 1>;
    auto z = matrix<T>(logits).array();
    const Column max = z.rowwise().maxCoeff();
    // exp(z - max): every entry in (0, 1], the row's largest exactly 1, so the sum is in [1, classes].
    const Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> e = (z.colwise() - max).exp();
    const Column sum = e.rowwise().sum();
    const Column log_sum = sum.log();
    for (std::int64_t i = 0; i < rows; ++i) {
      const T loss = log_sum(i) + max(i) - z(i, label[i]);  // log-sum-exp(z) - z[label]
      if (per_example) per_example->mutable_data<T>()[i] = loss;
      total += static_cast<double>(loss);
    }
    if (grad) {
      auto g = matrix<T>(*grad).array();
      const Column factor = static_cast<T>(scale) / sum;
      g = e.colwise() * factor;  // scale * softmax
      for (std::int64_t i = 0; i < rows; ++i) g(i, label[i]) -= static_cast<T>(scale);
    }
  });
  return scalar_of(logits.dtype(), total * scale);
}

// Softmax cross-entropy of every row against a target distribution of the logits' shape:
// Σ_k t_k · (lse(z) - z_k), whose gradient is softmax(z) · Σ_k t_k - t; as softmax_cross_entropy.
double dense_softmax_cross_entropy(const Tensor& logits, const Tensor& targets_in, double scale, Tensor* per_example,
                                   Tensor* grad, const char* op) {
  if (logits.is_gpu() || targets_in.is_gpu()) {
    // Computed on host copies (no kernel yet); what it gives goes back to the GPU.
    const Device where = logits.is_gpu() ? logits.device() : targets_in.device();
    const double loss =
        dense_softmax_cross_entropy(logits.to(Device()), targets_in.to(Device()), scale, per_example, grad, op);
    if (per_example != nullptr) *per_example = per_example->to(where);
    if (grad != nullptr) *grad = grad->to(where);
    return loss;
  }
  check_float(logits, op);
  check_rank(logits, 2, op, "logits");
  if (targets_in.shape() != logits.shape() || (targets_in.dtype() != DType::f32 && targets_in.dtype() != DType::f64)) {
    throw std::invalid_argument(std::string(op) + ": targets are " + std::string(dtype_name(targets_in.dtype())) + " " +
                                shape_to_string(targets_in.shape()) + " for logits " + shape_to_string(logits.shape()) +
                                " (expected float one-hot rows of the logits' shape; integer labels take "
                                "sparse_categorical_crossentropy)");
  }
  const Tensor targets = targets_in.dtype() == logits.dtype() ? targets_in : targets_in.cast(logits.dtype());
  const std::int64_t rows = logits.shape()[0];
  if (per_example) *per_example = Tensor::empty({rows}, logits.dtype());
  if (grad) *grad = Tensor::empty(logits.shape(), logits.dtype());
  double total = 0.0;
  if (rows == 0) return total;
  dispatch_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using Column = Eigen::Array<T, Eigen::Dynamic, 1>;
    auto z = matrix<T>(logits).array();
    auto t = matrix<T>(targets).array();
    const Column max = z.rowwise().maxCoeff();
    const Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> e = (z.colwise() - max).exp();
    const Column sum = e.rowwise().sum();
    const Column lse = sum.log() + max;
    const Column t_sum = t.rowwise().sum();
    const Column tz = (t * z).rowwise().sum();
    for (std::int64_t i = 0; i < rows; ++i) {
      const T loss = lse(i) * t_sum(i) - tz(i);
      if (per_example) per_example->mutable_data<T>()[i] = loss;
      total += static_cast<double>(loss);
    }
    if (grad) {
      auto g = matrix<T>(*grad).array();
      const Column factor = static_cast<T>(scale) * t_sum / sum;
      g = e.colwise() * factor - t * static_cast<T>(scale);
    }
  });
  return total * scale;
}

// -Σ t · log(clip(p)) of every row, for probabilities p; the gradient -t / p where p is inside the
// clip range, 0 where clipped (Keras's epsilon, 1e-7).
double probability_cross_entropy(const Tensor& probs_in, const Tensor& targets_in, double scale, Tensor* grad,
                                 const char* op) {
  const Tensor probs = probs_in.to(Device());
  const Tensor targets_host = targets_in.to(Device());
  check_float(probs, op);
  check_rank(probs, 2, op, "predictions");
  if (targets_host.shape() != probs.shape() || (targets_host.dtype() != DType::f32 && targets_host.dtype() != DType::f64)) {
    throw std::invalid_argument(std::string(op) + ": targets are " + std::string(dtype_name(targets_host.dtype())) + " " +
                                shape_to_string(targets_host.shape()) + " for predictions " +
                                shape_to_string(probs.shape()) + " (expected float one-hot rows of the predictions' shape)");
  }
  const Tensor targets = targets_host.dtype() == probs.dtype() ? targets_host : targets_host.cast(probs.dtype());
  if (grad) *grad = Tensor::empty(probs.shape(), probs.dtype());
  constexpr double eps = 1e-7;
  double total = 0.0;
  dispatch_float(probs.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = probs.data<T>();
    const T* t = targets.data<T>();
    for (std::int64_t i = 0; i < probs.num_elements(); ++i) {
      const double v = static_cast<double>(p[i]);
      const double clipped = std::min(std::max(v, eps), 1.0 - eps);
      total -= static_cast<double>(t[i]) * std::log(clipped);
      if (grad) {
        grad->mutable_data<T>()[i] =
            v == clipped ? static_cast<T>(-scale * static_cast<double>(t[i]) / v) : T(0);
      }
    }
  });
  if (grad) *grad = grad->to(probs_in.device());
  return total * scale;
}

// Squared error of every row, averaged over its columns; as softmax_cross_entropy.
Tensor squared_error(const Tensor& predictions_in, const Tensor& targets_in, double scale, Tensor* per_example,
                     Tensor* grad, const char* op) {
  const bool on_gpu = predictions_in.is_gpu() || targets_in.is_gpu();
  const Device where = predictions_in.is_gpu() ? predictions_in.device() : targets_in.device();
  const Tensor predictions = on_gpu ? predictions_in.to(where) : predictions_in;
  check_float(predictions, op);
  if (predictions.rank() < 1) {
    throw std::invalid_argument(std::string(op) + ": predictions are a scalar (expected [batch] or [batch, n])");
  }
  if (targets_in.num_elements() != predictions.num_elements() ||
      (targets_in.rank() > 0 && targets_in.shape()[0] != predictions.shape()[0])) {
    throw std::invalid_argument(std::string(op) + ": targets of shape " + shape_to_string(targets_in.shape()) +
                                " for predictions of shape " + shape_to_string(predictions.shape()) +
                                " (expected the same shape)");
  }
  const std::int64_t rows = predictions.shape()[0];
  const std::int64_t cols = rows == 0 ? 1 : predictions.num_elements() / rows;
  const Tensor placed = on_gpu ? targets_in.to(where) : targets_in;
  Tensor targets = placed.dtype() == predictions.dtype() ? placed : placed.cast(predictions.dtype());
  if (on_gpu) {
    // One kernel on the device: the per-example means, the gradient and the scaled total.
    Tensor pe = Tensor::empty({rows}, predictions.dtype(), where);
    Tensor g = grad != nullptr ? Tensor::empty(predictions.shape(), predictions.dtype(), where) : Tensor();
    Tensor total = Tensor::zeros({}, predictions.dtype(), where);
    if (rows > 0) {
      gpu::squared_error(where.index(), predictions.raw_data(), targets.raw_data(), pe.raw_mutable_data(),
                         grad != nullptr ? g.raw_mutable_data() : nullptr, total.raw_mutable_data(), rows, cols, scale,
                         troupe::detail::to_scalar_type(predictions.dtype()));
    }
    if (per_example != nullptr) *per_example = pe;
    if (grad != nullptr) *grad = g;
    return total;
  }
  if (per_example) *per_example = Tensor::empty({rows}, predictions.dtype());
  if (grad) *grad = Tensor::empty(predictions.shape(), predictions.dtype());
  double total = 0.0;
  if (rows == 0) return scalar_of(predictions.dtype(), total);
  dispatch_float(predictions.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using Rows = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
    Rows p(predictions.data<T>(), rows, cols);
    Rows t(targets.data<T>(), rows, cols);
    const Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> diff = p - t;
    const Eigen::Array<T, Eigen::Dynamic, 1> mean = diff.square().rowwise().sum() / static_cast<T>(cols);
    for (std::int64_t i = 0; i < rows; ++i) {
      if (per_example) per_example->mutable_data<T>()[i] = mean(i);
      total += static_cast<double>(mean(i));
    }
    if (grad) array<T>(*grad) = (array<T>(predictions) - array<T>(targets)) * static_cast<T>(2.0 * scale / cols);
  });
  return scalar_of(predictions.dtype(), total * scale);
}

// Row i of d [batch, ...] times g[i]: the gradient through a per-example value whose own
// gradient is d, given the gradient g [batch] of the per-example values.
Tensor scale_rows(const Tensor& d_in, const Tensor& g_in) {
  const Tensor d = d_in.to(Device());
  const Tensor g = g_in.to(Device()).cast(d.dtype());
  Tensor out = Tensor::empty(d.shape(), d.dtype());
  const std::int64_t rows = d.rank() > 0 ? d.shape()[0] : 0;
  const std::int64_t width = rows > 0 ? d.num_elements() / rows : 0;
  dispatch_float(d.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pd = d.data<T>();
    const T* pg = g.data<T>();
    T* o = out.mutable_data<T>();
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < width; ++c) o[r * width + c] = pd[r * width + c] * pg[r];
    }
  });
  return out.to(d_in.device());
}

}  // namespace

Tensor sparse_softmax_cross_entropy_per_example(const Tensor& logits, const Tensor& labels) {
  Tensor per_example;
  softmax_cross_entropy(logits, labels, 1.0, &per_example, nullptr, "sparse_softmax_cross_entropy");
  if (troupe::detail::recording({&logits})) {
    troupe::detail::record(per_example, {logits, labels},
                           [pl = troupe::detail::untaped(logits), labels](const Tensor& g) -> std::vector<Tensor> {
                             Tensor d;
                             softmax_cross_entropy(pl, labels, 1.0, nullptr, &d, "sparse_softmax_cross_entropy");
                             return {scale_rows(d, g), Tensor()};
                           });
  }
  return per_example;
}

namespace {

// Logits [batch, ..., classes] with labels [batch, ...] (or [batch, ..., 1]) as rows [positions,
// classes] and labels [positions], and the number of positions of one example; logits of rank 2
// as they are.
struct PositionRows {
  Tensor logits;
  Tensor labels;
  std::int64_t per_example = 1;
};

PositionRows position_rows(const Tensor& logits, const Tensor& labels, const char* op) {
  if (logits.rank() <= 2) return {logits, labels, 1};
  Shape positions(logits.shape().begin(), logits.shape().end() - 1);
  Shape with_one = positions;
  with_one.push_back(1);
  if ((labels.shape() != positions && labels.shape() != with_one) ||
      (labels.dtype() != DType::i32 && labels.dtype() != DType::i64)) {
    throw std::invalid_argument(std::string(op) + ": labels are " + std::string(dtype_name(labels.dtype())) + " " +
                                shape_to_string(labels.shape()) + " for logits " + shape_to_string(logits.shape()) +
                                " (expected int32 or int64 " + shape_to_string(positions) +
                                ": a label for each position)");
  }
  const std::int64_t classes = logits.shape().back();
  const std::int64_t batch = logits.shape()[0];
  const std::int64_t rows = labels.num_elements();
  return {logits.reshape({rows, classes}), labels.reshape({rows}), batch > 0 ? rows / batch : 1};
}

}  // namespace

LossAndGradient sparse_softmax_cross_entropy(const Tensor& logits, const Tensor& labels) {
  const char* op = "sparse_softmax_cross_entropy";
  const PositionRows r = position_rows(logits, labels, op);
  const std::int64_t rows = r.logits.rank() > 0 ? r.logits.shape()[0] : 0;
  const double scale = rows > 0 ? 1.0 / static_cast<double>(rows) : 0.0;
  LossAndGradient out;
  out.loss = softmax_cross_entropy(r.logits, r.labels, scale, nullptr, &out.gradient, op);
  if (r.logits.shape() != logits.shape()) out.gradient = out.gradient.reshape(logits.shape());
  return out;
}

LossAndGradient sparse_softmax_cross_entropy(const Tensor& logits, const Tensor& labels,
                                             std::int64_t global_batch_size) {
  const char* op = "sparse_softmax_cross_entropy";
  const PositionRows r = position_rows(logits, labels, op);
  const double scale = 1.0 / (static_cast<double>(checked_global_batch(global_batch_size, op)) *
                              static_cast<double>(r.per_example));
  LossAndGradient out;
  out.loss = softmax_cross_entropy(r.logits, r.labels, scale, nullptr, &out.gradient, op);
  if (r.logits.shape() != logits.shape()) out.gradient = out.gradient.reshape(logits.shape());
  return out;
}

Tensor softmax_cross_entropy_per_example(const Tensor& logits, const Tensor& targets) {
  Tensor per_example;
  dense_softmax_cross_entropy(logits, targets, 1.0, &per_example, nullptr, "softmax_cross_entropy");
  if (troupe::detail::recording({&logits})) {
    troupe::detail::record(per_example, {logits, targets},
                           [pl = troupe::detail::untaped(logits),
                            pt = troupe::detail::untaped(targets)](const Tensor& g) -> std::vector<Tensor> {
                             Tensor d;
                             dense_softmax_cross_entropy(pl, pt, 1.0, nullptr, &d, "softmax_cross_entropy");
                             return {scale_rows(d, g), Tensor()};
                           });
  }
  return per_example;
}

LossAndGradient softmax_cross_entropy(const Tensor& logits, const Tensor& targets) {
  const std::int64_t rows = logits.rank() > 0 ? logits.shape()[0] : 0;
  const double scale = rows > 0 ? 1.0 / static_cast<double>(rows) : 0.0;
  LossAndGradient out;
  const double loss = dense_softmax_cross_entropy(logits, targets, scale, nullptr, &out.gradient, "softmax_cross_entropy");
  out.loss = scalar_of(logits.dtype(), loss);
  return out;
}

LossAndGradient softmax_cross_entropy(const Tensor& logits, const Tensor& targets, std::int64_t global_batch_size) {
  const char* op = "softmax_cross_entropy";
  const double scale = 1.0 / static_cast<double>(checked_global_batch(global_batch_size, op));
  LossAndGradient out;
  const double loss = dense_softmax_cross_entropy(logits, targets, scale, nullptr, &out.gradient, op);
  out.loss = scalar_of(logits.dtype(), loss);
  return out;
}

Tensor mean_squared_error_per_example(const Tensor& predictions, const Tensor& targets) {
  Tensor per_example;
  squared_error(predictions, targets, 1.0, &per_example, nullptr, "mean_squared_error");
  if (troupe::detail::recording({&predictions, &targets})) {
    troupe::detail::record(per_example, {predictions, targets},
                           [pp = troupe::detail::untaped(predictions),
                            pt = troupe::detail::untaped(targets)](const Tensor& g) -> std::vector<Tensor> {
                             Tensor d;
                             squared_error(pp, pt, 1.0, nullptr, &d, "mean_squared_error");
                             Tensor dp = scale_rows(d, g);
                             return {dp, -dp};
                           });
  }
  return per_example;
}

LossAndGradient mean_squared_error(const Tensor& predictions, const Tensor& targets) {
  const std::int64_t rows = predictions.rank() > 0 ? predictions.shape()[0] : 0;
  const double scale = rows > 0 ? 1.0 / static_cast<double>(rows) : 0.0;
  LossAndGradient out;
  out.loss = squared_error(predictions, targets, scale, nullptr, &out.gradient, "mean_squared_error");
  return out;
}

LossAndGradient mean_squared_error(const Tensor& predictions, const Tensor& targets, std::int64_t global_batch_size) {
  const char* op = "mean_squared_error";
  const double scale = 1.0 / static_cast<double>(checked_global_batch(global_batch_size, op));
  LossAndGradient out;
  out.loss = squared_error(predictions, targets, scale, nullptr, &out.gradient, op);
  return out;
}

Tensor compute_average_loss(const Tensor& per_example_loss, std::int64_t global_batch_size) {
  const char* op = "compute_average_loss";
  check_float(per_example_loss, op);
  if (per_example_loss.is_gpu()) return compute_average_loss(per_example_loss.to(Device()), global_batch_size);
  const double scale = 1.0 / static_cast<double>(checked_global_batch(global_batch_size, op));
  double total = 0.0;
  dispatch_float(per_example_loss.dtype(), [&](auto tag) {
    using T = decltype(tag);
    total = static_cast<double>(array<T>(per_example_loss).template cast<double>().sum());
  });
  Tensor out = scalar_of(per_example_loss.dtype(), total * scale);
  if (troupe::detail::recording({&per_example_loss})) {
    troupe::detail::record(out, {per_example_loss},
                           [shape = per_example_loss.shape(), scale](const Tensor& g) -> std::vector<Tensor> {
                             // d(scale · Σ l) / dl = scale for every element.
                             return {Tensor::full(shape, 1, g.dtype(), g.device()) * g.to(Device()).cast(DType::f64).item<double>() * scale};
                           });
  }
  return out;
}

namespace {
// A compiled loss runs in float32: a mixed-precision model's 16-bit outputs are cast first (what
// Keras advises with a float32 last layer), and the gradient returned is float32.
Tensor for_loss(const Tensor& outputs) {
  return outputs.dtype() == DType::f16 || outputs.dtype() == DType::bf16 ? outputs.cast(DType::f32) : outputs;
}
}  // namespace

Loss Loss::sparse_categorical_crossentropy() {
  return Loss{"sparse_categorical_crossentropy",
              [](const Tensor& logits, const Tensor& labels, std::int64_t global_batch_size) {
                return sparse_softmax_cross_entropy(for_loss(logits), labels, global_batch_size);
              }};
}

Loss Loss::categorical_crossentropy(bool from_logits) {
  if (from_logits) {
    return Loss{"categorical_crossentropy",
                [](const Tensor& logits, const Tensor& targets, std::int64_t global_batch_size) {
                  return softmax_cross_entropy(logits, targets, global_batch_size);
                }};
  }
  return Loss{"categorical_crossentropy", [](const Tensor& probs, const Tensor& targets, std::int64_t global_batch_size) {
                const char* op = "categorical_crossentropy";
                const double scale = 1.0 / static_cast<double>(checked_global_batch(global_batch_size, op));
                LossAndGradient out;
                const double loss = probability_cross_entropy(probs, targets, scale, &out.gradient, op);
                out.loss = scalar_of(probs.dtype(), loss);
                return out;
              },
              false};
}

Loss Loss::mean_squared_error() {
  return Loss{"mean_squared_error", [](const Tensor& predictions, const Tensor& targets, std::int64_t global_batch_size) {
                return nn::mean_squared_error(for_loss(predictions), targets, global_batch_size);
              }};
}

}  // namespace troupe::nn
