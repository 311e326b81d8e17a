#include "distribute/collectives/hierarchical_collectives.hpp"

#include <cstring>
#include <exception>

#include "axis.hpp"
#include "flight_recorder.hpp"

namespace troupe::distribute::detail {

// The tensors of one call cross the ring in as few operations as possible: those of one dtype are
// packed into one buffer (of at most bytes_per_pack bytes when that is set; a tensor larger than
// that travels alone), since every ring operation pays the latency of 2(n-1) hops. With
// compression, float32 packs cross as 16-bit values (RingWorkerGroup::all_reduce_in_place).
void HierarchicalCollectives::ring_all_reduce_packed(
    std::vector<Tensor>& tensors,
    const std::function<void(std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point)>& on_wait) {
  auto noted = [&] {
    if (!on_wait) return;
    const transport::tcp_ring::peer_wait w = workers_.last_all_reduce_wait();
    on_wait(w.begin, w.first_from_prev);
  };
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
      noted();
    } else {
      Tensor pack = Tensor::empty({static_cast<std::int64_t>(bytes / dtype_size(dtype))}, dtype);
      auto* p = static_cast<char*>(pack.raw_mutable_data());
      for (std::size_t k = i; k < end; ++k) {
        if (tensors[k].nbytes() > 0) std::memcpy(p, tensors[k].raw_data(), tensors[k].nbytes());
        p += tensors[k].nbytes();
      }
      workers_.all_reduce_in_place(pack, compression_);
      noted();
      const auto* q = static_cast<const char*>(pack.raw_data());
      for (std::size_t k = i; k < end; ++k) {
        if (tensors[k].nbytes() > 0) std::memcpy(tensors[k].raw_mutable_data(), q, tensors[k].nbytes());
        q += tensors[k].nbytes();
      }
    }
    i = end;
  }
}

HierarchicalCollectives::~HierarchicalCollectives() {
  local_.buckets().shut_down();
  // A bucket of a failed step may still wait on the ring for a worker that is gone or hung.
  if (in_ring_.load()) workers_.shutdown_ring();
  if (ring_thread_.joinable()) ring_thread_.join();
}

namespace {
// Per replica thread: the reduce op of each bucket it started in this step (the local stage
// sums; MEAN divides at the end, as all_reduce does).
thread_local std::vector<ReduceOp> tl_bucket_ops;
}  // namespace

void HierarchicalCollectives::ring_stage() {
  troupe::detail::set_call_site("gradient_buckets");  // this thread's entries in the flight recorder
  GradientBuckets& buckets = local_.buckets();
  std::uint64_t generation = buckets.generation();
  std::size_t next = 0;
  for (;;) {
    const std::uint64_t now = buckets.generation();
    if (now != generation) {
      generation = now;
      next = 0;
    }
    if (!buckets.wait_local(generation, next)) {
      if (buckets.generation() == generation) return;  // shut down
      continue;
    }
    in_ring_.store(true);
    try {
      std::vector<Tensor> sums = buckets.sums(next);  // handles: the storage stays alive
      // Where the ring waited for another worker to join (still differentiating, or not
      // scheduled), apart from the all-reduce itself.
      ring_all_reduce_packed(sums, [&](std::chrono::steady_clock::time_point begin,
                                       std::chrono::steady_clock::time_point first) {
        buckets.note_peer_wait(generation, begin, first);
      });
      buckets.complete(generation, next);
    } catch (...) {
      buckets.fail(generation, next, std::current_exception());
    }
    in_ring_.store(false);
    ++next;
  }
}

std::size_t HierarchicalCollectives::start_all_reduce(int replica, ReduceOp op, std::vector<Tensor> values) {
  std::call_once(ring_thread_started_, [this] {
    local_.buckets().set_after_local(true);
    ring_thread_ = std::thread([this] { ring_stage(); });
  });
  // The flight recorder keeps the bucket queued until its result is taken; the ring stage's
  // all-reduce of it has an entry of its own.
  std::size_t bucket = 0;
  {
    const std::size_t next = local_.note_bucket_started(replica, values);
    try {
      bucket = local_.buckets().start(replica, ReduceOp::sum, std::move(values), local_.device(replica));
    } catch (...) {
      local_.note_bucket_waited(replica, next, false);
      throw;
    }
  }
  if (bucket == 0) tl_bucket_ops.clear();
  tl_bucket_ops.resize(bucket + 1, op);
  tl_bucket_ops[bucket] = op;
  return bucket;
}

std::vector<Tensor> HierarchicalCollectives::wait_all_reduce(int replica, std::size_t bucket,
                                                             std::chrono::steady_clock::time_point& all_started) {
  std::vector<Tensor> outs;
  try {
    outs = local_.buckets().wait(replica, bucket, local_.device(replica), all_started);
  } catch (...) {
    local_.note_bucket_waited(replica, bucket, false);
    throw;
  }
  local_.note_bucket_waited(replica, bucket, true);
  if (bucket < tl_bucket_ops.size() && tl_bucket_ops[bucket] == ReduceOp::mean) {
    for (Tensor& t : outs) t = t / Scalar(static_cast<std::int64_t>(global_replicas_));
  }
  return outs;
}

void HierarchicalCollectives::end_step(int replica) {
  local_.end_step(replica);
  // The ring is free again for whatever follows the step (reduce, the next step's collectives).
  if (replica == 0) local_.buckets().settle();
}

std::vector<Tensor> HierarchicalCollectives::all_reduce(int replica, ReduceOp op, const std::vector<Tensor>& values) {
  std::vector<Tensor> outs = local_.all_reduce(replica, ReduceOp::sum, values);
  local_.merge(replica, &outs, [&](const std::vector<const void*>& all) {
    local_.buckets().settle();  // the ring stage's buckets go first: one order on every worker
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
    local_.buckets().settle();
    mine = workers_.concat(mine, ax);
    for (std::size_t r = 1; r < all.size(); ++r) *static_cast<Tensor*>(const_cast<void*>(all[r])) = mine;
  });
  return mine;
}

void HierarchicalCollectives::merge(int replica, const void* mine,
                                    const std::function<void(const std::vector<const void*>&)>& on_first) {
  // on_first may reach the ring (a cross-worker reduce): the started buckets go first.
  local_.merge(replica, mine, [&](const std::vector<const void*>& all) {
    local_.buckets().settle();
    on_first(all);
  });
}

}  // namespace troupe::distribute::detail
