// NCCL collectives in a build without CUDA: GPU replicas cannot exist there, so these only say so.

#include <stdexcept>

#include "distribute/collectives/nccl_collectives.hpp"

namespace troupe::distribute::detail {
namespace {

[[noreturn]] void unsupported() {
  throw std::logic_error("this build of troupe has no NCCL support (it was built without CUDA)");
}

}  // namespace

struct NcclCollectives::impl {};

NcclCollectives::NcclCollectives(transport::shm_group&, std::vector<Device>, std::chrono::milliseconds, NcclWorld) {
  unsupported();
}
NcclCollectives::~NcclCollectives() = default;
std::vector<Tensor> NcclCollectives::all_reduce(int, ReduceOp, const std::vector<Tensor>&) { unsupported(); }
Tensor NcclCollectives::all_reduce(int, ReduceOp, const Tensor&) { unsupported(); }
Tensor NcclCollectives::all_gather(int, const Tensor&, int) { unsupported(); }
void NcclCollectives::merge(int, const void*, const std::function<void(const std::vector<const void*>&)>&) {
  unsupported();
}
void NcclCollectives::prepare(std::uint64_t) {}
void NcclCollectives::fail() noexcept {}
void NcclCollectives::drain(int) {}

std::string nccl_unique_id() { unsupported(); }

Tensor nccl_reduce(ReduceOp, const std::vector<Tensor>&, std::shared_ptr<void>&, std::mutex&) { unsupported(); }

}  // namespace troupe::distribute::detail
