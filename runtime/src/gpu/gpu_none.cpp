// The GPU interface in a build without CUDA: no GPU tensor can exist, so reaching any of these is
// an error that says how to get GPU support.

#include <stdexcept>

#include "gpu.hpp"

namespace troupe::detail::gpu {
namespace {

[[noreturn]] void unsupported() {
  throw std::logic_error(
      "this build of troupe has no GPU support (configure with the CUDA toolkit and NCCL installed and "
      "TROUPE_ENABLE_CUDA=ON)");
}

}  // namespace

bool built_with_cuda() noexcept { return false; }
void* allocate(int, std::size_t bytes, std::size_t* capacity) {
  *capacity = 0;
  if (bytes == 0) return nullptr;
  unsupported();
}
void release(int, void*, std::size_t) noexcept {}
memory_held memory(int) { unsupported(); }
void reset_peak(int) { unsupported(); }
void copy(void*, int, const void*, int, std::size_t) { unsupported(); }
void copy_rows(int, void*, std::size_t, const void*, std::size_t, std::size_t, std::size_t) { unsupported(); }
void zero(int, void*, std::size_t) { unsupported(); }
void fill(int, void*, std::int64_t, base::scalar_type, double) { unsupported(); }
void binary(int, binary_op, const void*, const void*, void*, std::int64_t, base::scalar_type) { unsupported(); }
void binary_scalar(int, binary_op, const void*, double, std::int64_t, bool, void*, std::int64_t,
                   base::scalar_type) {
  unsupported();
}
void cast(int, const void*, base::scalar_type, void*, base::scalar_type, std::int64_t) { unsupported(); }
void reduce_n(int, const std::vector<const void*>&, void*, std::int64_t, base::scalar_type,
              base::reduce_kind) {
  unsupported();
}
void reduce_axis(int, const void*, void*, std::int64_t, std::int64_t, std::int64_t, base::scalar_type) {
  unsupported();
}
void sgd(int, const void*, const void*, void*, std::int64_t, base::scalar_type, double) { unsupported(); }
void sgd_momentum(int, const void*, const void*, const void*, void*, void*, std::int64_t, base::scalar_type,
                  double, double, bool) {
  unsupported();
}
void adam(int, const void*, const void*, const void*, const void*, void*, void*, void*, std::int64_t,
          base::scalar_type, double, double, double, double, double, double) {
  unsupported();
}
void gemm(int, const void*, const void*, void*, std::int64_t, std::int64_t, std::int64_t, bool, bool,
          base::scalar_type, const void*, bool, bool) {
  unsupported();
}
void bias_activation(int, const void*, const void*, void*, std::int64_t, std::int64_t, bool,
                     base::scalar_type) {
  unsupported();
}
void relu(int, const void*, void*, std::int64_t, base::scalar_type) { unsupported(); }
void relu_grad(int, const void*, const void*, void*, std::int64_t, base::scalar_type) { unsupported(); }
void softmax(int, const void*, void*, std::int64_t, std::int64_t, base::scalar_type) { unsupported(); }
void argmax(int, const void*, std::int64_t*, std::int64_t, std::int64_t, base::scalar_type) { unsupported(); }
void step_table(int, double*, std::int64_t, const void*, base::scalar_type, std::int64_t, double, const std::int64_t*,
                const void*, base::scalar_type, std::int64_t) {
  unsupported();
}
std::int64_t sparse_softmax_xent(int, const void*, const std::int64_t*, void*, void*, void*, std::int64_t,
                                 std::int64_t, double, base::scalar_type) {
  unsupported();
}
void squared_error(int, const void*, const void*, void*, void*, void*, std::int64_t, std::int64_t, double,
                   base::scalar_type) {
  unsupported();
}
void multi_update(int, update_kind, const std::vector<update_tensor>&, base::scalar_type, double, double, bool, double,
                  double, double) {
  unsupported();
}
void* stream(int) { unsupported(); }
void synchronize(int) { unsupported(); }
void finish_work(int, const char*) { unsupported(); }

replica_scope::replica_scope(int device) : device_(device), previous_(false) { unsupported(); }
replica_scope::~replica_scope() = default;

}  // namespace troupe::detail::gpu
