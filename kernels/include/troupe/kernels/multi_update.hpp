#pragma once

#include <cstdint>

namespace troupe::kernels {

/// One tensor of a multi-tensor optimizer update (a device's whole step in one launch per group of
/// tensors): its elements and device pointers. m is the momentum velocity for update_kind::momentum
/// and Adam's first moment for update_kind::adam; pointers a kind does not use are ignored.
struct update_tensor {
  std::int64_t count;
  const void* w;
  const void* g;
  const void* m;
  const void* v;
  void* out_w;
  void* out_m;
  void* out_v;
};

/// The optimizer of a multi-tensor update.
enum class update_kind : int { sgd = 0, momentum = 1, adam = 2 };

}  // namespace troupe::kernels
