#include "distribute/hierarchical_collectives.hpp"

#include <cstring>

#include "axis.hpp"

namespace troupe::distribute::detail {

// The tensors of one call cross the ring in as few operations as possible: those of one dtype are
// packed into one buffer (of at most bytes_per_pack bytes when that is set; a tensor larger than
// that travels alone), since every ring operation pays the latency of 2(n-1) hops. With
// compression, float32 packs cross as 16-bit values (RingWorkerGroup::all_reduce_in_place).
void HierarchicalCollectives::ring_all_reduce_packed(std::vector<Tensor>& tensors) {
  std::size_t i = 0;
  while (i < tensors.size()) {
    const DType dtype = tensors[i].dtype();
    std::size_t end = i;
    std::size_t bytes = 0;
    while (end < tensors.size() && tensors[end].dtype() == dtype &&
           (end == i || bytes_per_pack_ == 0 || bytes + tensors[end].nbytes() <= bytes_per_pack_)) {
      bytes += tensors[end].nbytes();
      ++end;
    }
    if (end - i == 1) {
      workers_.all_reduce_in_place(tensors[i], compression_);
    } else {
      Tensor pack = Tensor::empty({static_cast<std::int64_t>(bytes / dtype_size(dtype))}, dtype);
      auto* p = static_cast<char*>(pack.raw_mutable_data());
      for (std::size_t k = i; k < end; ++k) {
        if (tensors[k].nbytes() > 0) std::memcpy(p, tensors[k].raw_data(), tensors[k].nbytes());
        p += tensors[k].nbytes();
      }
      workers_.all_reduce_in_place(pack, compression_);
      const auto* q = static_cast<const char*>(pack.raw_data());
      for (std::size_t k = i; k < end; ++k) {
        if (tensors[k].nbytes() > 0) std::memcpy(tensors[k].raw_mutable_data(), q, tensors[k].nbytes());
        q += tensors[k].nbytes();
      }
    }
    i = end;
  }
}

std::vector<Tensor> HierarchicalCollectives::all_reduce(int replica, ReduceOp op, const std::vector<Tensor>& values) {
  std::vector<Tensor> outs = local_.all_reduce(replica, ReduceOp::sum, values);
  local_.merge(replica, &outs, [&](const std::vector<const void*>& all) {
    // On local replica 0: the ring over the workers, then the sums to the other replicas.
    ring_all_reduce_packed(outs);
    for (std::size_t r = 1; r < all.size(); ++r) {
      auto& theirs = *static_cast<std::vector<Tensor>*>(const_cast<void*>(all[r]));
      for (std::size_t i = 0; i < outs.size(); ++i) {
        // A fused local all-reduce hands every replica one shared result: nothing to copy.
        if (outs[i].nbytes() == 0 || theirs[i].shares_storage_with(outs[i])) continue;
        std::memcpy(theirs[i].raw_mutable_data(), outs[i].raw_data(), outs[i].nbytes());
      }
    }
  });
  if (op == ReduceOp::mean) {
    for (Tensor& t : outs) t = t / Scalar(static_cast<std::int64_t>(global_replicas_));
  }
  return outs;
}

Tensor HierarchicalCollectives::all_reduce(int replica, ReduceOp op, const Tensor& value) {
  return all_reduce(replica, op, std::vector<Tensor>{value}).at(0);
}

Tensor HierarchicalCollectives::all_gather(int replica, const Tensor& value, int axis) {
  const int ax = troupe::detail::checked_axis("all_gather", axis, value.rank());
  Tensor mine = local_.all_gather(replica, value, ax);
  local_.merge(replica, &mine, [&](const std::vector<const void*>& all) {
    mine = workers_.concat(mine, ax);
    for (std::size_t r = 1; r < all.size(); ++r) *static_cast<Tensor*>(const_cast<void*>(all[r])) = mine;
  });
  return mine;
}

void HierarchicalCollectives::merge(int replica, const void* mine,
                                    const std::function<void(const std::vector<const void*>&)>& on_first) {
  local_.merge(replica, mine, on_first);
}

}  // namespace troupe::distribute::detail
