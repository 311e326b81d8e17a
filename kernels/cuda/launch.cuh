#pragma once

// What every file of troupe's CUDA kernels launches with (internal to kernels/cuda): the grid
// sizes, the element-type and operation dispatch, the grid-stride elementwise kernel, and the
// correctly rounded libm functions of each floating type.

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels.hpp"

namespace troupe::kernels::cuda::detail {

inline int blocks_for(std::int64_t count) {
  const std::int64_t b = (count + 255) / 256;
  return static_cast<int>(b < 1 ? 1 : (b > 4096 ? 4096 : b));
}

constexpr int threads_per_block = 256;

// One block per row (softmax, argmax), the grid capped like blocks_for's.
inline int blocks_for_rows(std::int64_t rows) { return static_cast<int>(rows < 1 ? 1 : (rows > 4096 ? 4096 : rows)); }

inline int invalid() { return static_cast<int>(cudaErrorInvalidValue); }

inline int launched() { return static_cast<int>(cudaGetLastError()); }

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
__device__ inline float exp_of(float x) { return expf(x); }
__device__ inline double exp_of(double x) { return exp(x); }
__device__ inline float sqrt_of(float x) { return sqrtf(x); }
__device__ inline double sqrt_of(double x) { return sqrt(x); }

// The n inputs of reduce_n, passed by value as a kernel parameter (512 bytes).
constexpr int max_reduce_inputs = 64;
struct input_table {
  const void* ptr[max_reduce_inputs];
};

}  // namespace troupe::kernels::cuda::detail
