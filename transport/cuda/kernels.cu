#include <cuda_runtime.h>

#include <cstdint>

#include "kernels.hpp"

namespace troupe::transport::cuda {
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

}  // namespace troupe::transport::cuda
