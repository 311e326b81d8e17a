#include "troupe/nn/ops.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "troupe/config.hpp"

#include "elements.hpp"
#include "cpu/intra_op.hpp"
#include "cpu/kernels.hpp"
#include "gpu/gpu.hpp"
#include "tape.hpp"
#include "eigen_maps.hpp"

namespace troupe::nn {

using namespace troupe::nn::eigen;

namespace {

namespace gpu = troupe::detail::gpu;

// The GPU of an operation some of whose operands are GPU tensors: host operands are copied there
// (as TensorFlow places an op's inputs on its device); operands on two GPUs are an error.
Device gpu_of(const char* op, std::initializer_list<const Tensor*> operands) {
  const Tensor* first = nullptr;
  for (const Tensor* t : operands) {
    if (!t->is_gpu()) continue;
    if (first == nullptr) {
      first = t;
    } else if (t->device().index() != first->device().index()) {
      throw std::invalid_argument(std::string(op) + ": operands are on " + first->device().to_string() + " and " +
                                  t->device().to_string() + " (move one with to() first)");
    }
  }
  return first == nullptr ? Device() : first->device();
}

namespace cpu = troupe::detail::cpu;

// The intra-op split (cpu/intra_op.hpp): how many row blocks a product of m rows gets, and where
// block p starts (multiples of 8 rows, so each block keeps the kernels' register tiles whole).
int split_parts(std::int64_t m, std::int64_t n, std::int64_t k) {
  const int threads = cpu::intra_op_threads();
  if (threads <= 1) return 1;
  // Below about a million multiply-adds handing a block to another thread costs more than it saves.
  if (static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) < double(1 << 20)) return 1;
  return static_cast<int>(std::min<std::int64_t>(threads, (m + 7) / 8));
}

std::int64_t block_begin(std::int64_t rows, int parts, int p) {
  const std::int64_t per = ((rows + parts - 1) / parts + 7) / 8 * 8;
  return std::min(rows, per * p);
}

// c[m, n] = op(a) · op(b), its rows split over the intra-op threads.
template <class T>
void gemm_split(const cpu::typed_kernels<T>& kernels, const T* a, const T* b, T* c, std::int64_t m, std::int64_t n,
                std::int64_t k, bool transpose_a, bool transpose_b) {
  const int parts = split_parts(m, n, k);
  if (parts <= 1) {
    kernels.gemm(a, b, c, m, n, k, transpose_a, transpose_b);
    return;
  }
  const std::int64_t lda = transpose_a ? m : k;
  cpu::parallel_for(parts, [&](int p) {
    const std::int64_t r0 = block_begin(m, parts, p), r1 = block_begin(m, parts, p + 1);
    if (r1 <= r0) return;
    kernels.gemm_lda(transpose_a ? a + r0 : a + r0 * k, lda, b, c + r0 * n, r1 - r0, n, k, transpose_a, transpose_b);
  });
}

}  // namespace

const char* activation_name(Activation activation) {
  switch (activation) {
    case Activation::none: return "none";
    case Activation::relu: return "relu";
  }
  return "?";
}

namespace {

Tensor matmul_untaped(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  check_float(a, "matmul");
  check_rank(a, 2, "matmul", "a");
  check_rank(b, 2, "matmul", "b");
  check_same_dtype(a, b, "matmul");
  const std::int64_t m = transpose_a ? a.shape()[1] : a.shape()[0];
  const std::int64_t ka = transpose_a ? a.shape()[0] : a.shape()[1];
  const std::int64_t kb = transpose_b ? b.shape()[1] : b.shape()[0];
  const std::int64_t n = transpose_b ? b.shape()[0] : b.shape()[1];
  if (ka != kb) {
    throw std::invalid_argument("matmul: inner dimensions differ: a " + shape_to_string(a.shape()) +
                                (transpose_a ? " (transposed)" : "") + ", b " + shape_to_string(b.shape()) +
                                (transpose_b ? " (transposed)" : "") + " (expected op(a) [m, k] and op(b) [k, n])");
  }
  if (a.is_gpu() || b.is_gpu()) {
    const Device where = gpu_of("matmul", {&a, &b});
    const Tensor ga = a.to(where);
    const Tensor gb = b.to(where);
    Tensor out = Tensor::empty({m, n}, a.dtype(), where);
    gpu::gemm(where.index(), ga.raw_data(), gb.raw_data(), out.raw_mutable_data(), m, n, ka, transpose_a, transpose_b,
              troupe::detail::to_scalar_type(a.dtype()), nullptr, false, config::tensor_float_32_execution_enabled());
    return out;
  }
  Tensor out = Tensor::empty({m, n}, a.dtype());
  dispatch_float(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    gemm_split<T>(troupe::detail::cpu::kernels_for<T>(), a.data<T>(), b.data<T>(), out.mutable_data<T>(), m, n, ka, transpose_a, transpose_b);
  });
  return out;
}

Tensor relu_untaped(const Tensor& x) {
  check_float(x, "relu");
  if (x.is_gpu()) {
    Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
    gpu::relu(x.device().index(), x.raw_data(), out.raw_mutable_data(), x.num_elements(), troupe::detail::to_scalar_type(x.dtype()));
    return out;
  }
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    troupe::detail::cpu::kernels_for<T>().relu(x.data<T>(), out.mutable_data<T>(), x.num_elements());
  });
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  Tensor out = matmul_untaped(a, b, transpose_a, transpose_b);
  if (troupe::detail::recording({&a, &b})) {
    const Tensor pa = troupe::detail::untaped(a);
    const Tensor pb = troupe::detail::untaped(b);
    // Only the operands the tape follows get a gradient (an input batch needs none): the other
    // product is not computed.
    const bool need_a = troupe::detail::recording({&a});
    const bool need_b = troupe::detail::recording({&b});
    troupe::detail::record(out, {a, b}, [pa, pb, ta = transpose_a, tb = transpose_b, need_a, need_b](const Tensor& g) -> std::vector<Tensor> {
      // C = op(A)·op(B): dop(A) = g·op(B)ᵀ and dop(B) = op(A)ᵀ·g, transposed back where stored so.
      std::vector<Tensor> d(2);
      if (need_a) {
        if (!ta) d[0] = matmul(g, pb, false, !tb);
        else d[0] = tb ? matmul(pb, g, true, true) : matmul(pb, g, false, true);
      }
      if (need_b) {
        if (!tb) d[1] = matmul(pa, g, !ta, false);
        else d[1] = ta ? matmul(g, pa, true, true) : matmul(g, pa, true, false);
      }
      return d;
    });
  }
  return out;
}

Tensor relu(const Tensor& x) {
  Tensor out = relu_untaped(x);
  if (troupe::detail::recording({&x})) {
    troupe::detail::record(out, {x}, [o = troupe::detail::untaped(out)](const Tensor& g) -> std::vector<Tensor> {
      return {relu_grad(g, o)};
    });
  }
  return out;
}

Tensor relu_grad(const Tensor& grad, const Tensor& output) {
  check_float(grad, "relu_grad");
  check_same_shape(grad, output, "relu_grad");
  if (grad.is_gpu() || output.is_gpu()) {
    const Device where = gpu_of("relu_grad", {&grad, &output});
    const Tensor g = grad.to(where);
    const Tensor o = output.to(where);
    Tensor out = Tensor::empty(grad.shape(), grad.dtype(), where);
    gpu::relu_grad(where.index(), g.raw_data(), o.raw_data(), out.raw_mutable_data(), grad.num_elements(),
                   troupe::detail::to_scalar_type(grad.dtype()));
    return out;
  }
  Tensor out = Tensor::empty(grad.shape(), grad.dtype());
  dispatch_float(grad.dtype(), [&](auto tag) {
    using T = decltype(tag);
    troupe::detail::cpu::kernels_for<T>().relu_grad(grad.data<T>(), output.data<T>(), out.mutable_data<T>(), grad.num_elements());
  });
  return out;
}

Tensor softmax(const Tensor& logits) {
  check_float(logits, "softmax");
  check_rank(logits, 2, "softmax", "logits");
  if (logits.is_gpu()) {
    Tensor out = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
    gpu::softmax(logits.device().index(), logits.raw_data(), out.raw_mutable_data(), logits.shape()[0],
                 logits.shape()[1], troupe::detail::to_scalar_type(logits.dtype()));
    return out;
  }
  Tensor out = Tensor::empty(logits.shape(), logits.dtype());
  if (logits.num_elements() == 0) return out;
  dispatch_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    auto z = matrix<T>(logits);
    auto p = matrix<T>(out);
    const Eigen::Array<T, Eigen::Dynamic, 1> max = z.array().rowwise().maxCoeff();
    p.array() = (z.array().colwise() - max).exp();
    const Eigen::Array<T, Eigen::Dynamic, 1> sum = p.array().rowwise().sum();
    p.array().colwise() /= sum;
  });
  return out;
}

Tensor argmax(const Tensor& x) {
  // 16-bit values widen exactly to float32: the same order, the same first maximum.
  if (x.dtype() == DType::f16 || x.dtype() == DType::bf16) return argmax(x.cast(DType::f32));
  check_float(x, "argmax");
  check_rank(x, 2, "argmax", "x");
  const std::int64_t rows = x.shape()[0];
  Tensor out = Tensor::empty({rows}, DType::i64);
  if (rows > 0 && x.shape()[1] == 0) {
    throw std::invalid_argument("argmax: x " + shape_to_string(x.shape()) + " has no columns (expected at least 1)");
  }
  if (x.is_gpu()) {
    Tensor on_gpu = Tensor::empty({rows}, DType::i64, x.device());
    gpu::argmax(x.device().index(), x.raw_data(), static_cast<std::int64_t*>(on_gpu.raw_mutable_data()), rows,
                x.shape()[1], troupe::detail::to_scalar_type(x.dtype()));
    return on_gpu;
  }
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    auto m = matrix<T>(x);
    std::int64_t* o = out.mutable_data<std::int64_t>();
    for (std::int64_t r = 0; r < rows; ++r) {
      Eigen::Index index = 0;
      m.row(r).maxCoeff(&index);
      o[r] = static_cast<std::int64_t>(index);
    }
  });
  return out;
}

namespace {

Tensor dense_forward_untaped(const Tensor& x, const Tensor& kernel, const Tensor& bias, Activation activation) {
  check_float(x, "dense_forward");
  check_rank(x, 2, "dense_forward", "x");
  check_rank(kernel, 2, "dense_forward", "kernel");
  check_rank(bias, 1, "dense_forward", "bias");
  check_same_dtype(x, kernel, "dense_forward");
  check_same_dtype(x, bias, "dense_forward");
  if (x.shape()[1] != kernel.shape()[0] || bias.shape()[0] != kernel.shape()[1]) {
    throw std::invalid_argument("dense_forward: x " + shape_to_string(x.shape()) + ", kernel " +
                                shape_to_string(kernel.shape()) + " and bias " + shape_to_string(bias.shape()) +
                                " do not fit (expected [batch, in], [in, units] and [units])");
  }
  if (x.is_gpu() || kernel.is_gpu() || bias.is_gpu()) {
    const Device where = gpu_of("dense_forward", {&x, &kernel, &bias});
    // One cuBLASLt launch: the product, the bias and the activation.
    const Tensor gx = x.to(where);
    const Tensor gk = kernel.to(where);
    const Tensor gb = bias.to(where);
    Tensor out = Tensor::empty({x.shape()[0], kernel.shape()[1]}, x.dtype(), where);
    gpu::gemm(where.index(), gx.raw_data(), gk.raw_data(), out.raw_mutable_data(), x.shape()[0], kernel.shape()[1],
              x.shape()[1], false, false, troupe::detail::to_scalar_type(x.dtype()), gb.raw_data(),
              activation == Activation::relu, config::tensor_float_32_execution_enabled());
    return out;
  }
  Tensor out = Tensor::empty({x.shape()[0], kernel.shape()[1]}, x.dtype());
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t batch = x.shape()[0], in = x.shape()[1], units = kernel.shape()[1];
    const int parts = split_parts(batch, units, in);
    const auto& k = troupe::detail::cpu::kernels_for<T>();
    cpu::parallel_for(parts, [&](int p) {
      const std::int64_t r0 = block_begin(batch, parts, p), r1 = block_begin(batch, parts, p + 1);
      if (r1 <= r0 && parts > 1) return;
      k.dense_forward(x.data<T>() + r0 * in, kernel.data<T>(), bias.data<T>(), out.mutable_data<T>() + r0 * units,
                      r1 - r0, in, units, activation == Activation::relu);
    });
  });
  return out;
}

}  // namespace

Tensor dense_forward(const Tensor& x, const Tensor& kernel, const Tensor& bias, Activation activation) {
  Tensor out = dense_forward_untaped(x, kernel, bias, activation);
  if (troupe::detail::recording({&x, &kernel, &bias})) {
    // The input's gradient only when the tape follows the input: the first layer's input is a
    // batch, and its gradient (a whole product) would be thrown away.
    const bool need_input = troupe::detail::recording({&x});
    troupe::detail::record(out, {x, kernel, bias},
                           [px = troupe::detail::untaped(x), pk = troupe::detail::untaped(kernel),
                            po = troupe::detail::untaped(out), activation, need_input](const Tensor& g) -> std::vector<Tensor> {
                             DenseGradients d = dense_backward(px, pk, po, g, activation, need_input);
                             return {d.input, d.kernel, d.bias};
                           });
  }
  return out;
}

DenseGradients dense_backward(const Tensor& x, const Tensor& kernel, const Tensor& output, const Tensor& grad_output,
                              Activation activation, bool need_input) {
  check_float(x, "dense_backward");
  check_rank(x, 2, "dense_backward", "x");
  check_rank(kernel, 2, "dense_backward", "kernel");
  check_same_dtype(x, kernel, "dense_backward");
  check_same_dtype(x, grad_output, "dense_backward");
  check_same_shape(output, grad_output, "dense_backward");
  const Shape expected{x.shape()[0], kernel.shape()[1]};
  if (x.shape()[1] != kernel.shape()[0] || grad_output.shape() != expected) {
    throw std::invalid_argument("dense_backward: x " + shape_to_string(x.shape()) + ", kernel " +
                                shape_to_string(kernel.shape()) + " and grad_output " +
                                shape_to_string(grad_output.shape()) +
                                " do not fit (expected [batch, in], [in, units] and [batch, units])");
  }
  if (grad_output.is_gpu() || output.is_gpu() || x.is_gpu() || kernel.is_gpu()) {
    Tensor g = activation == Activation::relu ? relu_grad(grad_output, output) : grad_output;
    const Device where = gpu_of("dense_backward", {&x, &kernel, &g});
    g = g.to(where);
    DenseGradients grads;
    grads.kernel = matmul(x.to(where), g, true, false);
    grads.bias = reduce_sum(g, 0);
    if (need_input) grads.input = matmul(g, kernel.to(where), false, true);
    return grads;
  }
  DenseGradients grads;
  grads.kernel = Tensor::empty(kernel.shape(), kernel.dtype());
  grads.bias = Tensor::empty({kernel.shape()[1]}, kernel.dtype());
  if (need_input) grads.input = Tensor::empty(x.shape(), x.dtype());
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t batch = x.shape()[0], in = x.shape()[1], units = kernel.shape()[1];
    const auto& k = troupe::detail::cpu::kernels_for<T>();
    if (split_parts(batch, units, in) <= 1) {
      k.dense_backward(x.data<T>(), kernel.data<T>(), output.data<T>(), grad_output.data<T>(),
                       activation == Activation::relu, need_input ? grads.input.mutable_data<T>() : nullptr,
                       grads.kernel.mutable_data<T>(), grads.bias.mutable_data<T>(), batch, in, units);
      return;
    }
    // Split over the intra-op threads: the same products as the kernel's, in row blocks.
    Tensor masked = grad_output;
    if (activation == Activation::relu) {
      masked = Tensor::empty(grad_output.shape(), grad_output.dtype());
      k.relu_grad(grad_output.data<T>(), output.data<T>(), masked.mutable_data<T>(), grad_output.num_elements());
    }
    const T* g = masked.data<T>();
    gemm_split<T>(k, x.data<T>(), g, grads.kernel.mutable_data<T>(), in, units, batch, true, false);
    if (need_input) gemm_split<T>(k, g, kernel.data<T>(), grads.input.mutable_data<T>(), batch, in, units, false, true);
    T* db = grads.bias.mutable_data<T>();
    std::fill(db, db + units, T(0));
    for (std::int64_t r = 0; r < batch; ++r) {
      for (std::int64_t c = 0; c < units; ++c) db[c] += g[r * units + c];
    }
  });
  return grads;
}

Tensor glorot_uniform(std::int64_t fan_in, std::int64_t fan_out, std::uint64_t seed, DType dtype) {
  if (fan_in <= 0 || fan_out <= 0) {
    throw std::invalid_argument("glorot_uniform: fan_in " + std::to_string(fan_in) + " and fan_out " +
                                std::to_string(fan_out) + " must be positive");
  }
  const double limit = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  // mt19937_64's sequence is fixed by the standard, unlike the distributions', so the bits are
  // the same with every standard library.
  std::mt19937_64 engine(seed);
  Tensor out = Tensor::empty({fan_in, fan_out}, dtype);
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = out.mutable_data<T>();
    for (std::int64_t i = 0; i < out.num_elements(); ++i) {
      const double unit = static_cast<double>(engine() >> 11) * 0x1.0p-53;  // [0, 1)
      p[i] = static_cast<T>((2.0 * unit - 1.0) * limit);
    }
  });
  return out;
}

double accuracy(const Tensor& logits, const Tensor& labels) {
  if (logits.rank() > 2 && (labels.dtype() == DType::i32 || labels.dtype() == DType::i64) &&
      labels.num_elements() * logits.shape().back() == logits.num_elements()) {
    // A sequence model's logits [batch, ..., classes] with a label per position: over positions.
    return accuracy(logits.reshape({-1, logits.shape().back()}), labels.reshape({labels.num_elements()}));
  }
  Tensor predicted = argmax(logits).to(Device());
  const std::int64_t rows = predicted.num_elements();
  const bool one_hot = (labels.dtype() == DType::f32 || labels.dtype() == DType::f64) && labels.rank() == 2 &&
                       labels.shape() == logits.shape();
  Tensor l = one_hot ? argmax(labels).to(Device()) : labels_as_i64(labels.to(Device()), rows, "accuracy");
  if (rows == 0) return 0.0;
  const std::int64_t* p = predicted.data<std::int64_t>();
  const std::int64_t* y = l.data<std::int64_t>();
  std::int64_t hits = 0;
  for (std::int64_t i = 0; i < rows; ++i) hits += p[i] == y[i] ? 1 : 0;
  return static_cast<double>(hits) / static_cast<double>(rows);
}

}  // namespace troupe::nn
