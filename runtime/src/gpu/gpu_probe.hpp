#pragma once

namespace troupe::detail {

/// GPUs the CUDA runtime reports; 0 without CUDA support, driver or device. Honours
/// TROUPE_FORCE_CPU=1. Never called from a static initialiser.
int cuda_device_count();

}  // namespace troupe::detail
