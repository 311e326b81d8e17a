#pragma once

#include <type_traits>

// Private to runtime/src: the CPU kernels behind troupe::nn, compiled once per instruction set
// (kernels_isa.cpp, built as baseline x86-64, AVX2+FMA and AVX-512) and chosen once per process
// (dispatch.cpp): by TROUPE_CPU when set, else the widest path this CPU runs.
//
// Matrix products and the layers' elementwise work may round differently on each path (FMA,
// other blockings): gradients differ in their last bits between hosts with different CPUs. The
// optimizer updates do not: they are plain loops built without FMA contraction
// (-ffp-contract=off), one IEEE operation per source operation in a fixed order, so every path
// computes the same bits, and replicas on hosts with different CPUs stay bit-identical once their
// gradients are all-reduced (the reductions themselves are one baseline build in transport/).

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::detail::cpu {

/// The instruction-set paths, narrowest first.
enum class isa { baseline, avx2, avx512 };

/// "baseline", "avx2" or "avx512".
const char* isa_name(isa path);

/// What this CPU (and its OS) can run.
struct cpu_features {
  bool avx2_fma = false;  ///< AVX2 and FMA3
  bool avx512 = false;    ///< AVX-512 F, VL, BW and DQ
};
cpu_features detect_features();

/// The path for a TROUPE_CPU value (nullptr or empty: the widest one `features` and the build
/// allow). A value that names no path, or a path the CPU lacks or the build left out, throws
/// std::invalid_argument naming TROUPE_CPU, the value and what is possible.
isa choose_isa(const char* troupe_cpu, cpu_features features);

/// The paths this build has and this CPU runs, narrowest first.
std::vector<isa> runnable_isas();

/// One path's kernels. Matrices are row-major and dense; n counts elements.
template <class T>
struct typed_kernels {
  /// c[m, n] = op(a) · op(b), with op(a) [m, k] and op(b) [k, n].
  void (*gemm)(const T* a, const T* b, T* c, std::int64_t m, std::int64_t n, std::int64_t k, bool transpose_a,
               bool transpose_b);
  /// out[batch, units] = act(x[batch, in] · kernel[in, units] + bias[units]).
  void (*dense_forward)(const T* x, const T* kernel, const T* bias, T* out, std::int64_t batch, std::int64_t in,
                        std::int64_t units, bool relu);
  /// With g = grad_output masked by output > 0 when relu: grad_kernel = xᵀ·g, grad_bias = Σ_rows g,
  /// and grad_input = g·kernelᵀ when grad_input is not null.
  void (*dense_backward)(const T* x, const T* kernel, const T* output, const T* grad_output, bool relu,
                         T* grad_input, T* grad_kernel, T* grad_bias, std::int64_t batch, std::int64_t in,
                         std::int64_t units);
  void (*relu)(const T* x, T* out, std::int64_t n);
  void (*relu_grad)(const T* grad, const T* output, T* out, std::int64_t n);
  /// next = w - lr·g
  void (*sgd)(const T* w, const T* g, T* next, std::int64_t n, T lr);
  /// next_v = m·v - lr·g; next = w + (m·next_v - lr·g) when nesterov, else w + next_v
  void (*sgd_momentum)(const T* w, const T* g, const T* v, T* next, T* next_v, std::int64_t n, T lr, T momentum,
                       bool nesterov);
  /// next_m = b1·m + c1·g; next_v = b2·v + c2·g·g; next = w - lr_t·next_m / (sqrt(next_v) + eps)
  void (*adam)(const T* w, const T* g, const T* m, const T* v, T* next, T* next_m, T* next_v, std::int64_t n, T lr_t,
               T b1, T c1, T b2, T c2, T eps);
  /// gemm whose stored a has rows of lda elements: a block of rows of op(a) (the intra-op split,
  /// see intra_op.hpp: with transpose_a those are columns of the stored a).
  void (*gemm_lda)(const T* a, std::int64_t lda, const T* b, T* c, std::int64_t m, std::int64_t n, std::int64_t k,
                   bool transpose_a, bool transpose_b);
};

struct kernel_table {
  isa path;
  typed_kernels<float> f32;
  typed_kernels<double> f64;
};

/// The table of one path; null when the build left it out (not built for this architecture).
/// Running it on a CPU without its instructions is the caller's mistake: see runnable_isas().
const kernel_table* table_for(isa path);

/// This process's kernels: chosen on first use from TROUPE_CPU and the CPU, then fixed. A bad
/// TROUPE_CPU throws (see choose_isa) from every call until it is fixed.
const kernel_table& kernels();

/// This process's kernels for element type T (float or double).
template <class T>
const typed_kernels<T>& kernels_for() {
  if constexpr (std::is_same_v<T, float>) {
    return kernels().f32;
  } else {
    return kernels().f64;
  }
}

/// Logs the line naming the path ("CPU kernels: avx2 (...)", LogLevel::info) once per process,
/// after choosing it (which may throw).
void announce();

// The per-path tables, defined by kernels_isa.cpp in namespaces of those names.
namespace baseline { const kernel_table& table(); }
namespace avx2 { const kernel_table& table(); }
namespace avx512 { const kernel_table& table(); }

}  // namespace troupe::detail::cpu
