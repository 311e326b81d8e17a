#pragma once

// The CUDA kernels of troupe's GPU path, callable from ordinary C++ (no CUDA syntax here).

#include <cstdint>

namespace troupe::transport::cuda {

/// Sets `count` elements at device pointer `data` (element type by `type_code`: 0 f32, 1 f64,
/// 2 i32, 3 i64) to `value`, on `stream` (a cudaStream_t, or nullptr for the default stream).
/// Returns the cudaError_t of the launch as an int (0: success).
int launch_fill(void* data, std::int64_t count, int type_code, double value, void* stream);

/// data[i] *= factor for `count` elements, on `stream`. Returns the launch's cudaError_t.
int launch_scale(void* data, std::int64_t count, int type_code, double factor, void* stream);

}  // namespace troupe::transport::cuda
