#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels.hpp"

namespace troupe::kernels::cuda {
namespace {

template <class T>
__global__ void fill_kernel(T* data, std::int64_t count, T value) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x) {
    data[i] = value;
  }
}

template <class T>
__global__ void scale_kernel(T* data, std::int64_t count, T factor) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x) {
    data[i] *= factor;
  }
}

int blocks_for(std::int64_t count) {
  const std::int64_t b = (count + 255) / 256;
  return static_cast<int>(b < 1 ? 1 : (b > 4096 ? 4096 : b));
}

constexpr int threads_per_block = 256;

// One block per row (softmax, argmax), the grid capped like blocks_for's.
int blocks_for_rows(std::int64_t rows) { return static_cast<int>(rows < 1 ? 1 : (rows > 4096 ? 4096 : rows)); }

int invalid() { return static_cast<int>(cudaErrorInvalidValue); }

int launched() { return static_cast<int>(cudaGetLastError()); }

// Calls f with a value of the element type named by `type`.
template <class F>
int with_type(scalar_type type, F&& f) {
  switch (type) {
    case scalar_type::f32: return f(float{});
    case scalar_type::f64: return f(double{});
    case scalar_type::i32: return f(std::int32_t{});
    case scalar_type::i64: return f(std::int64_t{});
    case scalar_type::f16:   // wire formats of the host ring only
    case scalar_type::bf16: break;
  }
  return invalid();
}

// As with_type, for the kernels that take floating types only.
template <class F>
int with_float_type(scalar_type type, F&& f) {
  switch (type) {
    case scalar_type::f32: return f(float{});
    case scalar_type::f64: return f(double{});
    default: return invalid();
  }
}

template <binary_op Op>
using op_tag = std::integral_constant<binary_op, Op>;

template <class F>
int with_op(binary_op op, F&& f) {
  switch (op) {
    case binary_op::add: return f(op_tag<binary_op::add>{});
    case binary_op::sub: return f(op_tag<binary_op::sub>{});
    case binary_op::mul: return f(op_tag<binary_op::mul>{});
    case binary_op::div: return f(op_tag<binary_op::div>{});
  }
  return invalid();
}

// The elementwise kernels: one grid-stride loop, the per-element work in a functor.
template <class F>
__global__ void elementwise_kernel(std::int64_t count, F f) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x) {
    f(i);
  }
}

template <class F>
int launch_elementwise(std::int64_t count, const F& f, void* stream) {
  elementwise_kernel<<<blocks_for(count), threads_per_block, 0, static_cast<cudaStream_t>(stream)>>>(count, f);
  return launched();
}

// The libm functions of T, correctly rounded for sqrt (no fast math anywhere).
__device__ float exp_of(float x) { return expf(x); }
__device__ double exp_of(double x) { return exp(x); }
__device__ float sqrt_of(float x) { return sqrtf(x); }
__device__ double sqrt_of(double x) { return sqrt(x); }

template <class T, binary_op Op>
__device__ T apply(T x, T y, int* div_by_zero) {
  if constexpr (Op == binary_op::add) {
    return static_cast<T>(x + y);
  } else if constexpr (Op == binary_op::sub) {
    return static_cast<T>(x - y);
  } else if constexpr (Op == binary_op::mul) {
    return static_cast<T>(x * y);
  } else {
    if constexpr (std::is_integral_v<T>) {
      if (y == 0) {
        // Any thread may store: they all store the same value, and the caller reads it after the kernel.
        if (div_by_zero != nullptr) *div_by_zero = 1;
        return T(0);
      }
    }
    return static_cast<T>(x / y);
  }
}

template <class T, binary_op Op>
struct binary_fn {
  const T* a;
  const T* b;
  T* out;
  int* div_by_zero;
  __device__ void operator()(std::int64_t i) const { out[i] = apply<T, Op>(a[i], b[i], div_by_zero); }
};

template <class T, binary_op Op>
struct binary_scalar_fn {
  const T* a;
  T s;
  bool scalar_first;
  T* out;
  int* div_by_zero;
  __device__ void operator()(std::int64_t i) const {
    out[i] = scalar_first ? apply<T, Op>(s, a[i], div_by_zero) : apply<T, Op>(a[i], s, div_by_zero);
  }
};

template <class From, class To>
struct cast_fn {
  const From* in;
  To* out;
  __device__ void operator()(std::int64_t i) const { out[i] = static_cast<To>(in[i]); }
};

// The n inputs of reduce_n, passed by value as a kernel parameter (512 bytes).
constexpr int max_reduce_inputs = 64;
struct input_table {
  const void* ptr[max_reduce_inputs];
};

// No __restrict__: out may alias ins.ptr[0], which is safe because each element is read in full
// before it is written, by the same thread.
template <class T>
struct reduce_n_fn {
  input_table ins;
  int n;
  bool mean;
  T* out;
  __device__ void operator()(std::int64_t i) const {
    T acc = static_cast<const T*>(ins.ptr[0])[i];
    for (int r = 1; r < n; ++r) acc += static_cast<const T*>(ins.ptr[r])[i];
    if (mean) acc /= static_cast<T>(n);
    out[i] = acc;
  }
};

// One thread per output element [o, k]; neighbouring threads read neighbouring k (coalesced).
template <class T>
struct reduce_axis_fn {
  const T* in;
  T* out;
  std::int64_t along;
  std::int64_t inner;
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t o = i / inner;
    const std::int64_t k = i % inner;
    const T* p = in + o * along * inner + k;
    T acc = T(0);  // as the CPU's reduce_sum, which adds into zeros
    for (std::int64_t a = 0; a < along; ++a) acc += p[a * inner];
    out[i] = acc;
  }
};

template <class T>
struct sgd_fn {
  const T* w;
  const T* g;
  T* out_w;
  T lr;
  __device__ void operator()(std::int64_t i) const { out_w[i] = w[i] - lr * g[i]; }
};

template <class T>
struct sgd_momentum_fn {
  const T* w;
  const T* g;
  const T* vel;
  T* out_w;
  T* out_vel;
  T lr;
  T m;
  bool nesterov;
  __device__ void operator()(std::int64_t i) const {
    const T gi = g[i];
    const T next_vel = m * vel[i] - lr * gi;
    out_vel[i] = next_vel;
    out_w[i] = nesterov ? w[i] + (m * next_vel - lr * gi) : w[i] + next_vel;
  }
};

template <class T>
struct adam_fn {
  const T* w;
  const T* g;
  const T* m;
  const T* v;
  T* out_w;
  T* out_m;
  T* out_v;
  T lr_t;
  T b1;
  T one_minus_b1;
  T b2;
  T one_minus_b2;
  T eps;
  __device__ void operator()(std::int64_t i) const {
    const T gi = g[i];
    const T next_m = b1 * m[i] + one_minus_b1 * gi;
    // one_minus_b2 * (g * g): g squared first, as the CPU's Adam (Eigen's g.square()) rounds it.
    const T next_v = b2 * v[i] + one_minus_b2 * (gi * gi);
    out_m[i] = next_m;
    out_v[i] = next_v;
    out_w[i] = w[i] - lr_t * next_m / (sqrt_of(next_v) + eps);
  }
};

template <class T>
struct bias_activation_fn {
  const T* x;
  const T* bias;
  T* out;
  std::int64_t cols;
  bool relu;
  __device__ void operator()(std::int64_t i) const {
    const T y = x[i] + bias[i % cols];
    out[i] = (relu && y < T(0)) ? T(0) : y;
  }
};

template <class T>
struct relu_fn {
  const T* x;
  T* out;
  __device__ void operator()(std::int64_t i) const {
    const T y = x[i];
    out[i] = y < T(0) ? T(0) : y;
  }
};

template <class T>
struct relu_grad_fn {
  const T* grad;
  const T* output;
  T* out;
  __device__ void operator()(std::int64_t i) const { out[i] = output[i] > T(0) ? grad[i] : T(0); }
};

// Block-wide reductions over threads_per_block values in shared memory; every thread gets the
// result. The trailing barrier lets the caller reuse `part` right away.
template <class T>
__device__ T block_max(T value, T* part) {
  const int tid = static_cast<int>(threadIdx.x);
  part[tid] = value;
  __syncthreads();
  for (int stride = threads_per_block / 2; stride > 0; stride /= 2) {
    if (tid < stride && part[tid + stride] > part[tid]) part[tid] = part[tid + stride];
    __syncthreads();
  }
  const T result = part[0];
  __syncthreads();
  return result;
}

template <class T>
__device__ T block_sum(T value, T* part) {
  const int tid = static_cast<int>(threadIdx.x);
  part[tid] = value;
  __syncthreads();
  for (int stride = threads_per_block / 2; stride > 0; stride /= 2) {
    if (tid < stride) part[tid] += part[tid + stride];
    __syncthreads();
  }
  const T result = part[0];
  __syncthreads();
  return result;
}

// One block per row: max, then exp(x - max) written to out and summed, then out /= sum.
template <class T>
__global__ void softmax_kernel(const T* x, T* out, std::int64_t rows, std::int64_t cols) {
  __shared__ T part[threads_per_block];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    T* yr = out + r * cols;
    T local_max = xr[0];  // cols >= 1 here; every thread starts from a real element
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      if (xr[j] > local_max) local_max = xr[j];
    }
    const T row_max = block_max(local_max, part);
    T local_sum = T(0);
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const T e = exp_of(xr[j] - row_max);
      yr[j] = e;
      local_sum += e;
    }
    const T sum = block_sum(local_sum, part);
    // Each thread divides the elements it wrote itself: no barrier needed.
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = yr[j] / sum;
  }
}

// One block per row. A thread without elements offers (x[0], cols): it can never win, since element
// 0 ties its value with a smaller index.
template <class T>
__global__ void argmax_kernel(const T* x, std::int64_t* out, std::int64_t rows, std::int64_t cols) {
  __shared__ T best_value[threads_per_block];
  __shared__ std::int64_t best_index[threads_per_block];
  const int tid = static_cast<int>(threadIdx.x);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    T value = xr[0];
    std::int64_t index = cols;
    for (std::int64_t j = tid; j < cols; j += blockDim.x) {
      if (index == cols || xr[j] > value) {
        value = xr[j];
        index = j;
      }
    }
    best_value[tid] = value;
    best_index[tid] = index;
    __syncthreads();
    for (int stride = threads_per_block / 2; stride > 0; stride /= 2) {
      if (tid < stride) {
        const T v = best_value[tid + stride];
        const std::int64_t i = best_index[tid + stride];
        if (v > best_value[tid] || (v == best_value[tid] && i < best_index[tid])) {
          best_value[tid] = v;
          best_index[tid] = i;
        }
      }
      __syncthreads();
    }
    if (tid == 0) out[r] = best_index[0];
    __syncthreads();
  }
}

// Losses: one block per row, as softmax; then one block adds the per-example losses in row order.

__device__ float log_of(float x) { return logf(x); }
__device__ double log_of(double x) { return log(x); }

template <class T, class L>
__global__ void sparse_xent_kernel(const T* logits, const L* labels, T* per_example, T* grad, std::int64_t rows,
                                   std::int64_t cols, T scale, unsigned long long* bad_row) {
  __shared__ T part[threads_per_block];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* z = logits + r * cols;
    const std::int64_t label = static_cast<std::int64_t>(labels[r]);
    const bool valid = label >= 0 && label < cols;
    T local_max = z[0];
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      if (z[j] > local_max) local_max = z[j];
    }
    const T row_max = block_max(local_max, part);
    T local_sum = T(0);
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) local_sum += exp_of(z[j] - row_max);
    const T sum = block_sum(local_sum, part);
    if (threadIdx.x == 0) {
      if (valid) {
        per_example[r] = log_of(sum) + row_max - z[label];  // log-sum-exp(z) - z[label]
      } else {
        per_example[r] = static_cast<T>(NAN);
        if (bad_row != nullptr) atomicMin(bad_row, static_cast<unsigned long long>(r));
      }
    }
    if (grad != nullptr) {
      T* g = grad + r * cols;
      const T factor = scale / sum;
      for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        const T value = exp_of(z[j] - row_max) * factor;  // scale * softmax
        g[j] = valid && j == label ? value - scale : value;
      }
    }
  }
}

template <class T>
__global__ void squared_error_kernel(const T* p, const T* t, T* per_example, T* grad, std::int64_t rows,
                                     std::int64_t cols, T grad_factor) {
  __shared__ T part[threads_per_block];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T local = T(0);
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const T d = p[r * cols + j] - t[r * cols + j];
      local += d * d;
      if (grad != nullptr) grad[r * cols + j] = d * grad_factor;
    }
    const T sum = block_sum(local, part);
    if (threadIdx.x == 0) per_example[r] = sum / static_cast<T>(cols);
  }
}

// total = T(scale * the sum of values[0..n-1]), the sum in double: each thread adds a strided share
// in order, then the shares are added pairwise in a fixed tree. The same bits on every run.
template <class T>
__global__ void scaled_total_kernel(const T* values, std::int64_t n, double scale, T* total) {
  __shared__ double part[threads_per_block];
  double local = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) local += static_cast<double>(values[i]);
  part[threadIdx.x] = local;
  __syncthreads();
  for (int stride = threads_per_block / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) part[threadIdx.x] += part[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) *total = static_cast<T>(part[0] * scale);
}


// Several tensors in one launch: the functors of up to multi_group tensors travel in the kernel's
// parameters; element i of the concatenation belongs to the first tensor whose end exceeds i.
constexpr int multi_group = 24;

template <class F>
struct multi_args {
  F fn[multi_group];
  std::int64_t end[multi_group];
  int n;
};

template <class F>
__global__ void multi_kernel(multi_args<F> a) {
  const std::int64_t total = a.end[a.n - 1];
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x) {
    int t = 0;
    while (i >= a.end[t]) ++t;
    a.fn[t](t == 0 ? i : i - a.end[t - 1]);
  }
}

template <class F, class Make>
int launch_multi(const update_tensor* tensors, int n, Make&& make, void* stream) {
  multi_args<F> args{};
  std::int64_t total = 0;
  auto flush = [&]() -> int {
    if (args.n == 0) return 0;
    multi_kernel<<<blocks_for(total), threads_per_block, 0, static_cast<cudaStream_t>(stream)>>>(args);
    const int rc = launched();
    args = multi_args<F>{};
    total = 0;
    return rc;
  };
  for (int k = 0; k < n; ++k) {
    if (tensors[k].count <= 0) continue;
    args.fn[args.n] = make(tensors[k]);
    total += tensors[k].count;
    args.end[args.n] = total;
    if (++args.n == multi_group) {
      if (const int rc = flush(); rc != 0) return rc;
    }
  }
  return flush();
}

}  // namespace

int launch_fill(void* data, std::int64_t count, int type_code, double value, void* stream) {
  if (count <= 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  switch (type_code) {
    case 0: fill_kernel<<<blocks_for(count), 256, 0, s>>>(static_cast<float*>(data), count, static_cast<float>(value)); break;
    case 1: fill_kernel<<<blocks_for(count), 256, 0, s>>>(static_cast<double*>(data), count, value); break;
    case 2:
      fill_kernel<<<blocks_for(count), 256, 0, s>>>(static_cast<std::int32_t*>(data), count, static_cast<std::int32_t>(value));
      break;
    case 3:
      fill_kernel<<<blocks_for(count), 256, 0, s>>>(static_cast<std::int64_t*>(data), count, static_cast<std::int64_t>(value));
      break;
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(cudaGetLastError());
}

int launch_scale(void* data, std::int64_t count, int type_code, double factor, void* stream) {
  if (count <= 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  switch (type_code) {
    case 0: scale_kernel<<<blocks_for(count), 256, 0, s>>>(static_cast<float*>(data), count, static_cast<float>(factor)); break;
    case 1: scale_kernel<<<blocks_for(count), 256, 0, s>>>(static_cast<double*>(data), count, factor); break;
    case 2:
      scale_kernel<<<blocks_for(count), 256, 0, s>>>(static_cast<std::int32_t*>(data), count, static_cast<std::int32_t>(factor));
      break;
    case 3:
      scale_kernel<<<blocks_for(count), 256, 0, s>>>(static_cast<std::int64_t*>(data), count, static_cast<std::int64_t>(factor));
      break;
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(cudaGetLastError());
}

int launch_binary(binary_op op, const void* a, const void* b, void* out, std::int64_t count, scalar_type type,
                  int* div_by_zero, void* stream) {
  if (count <= 0) return 0;
  return with_type(type, [&](auto value) {
    using T = decltype(value);
    return with_op(op, [&](auto tag) {
      constexpr binary_op Op = decltype(tag)::value;
      const binary_fn<T, Op> f{static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out),
                               div_by_zero};
      return launch_elementwise(count, f, stream);
    });
  });
}

int launch_binary_scalar(binary_op op, const void* a, double f, std::int64_t i, bool scalar_first, void* out,
                         std::int64_t count, scalar_type type, int* div_by_zero, void* stream) {
  if (count <= 0) return 0;
  return with_type(type, [&](auto value) {
    using T = decltype(value);
    T s{};
    if constexpr (std::is_floating_point_v<T>) {
      s = static_cast<T>(f);
    } else {
      s = static_cast<T>(i);
    }
    return with_op(op, [&](auto tag) {
      constexpr binary_op Op = decltype(tag)::value;
      return launch_elementwise(
          count, binary_scalar_fn<T, Op>{static_cast<const T*>(a), s, scalar_first, static_cast<T*>(out), div_by_zero},
          stream);
    });
  });
}

int launch_cast(const void* in, scalar_type from, void* out, scalar_type to, std::int64_t count, void* stream) {
  if (count <= 0) return 0;
  if (is_16bit(from) || is_16bit(to)) return launch_cast_16(in, from, out, to, count, stream);
  return with_type(from, [&](auto from_value) {
    using From = decltype(from_value);
    return with_type(to, [&](auto to_value) {
      using To = decltype(to_value);
      return launch_elementwise(count, cast_fn<From, To>{static_cast<const From*>(in), static_cast<To*>(out)}, stream);
    });
  });
}

int launch_reduce_n(const void* const* ins, int n, void* out, std::int64_t count, scalar_type type, reduce_kind op,
                    void* stream) {
  if (count <= 0) return 0;
  if (ins == nullptr || n < 1 || n > max_reduce_inputs) return invalid();
  input_table table{};
  for (int r = 0; r < n; ++r) table.ptr[r] = ins[r];
  if (is_16bit(type)) return launch_reduce_n_16(ins, n, out, count, type, op, stream);
  return with_type(type, [&](auto value) {
    using T = decltype(value);
    return launch_elementwise(count, reduce_n_fn<T>{table, n, op == reduce_kind::mean, static_cast<T*>(out)}, stream);
  });
}

int launch_reduce_axis(const void* in, void* out, std::int64_t outer, std::int64_t along, std::int64_t inner,
                       scalar_type type, void* stream) {
  if (outer <= 0 || inner <= 0) return 0;
  const std::int64_t count = outer * inner;
  return with_type(type, [&](auto value) {
    using T = decltype(value);
    return launch_elementwise(
        count, reduce_axis_fn<T>{static_cast<const T*>(in), static_cast<T*>(out), along < 0 ? 0 : along, inner},
        stream);
  });
}

int launch_sgd(const void* w, const void* g, void* out_w, std::int64_t count, scalar_type type, double lr,
               void* stream) {
  if (count <= 0) return 0;
  return with_float_type(type, [&](auto value) {
    using T = decltype(value);
    const sgd_fn<T> f{static_cast<const T*>(w), static_cast<const T*>(g), static_cast<T*>(out_w),
                      static_cast<T>(lr)};
    return launch_elementwise(count, f, stream);
  });
}

int launch_sgd_momentum(const void* w, const void* g, const void* vel, void* out_w, void* out_vel, std::int64_t count,
                        scalar_type type, double lr, double momentum, bool nesterov, void* stream) {
  if (count <= 0) return 0;
  return with_float_type(type, [&](auto value) {
    using T = decltype(value);
    return launch_elementwise(count,
                              sgd_momentum_fn<T>{static_cast<const T*>(w), static_cast<const T*>(g),
                                                 static_cast<const T*>(vel), static_cast<T*>(out_w),
                                                 static_cast<T*>(out_vel), static_cast<T>(lr),
                                                 static_cast<T>(momentum), nesterov},
                              stream);
  });
}

int launch_adam(const void* w, const void* g, const void* m, const void* v, void* out_w, void* out_m, void* out_v,
                std::int64_t count, scalar_type type, double lr_t, double b1, double one_minus_b1, double b2,
                double one_minus_b2, double eps, void* stream) {
  if (count <= 0) return 0;
  return with_float_type(type, [&](auto value) {
    using T = decltype(value);
    return launch_elementwise(
        count,
        adam_fn<T>{static_cast<const T*>(w), static_cast<const T*>(g), static_cast<const T*>(m),
                   static_cast<const T*>(v), static_cast<T*>(out_w), static_cast<T*>(out_m), static_cast<T*>(out_v),
                   static_cast<T>(lr_t), static_cast<T>(b1), static_cast<T>(one_minus_b1), static_cast<T>(b2),
                   static_cast<T>(one_minus_b2), static_cast<T>(eps)},
        stream);
  });
}

int launch_multi_update(update_kind kind, const update_tensor* tensors, int n, scalar_type type,
                        const update_coefficients& c, void* stream) {
  if (n < 0 || (n > 0 && tensors == nullptr)) return invalid();
  return with_float_type(type, [&](auto value) {
    using T = decltype(value);
    switch (kind) {
      case update_kind::sgd:
        return launch_multi<sgd_fn<T>>(
            tensors, n,
            [&](const update_tensor& u) {
              return sgd_fn<T>{static_cast<const T*>(u.w), static_cast<const T*>(u.g), static_cast<T*>(u.out_w),
                               static_cast<T>(c.lr)};
            },
            stream);
      case update_kind::momentum:
        return launch_multi<sgd_momentum_fn<T>>(
            tensors, n,
            [&](const update_tensor& u) {
              return sgd_momentum_fn<T>{static_cast<const T*>(u.w),  static_cast<const T*>(u.g),
                                        static_cast<const T*>(u.m),  static_cast<T*>(u.out_w),
                                        static_cast<T*>(u.out_m),    static_cast<T>(c.lr),
                                        static_cast<T>(c.momentum), c.nesterov};
            },
            stream);
      case update_kind::adam:
        return launch_multi<adam_fn<T>>(
            tensors, n,
            [&](const update_tensor& u) {
              return adam_fn<T>{static_cast<const T*>(u.w),        static_cast<const T*>(u.g),
                                static_cast<const T*>(u.m),        static_cast<const T*>(u.v),
                                static_cast<T*>(u.out_w),          static_cast<T*>(u.out_m),
                                static_cast<T*>(u.out_v),          static_cast<T>(c.lr),
                                static_cast<T>(c.b1),              static_cast<T>(c.one_minus_b1),
                                static_cast<T>(c.b2),              static_cast<T>(c.one_minus_b2),
                                static_cast<T>(c.eps)};
            },
            stream);
    }
    return invalid();
  });
}

int launch_bias_activation(const void* x, const void* bias, void* out, std::int64_t rows, std::int64_t cols, bool relu,
                           scalar_type type, void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  return with_float_type(type, [&](auto value) {
    using T = decltype(value);
    return launch_elementwise(
        rows * cols,
        bias_activation_fn<T>{static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<T*>(out), cols, relu},
        stream);
  });
}

int launch_relu(const void* x, void* out, std::int64_t count, scalar_type type, void* stream) {
  if (count <= 0) return 0;
  return with_float_type(type, [&](auto value) {
    using T = decltype(value);
    return launch_elementwise(count, relu_fn<T>{static_cast<const T*>(x), static_cast<T*>(out)}, stream);
  });
}

int launch_relu_grad(const void* grad, const void* output, void* out, std::int64_t count, scalar_type type,
                     void* stream) {
  if (count <= 0) return 0;
  return with_float_type(type, [&](auto value) {
    using T = decltype(value);
    return launch_elementwise(
        count, relu_grad_fn<T>{static_cast<const T*>(grad), static_cast<const T*>(output), static_cast<T*>(out)},
        stream);
  });
}

int launch_softmax(const void* x, void* out, std::int64_t rows, std::int64_t cols, scalar_type type, void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  return with_float_type(type, [&](auto value) {
    using T = decltype(value);
    softmax_kernel<<<blocks_for_rows(rows), threads_per_block, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), static_cast<T*>(out), rows, cols);
    return launched();
  });
}

int launch_argmax(const void* x, std::int64_t* out, std::int64_t rows, std::int64_t cols, scalar_type type,
                  void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  return with_float_type(type, [&](auto value) {
    using T = decltype(value);
    argmax_kernel<<<blocks_for_rows(rows), threads_per_block, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), out, rows, cols);
    return launched();
  });
}

int launch_sparse_softmax_xent(const void* logits, const void* labels, scalar_type label_type, void* per_example,
                               void* grad, void* total, std::int64_t rows, std::int64_t cols, double scale,
                               scalar_type type, unsigned long long* bad_row, void* stream) {
  if (per_example == nullptr || rows < 0 || cols <= 0) return invalid();
  if (label_type != scalar_type::i32 && label_type != scalar_type::i64) return invalid();
  auto st = static_cast<cudaStream_t>(stream);
  return with_float_type(type, [&](auto value) {
    using T = decltype(value);
    if (rows > 0) {
      if (label_type == scalar_type::i32) {
        sparse_xent_kernel<<<blocks_for_rows(rows), threads_per_block, 0, st>>>(
            static_cast<const T*>(logits), static_cast<const std::int32_t*>(labels), static_cast<T*>(per_example),
            static_cast<T*>(grad), rows, cols, static_cast<T>(scale), bad_row);
      } else {
        sparse_xent_kernel<<<blocks_for_rows(rows), threads_per_block, 0, st>>>(
            static_cast<const T*>(logits), static_cast<const std::int64_t*>(labels), static_cast<T*>(per_example),
            static_cast<T*>(grad), rows, cols, static_cast<T>(scale), bad_row);
      }
      const int rc = launched();
      if (rc != 0) return rc;
    }
    if (total != nullptr) {
      scaled_total_kernel<<<1, threads_per_block, 0, st>>>(static_cast<const T*>(per_example), rows, scale,
                                                           static_cast<T*>(total));
    }
    return launched();
  });
}

int launch_squared_error(const void* predictions, const void* targets, void* per_example, void* grad, void* total,
                         std::int64_t rows, std::int64_t cols, double scale, scalar_type type, void* stream) {
  if (per_example == nullptr || rows < 0 || cols <= 0) return invalid();
  auto st = static_cast<cudaStream_t>(stream);
  return with_float_type(type, [&](auto value) {
    using T = decltype(value);
    if (rows > 0) {
      squared_error_kernel<<<blocks_for_rows(rows), threads_per_block, 0, st>>>(
          static_cast<const T*>(predictions), static_cast<const T*>(targets), static_cast<T*>(per_example),
          static_cast<T*>(grad), rows, cols, static_cast<T>(2.0 * scale / static_cast<double>(cols)));
      const int rc = launched();
      if (rc != 0) return rc;
    }
    if (total != nullptr) {
      scaled_total_kernel<<<1, threads_per_block, 0, st>>>(static_cast<const T*>(per_example), rows, scale,
                                                           static_cast<T*>(total));
    }
    return launched();
  });
}

// ---- float16 and bfloat16 ----------------------------------------------------------------------
// The conversions of kernels/half_kernels.hpp, bit for bit, in integer arithmetic (no device
// rounding mode or intrinsic involved), so that a cast on the GPU gives the CPU's bits.
namespace {

__device__ std::uint16_t device_float_to_bf16(float f) {
  std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

__device__ float device_bf16_to_float(std::uint16_t h) { return __uint_as_float(static_cast<std::uint32_t>(h) << 16); }

__device__ std::uint16_t device_float_to_f16(float f) {
  const std::uint32_t u = __float_as_uint(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x03ffu));
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (a < 0x38800000u) {
    const std::uint32_t exp = a >> 23;
    if (exp < 102) return sign;
    const std::uint32_t sig = (a & 0x007fffffu) | 0x00800000u;
    const std::uint32_t shift = 126 - exp;
    std::uint32_t m = sig >> shift;
    const std::uint32_t rest = sig & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (m & 1u))) ++m;
    return static_cast<std::uint16_t>(sign | m);
  }
  a += 0xc8000fffu + ((a >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (a >> 13));
}

__device__ float device_f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x03ffu;
  if (exp == 0) return __uint_as_float(sign | __float_as_uint(static_cast<float>(mant) * 0x1p-24f));
  if (exp == 31) return __uint_as_float(mant == 0 ? (sign | 0x7f800000u) : (sign | 0x7fc00000u | (mant << 13)));
  return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// kernels::float_round_to_odd, for float64 and 64-bit integers on their way to 16 bits.
__device__ float device_round_to_odd(double d) {
  const auto u = static_cast<std::uint64_t>(__double_as_longlong(d));
  const auto sign = static_cast<std::uint32_t>(u >> 32) & 0x80000000u;
  const std::uint64_t mant = u & 0x000fffffffffffffull;
  const int exp = static_cast<int>((u >> 52) & 0x7ffu);
  if (exp == 0x7ff) {
    return __uint_as_float(sign | 0x7f800000u |
                           (mant != 0 ? 0x00400000u | static_cast<std::uint32_t>(mant >> 29) : 0u));
  }
  if (exp == 0 && mant == 0) return __uint_as_float(sign);
  const int e = exp == 0 ? -1022 : exp - 1023;
  const std::uint64_t sig = exp == 0 ? mant : (mant | (1ull << 52));
  if (e > 127) return __uint_as_float(sign | 0x7f7fffffu);
  if (e >= -126) {
    const std::uint32_t sticky = (sig & ((1ull << 29) - 1)) != 0 ? 1u : 0u;
    return __uint_as_float(sign | (static_cast<std::uint32_t>(e + 127) << 23) |
                           static_cast<std::uint32_t>((sig >> 29) & 0x007fffffu) | sticky);
  }
  const int shift = 29 + (-126 - e);
  if (shift >= 64) return __uint_as_float(sign | 1u);
  const std::uint32_t sticky = (sig & ((1ull << shift) - 1)) != 0 ? 1u : 0u;
  return __uint_as_float(sign | static_cast<std::uint32_t>(sig >> shift) | sticky);
}

__device__ float device_round_to_odd(std::int64_t v) {
  const std::uint32_t sign = v < 0 ? 0x80000000u : 0u;
  const std::uint64_t mag = v < 0 ? 0 - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
  if (mag < (1ull << 24)) return __uint_as_float(sign | __float_as_uint(static_cast<float>(mag)));
  const int top = 63 - __clzll(static_cast<long long>(mag));
  const int shift = top - 23;
  const std::uint32_t sticky = (mag & ((1ull << shift) - 1)) != 0 ? 1u : 0u;
  return __uint_as_float(sign | (static_cast<std::uint32_t>(top + 127) << 23) |
                         (static_cast<std::uint32_t>(mag >> shift) & 0x007fffffu) | sticky);
}

// A 16-bit element type in a kernel: its bits, and whether it is bfloat16.
template <bool BF16>
struct half_tag {
  std::uint16_t bits;
};

template <bool BF16>
__device__ float widen(half_tag<BF16> h) {
  return BF16 ? device_bf16_to_float(h.bits) : device_f16_to_float(h.bits);
}
template <bool BF16>
__device__ half_tag<BF16> narrow(float f) {
  return {BF16 ? device_float_to_bf16(f) : device_float_to_f16(f)};
}

// One element of any type as float32 on its way to a 16-bit format (rounded to odd where the
// float32 is not exact), and a float32 as any type (C++'s conversion).
template <class T>
__device__ float to_float_for_16(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, double>) {
    return device_round_to_odd(v);
  } else if constexpr (std::is_same_v<T, half_tag<true>> || std::is_same_v<T, half_tag<false>>) {
    return widen(v);
  } else {
    return device_round_to_odd(static_cast<std::int64_t>(v));
  }
}

template <class From, class To>
struct cast_16_fn {
  const From* in;
  To* out;
  __device__ void operator()(std::int64_t i) const {
    if constexpr (std::is_same_v<To, half_tag<true>> || std::is_same_v<To, half_tag<false>>) {
      out[i] = narrow<std::is_same_v<To, half_tag<true>>>(to_float_for_16(in[i]));
    } else if constexpr (std::is_same_v<From, half_tag<true>> || std::is_same_v<From, half_tag<false>>) {
      out[i] = static_cast<To>(widen(in[i]));  // exact into float32, then C++'s conversion
    } else {
      out[i] = static_cast<To>(in[i]);  // not sent here (launch_cast's pairs), but instantiated
    }
  }
};

template <class F>
int with_any_type(scalar_type type, F&& f) {
  switch (type) {
    case scalar_type::f16: return f(half_tag<false>{});
    case scalar_type::bf16: return f(half_tag<true>{});
    default: return with_type(type, std::forward<F>(f));
  }
}

template <bool BF16>
struct reduce_n_16_fn {
  input_table ins;
  int n;
  bool mean;
  std::uint16_t* out;
  __device__ void operator()(std::int64_t i) const {
    float acc = widen(half_tag<BF16>{static_cast<const std::uint16_t*>(ins.ptr[0])[i]});
    for (int r = 1; r < n; ++r) acc += widen(half_tag<BF16>{static_cast<const std::uint16_t*>(ins.ptr[r])[i]});
    if (mean) acc /= static_cast<float>(n);
    out[i] = narrow<BF16>(acc).bits;
  }
};

}  // namespace

bool is_16bit(scalar_type type) { return type == scalar_type::f16 || type == scalar_type::bf16; }

int launch_cast_16(const void* in, scalar_type from, void* out, scalar_type to, std::int64_t count, void* stream) {
  if (count <= 0) return 0;
  if (!is_16bit(from) && !is_16bit(to)) return launch_cast(in, from, out, to, count, stream);
  return with_any_type(from, [&](auto from_value) {
    using From = decltype(from_value);
    return with_any_type(to, [&](auto to_value) {
      using To = decltype(to_value);
      if constexpr (std::is_same_v<From, To>) {
        const auto bytes = static_cast<std::size_t>(count) * sizeof(std::uint16_t);
        return static_cast<int>(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice,
                                                static_cast<cudaStream_t>(stream)));
      } else {
        return launch_elementwise(count, cast_16_fn<From, To>{static_cast<const From*>(in), static_cast<To*>(out)},
                                  stream);
      }
    });
  });
}

int launch_reduce_n_16(const void* const* ins, int n, void* out, std::int64_t count, scalar_type type,
                       reduce_kind op, void* stream) {
  if (count <= 0) return 0;
  if (!is_16bit(type) || ins == nullptr || n < 1 || n > max_reduce_inputs) return invalid();
  input_table table{};
  for (int r = 0; r < n; ++r) table.ptr[r] = ins[r];
  const bool mean = op == reduce_kind::mean;
  auto* o = static_cast<std::uint16_t*>(out);
  if (type == scalar_type::bf16) return launch_elementwise(count, reduce_n_16_fn<true>{table, n, mean, o}, stream);
  return launch_elementwise(count, reduce_n_16_fn<false>{table, n, mean, o}, stream);
}

}  // namespace troupe::kernels::cuda
