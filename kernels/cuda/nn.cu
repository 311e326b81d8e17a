// The kernels behind troupe::nn on GPU tensors: bias and ReLU, softmax, argmax, the losses.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels.hpp"
#include "launch.cuh"

namespace troupe::kernels::cuda {
using namespace detail;  // NOLINT(google-build-using-namespace): the launch helpers of this folder

namespace {

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

// A training step's table (one block): table[0] += *loss; table[loss_at] += *loss * loss_scale when
// loss_at >= 0; table[1] += the rows whose predicted class equals their label, when predicted is
// given. The count is an integer, exact in any order.
template <class T, class L>
__global__ void step_table_kernel(double* table, const T* loss, std::int64_t loss_at, double loss_scale,
                                  const std::int64_t* predicted, const L* labels, std::int64_t rows) {
  __shared__ std::int64_t part[threads_per_block];
  std::int64_t hits = 0;
  if (predicted != nullptr) {
    for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
      hits += predicted[r] == static_cast<std::int64_t>(labels[r]) ? 1 : 0;
    }
  }
  part[threadIdx.x] = hits;
  __syncthreads();
  for (int stride = threads_per_block / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) part[threadIdx.x] += part[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double l = static_cast<double>(*loss);
    table[0] += l;
    if (loss_at >= 0) table[loss_at] += l * loss_scale;
    if (predicted != nullptr) table[1] += static_cast<double>(part[0]);
  }
}

}  // namespace

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

int launch_step_table(double* table, std::int64_t size, const void* loss, scalar_type loss_type, std::int64_t loss_at,
                      double loss_scale, const std::int64_t* predicted, const void* labels, scalar_type label_type,
                      std::int64_t rows, void* stream) {
  if (table == nullptr || loss == nullptr || size < 1 || loss_at >= size || rows < 0) return invalid();
  if (predicted != nullptr && (size < 2 || labels == nullptr)) return invalid();
  if (label_type != scalar_type::i32 && label_type != scalar_type::i64) return invalid();
  auto st = static_cast<cudaStream_t>(stream);
  return with_float_type(loss_type, [&](auto value) {
    using T = decltype(value);
    if (label_type == scalar_type::i32) {
      step_table_kernel<<<1, threads_per_block, 0, st>>>(table, static_cast<const T*>(loss), loss_at, loss_scale,
                                                         predicted, static_cast<const std::int32_t*>(labels), rows);
    } else {
      step_table_kernel<<<1, threads_per_block, 0, st>>>(table, static_cast<const T*>(loss), loss_at, loss_scale,
                                                         predicted, static_cast<const std::int64_t*>(labels), rows);
    }
    return launched();
  });
}

}  // namespace troupe::kernels::cuda
