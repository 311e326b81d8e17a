// Fill, scale, the elementwise arithmetic, casts and the reductions of GPU tensors.

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels.hpp"
#include "launch.cuh"

namespace troupe::kernels::cuda {
using namespace detail;  // NOLINT(google-build-using-namespace): the launch helpers of this folder

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

// reduce_axis over a long axis: one thread per output element reads its `along` values one after
// the other, each read waiting for the last, so a [4096, 1024] bias gradient kept 1024 threads
// waiting on memory for hundreds of microseconds. Here a block of 32 x 8 threads takes 32
// neighbouring outputs of one `o`: all 256 threads load a tile of rows_per_tile rows of those 32
// columns (coalesced, many loads in flight), then one warp adds each column's tile in row order.
// Every output is still acc = 0 + x[0] + x[1] + ... in order: the CPU's bits.
constexpr int tile_columns = 32;
constexpr int tile_row_threads = threads_per_block / tile_columns;  // 8
constexpr int rows_per_tile = 128;

template <class T>
__global__ void reduce_axis_tiled_kernel(const T* in, T* out, std::int64_t outer, std::int64_t along,
                                         std::int64_t inner) {
  __shared__ T tile[rows_per_tile][tile_columns];
  const int tx = static_cast<int>(threadIdx.x) % tile_columns;
  const int ty = static_cast<int>(threadIdx.x) / tile_columns;
  const std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * tile_columns + tx;
  const bool column = k < inner;
  for (std::int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    const T* p = in + o * along * inner + k;
    T acc = T(0);  // as the CPU's reduce_sum, which adds into zeros
    for (std::int64_t a0 = 0; a0 < along; a0 += rows_per_tile) {
      const int n = static_cast<int>(along - a0 < rows_per_tile ? along - a0 : rows_per_tile);
      if (column) {
        for (int r = ty; r < n; r += tile_row_threads) tile[r][tx] = p[(a0 + r) * inner];
      }
      __syncthreads();
      if (ty == 0 && column) {
        for (int r = 0; r < n; ++r) acc += tile[r][tx];
      }
      __syncthreads();
    }
    if (ty == 0 && column) out[o * inner + k] = acc;
  }
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
    // A long axis with few outputs per row of threads: the tiled kernel (same order of additions).
    if (along >= 64 && count < (std::int64_t{1} << 22)) {
      const std::int64_t column_blocks = (inner + tile_columns - 1) / tile_columns;
      if (column_blocks <= 65535) {
        const dim3 grid(static_cast<unsigned>(column_blocks),
                        static_cast<unsigned>(outer < 65535 ? outer : 65535));
        reduce_axis_tiled_kernel<<<grid, threads_per_block, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const T*>(in), static_cast<T*>(out), outer, along, inner);
        return launched();
      }
    }
    return launch_elementwise(
        count, reduce_axis_fn<T>{static_cast<const T*>(in), static_cast<T*>(out), along < 0 ? 0 : along, inner},
        stream);
  });
}

}  // namespace troupe::kernels::cuda
