// One instruction-set path of the CPU kernels (see kernels.hpp). CMake compiles this file once
// per path, with that path's -m flags, TROUPE_CPU_ISA naming it and `Eigen` defined to a name of
// its own (troupe_eigen_<path>): Eigen's templates are instantiated in every path, and without
// the rename the linker would keep one path's copy of each for all of them, so a baseline CPU
// could end up running AVX-512 code. Nothing else with vague linkage (std containers, inline
// functions of other headers) is used here, for the same reason.

#include <cmath>
#include <cstdint>

#include <Eigen/Core>

#include "kernels.hpp"

#ifndef TROUPE_CPU_ISA
#error "TROUPE_CPU_ISA must name the instruction-set path (baseline, avx2, avx512)"
#endif

namespace troupe::detail::cpu::TROUPE_CPU_ISA {
namespace {

template <class T>
using matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using cmap = Eigen::Map<const matrix<T>>;
template <class T>
using map = Eigen::Map<matrix<T>>;
template <class T>
using row_map = Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>;
template <class T>
using crow_map = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>;

// C = op(A) op(B), op transposing or not: one product for every combination of the flags.
template <class T, class AMap>
void multiply(map<T>& C, const AMap& A, const cmap<T>& B, bool transpose_a, bool transpose_b) {
  if (!transpose_a && !transpose_b) C.noalias() = A * B;
  if (transpose_a && !transpose_b) C.noalias() = A.transpose() * B;
  if (!transpose_a && transpose_b) C.noalias() = A * B.transpose();
  if (transpose_a && transpose_b) C.noalias() = A.transpose() * B.transpose();
}

template <class T>
void gemm(const T* a, const T* b, T* c, std::int64_t m, std::int64_t n, std::int64_t k, bool transpose_a,
          bool transpose_b) {
  map<T> C(c, m, n);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    C.setZero();
    return;
  }
  // op(a) is [m, k]: stored as [k, m] when transposed.
  const cmap<T> A(a, transpose_a ? k : m, transpose_a ? m : k);
  const cmap<T> B(b, transpose_b ? n : k, transpose_b ? k : n);
  multiply(C, A, B, transpose_a, transpose_b);
}

template <class T>
using strided_cmap = Eigen::Map<const matrix<T>, 0, Eigen::OuterStride<>>;

template <class T>
void gemm_lda(const T* a, std::int64_t lda, const T* b, T* c, std::int64_t m, std::int64_t n, std::int64_t k,
              bool transpose_a, bool transpose_b) {
  map<T> C(c, m, n);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    C.setZero();
    return;
  }
  const strided_cmap<T> A(a, transpose_a ? k : m, transpose_a ? m : k, Eigen::OuterStride<>(lda));
  const cmap<T> B(b, transpose_b ? n : k, transpose_b ? k : n);
  multiply(C, A, B, transpose_a, transpose_b);
}

template <class T>
void dense_forward(const T* x, const T* kernel, const T* bias, T* out, std::int64_t batch, std::int64_t in,
                   std::int64_t units, bool relu) {
  map<T> y(out, batch, units);
  if (batch == 0 || units == 0) return;
  if (in == 0) {
    y.setZero();
  } else {
    y.noalias() = cmap<T>(x, batch, in) * cmap<T>(kernel, in, units);
  }
  y.rowwise() += crow_map<T>(bias, units);
  if (relu) y = y.cwiseMax(T(0));
}

template <class T>
void dense_backward(const T* x, const T* kernel, const T* output, const T* grad_output, bool relu, T* grad_input,
                    T* grad_kernel, T* grad_bias, std::int64_t batch, std::int64_t in, std::int64_t units) {
  matrix<T> masked;
  const T* g = grad_output;
  if (relu) {
    masked.resize(batch, units);
    masked.array() = (cmap<T>(output, batch, units).array() > T(0)).select(cmap<T>(grad_output, batch, units).array(), T(0));
    g = masked.data();
  }
  const cmap<T> G(g, batch, units);
  gemm<T>(x, g, grad_kernel, in, units, batch, true, false);
  row_map<T> db(grad_bias, units);
  if (batch == 0) {
    db.setZero();
  } else {
    db = G.colwise().sum();
  }
  if (grad_input != nullptr) gemm<T>(g, kernel, grad_input, batch, in, units, false, true);
}

template <class T>
void relu(const T* __restrict x, T* __restrict out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = x[i] > T(0) ? x[i] : T(0);
}

template <class T>
void relu_grad(const T* __restrict grad, const T* __restrict output, T* __restrict out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = output[i] > T(0) ? grad[i] : T(0);
}

// The updates: one IEEE operation per source operation, in source order. This file is built with
// -ffp-contract=off, so no multiply-add is fused on any path and every path gives the same bits.
template <class T>
void sgd(const T* __restrict w, const T* __restrict g, T* __restrict next, std::int64_t n, T lr) {
  for (std::int64_t i = 0; i < n; ++i) next[i] = w[i] - lr * g[i];
}

template <class T>
void sgd_momentum(const T* __restrict w, const T* __restrict g, const T* __restrict v, T* __restrict next,
                  T* __restrict next_v, std::int64_t n, T lr, T momentum, bool nesterov) {
  if (nesterov) {
    for (std::int64_t i = 0; i < n; ++i) {
      const T velocity = momentum * v[i] - lr * g[i];
      next_v[i] = velocity;
      next[i] = w[i] + (momentum * velocity - lr * g[i]);
    }
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      const T velocity = momentum * v[i] - lr * g[i];
      next_v[i] = velocity;
      next[i] = w[i] + velocity;
    }
  }
}

template <class T>
void adam(const T* __restrict w, const T* __restrict g, const T* __restrict m, const T* __restrict v,
          T* __restrict next, T* __restrict next_m, T* __restrict next_v, std::int64_t n, T lr_t, T b1, T c1, T b2,
          T c2, T eps) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T mi = b1 * m[i] + c1 * g[i];
    const T vi = b2 * v[i] + c2 * (g[i] * g[i]);
    next_m[i] = mi;
    next_v[i] = vi;
    // sqrt is correctly rounded in every instruction set, scalar or vector.
    next[i] = w[i] - lr_t * mi / (std::sqrt(vi) + eps);
  }
}

template <class T>
constexpr typed_kernels<T> typed() {
  return {&gemm<T>,  &dense_forward<T>, &dense_backward<T>, &relu<T>,    &relu_grad<T>,
          &sgd<T>,   &sgd_momentum<T>,  &adam<T>,           &gemm_lda<T>};
}

}  // namespace

const kernel_table& table() {
  static const kernel_table t{isa::TROUPE_CPU_ISA, typed<float>(), typed<double>()};
  return t;
}

}  // namespace troupe::detail::cpu::TROUPE_CPU_ISA
