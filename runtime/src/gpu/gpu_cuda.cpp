// GPU memory, streams, copies and kernel launches for GPU tensors (see gpu.hpp for the rules).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpu.hpp"
#include "kernels.hpp"

namespace troupe::detail::gpu {
namespace {

namespace kernels = troupe::kernels::cuda;

constexpr int max_devices = 64;
constexpr std::size_t staging_bytes = std::size_t{4} << 20;  // per buffer; two per thread
constexpr std::size_t cache_limit = std::size_t{2} << 30;    // idle blocks a thread keeps per GPU

// Sizes are rounded so that a step's tensors find their blocks again: to 512 bytes, and to 2 MiB
// from 2 MiB up.
std::size_t block_size(std::size_t bytes) {
  const std::size_t unit = bytes >= (std::size_t{2} << 20) ? (std::size_t{2} << 20) : 512;
  return (bytes + unit - 1) / unit * unit;
}

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
  }
}

void check_launch(int rc, const char* what) { check(static_cast<cudaError_t>(rc), what); }

void check_device(int device) {
  if (device < 0 || device >= max_devices) {
    throw std::invalid_argument("GPU index " + std::to_string(device) + " is out of range");
  }
}

// Pools keep freed blocks for reuse instead of returning them at every synchronisation.
void configure_pool(int device) {
  static std::once_flag flags[max_devices];
  std::call_once(flags[device], [device] {
    cudaMemPool_t pool = nullptr;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
      std::uint64_t keep = UINT64_MAX;
      (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    (void)cudaGetLastError();
  });
}

// What one thread holds per GPU: its stream, and two pinned staging buffers for host copies.
struct thread_state {
  cudaStream_t streams[max_devices] = {};
  void* staging[2] = {nullptr, nullptr};
  cudaEvent_t staged[2] = {nullptr, nullptr};
  int* div_flag[max_devices] = {};
  unsigned long long* row_flag[max_devices] = {};  // the first bad label's row, for losses
  bool replica = false;
  // Blocks this thread released, by size, for it to allocate again without a CUDA call. A block
  // is released here only when this thread's stream holds the last work on it (gpu.hpp), so
  // handing it out again on the same stream is ordered after that work.
  std::unordered_map<std::size_t, std::vector<void*>> cached[max_devices];
  std::size_t cached_bytes[max_devices] = {};

  void drop_cache(int d) {
    for (auto& [size, blocks] : cached[d]) {
      for (void* p : blocks) (void)cudaFreeAsync(p, streams[d]);
    }
    cached[d].clear();
    cached_bytes[d] = 0;
  }

  ~thread_state() {
    for (int d = 0; d < max_devices; ++d) {
      if (streams[d] != nullptr) {
        cudaSetDevice(d);
        drop_cache(d);
        cudaStreamSynchronize(streams[d]);
        if (div_flag[d] != nullptr) cudaFree(div_flag[d]);
        if (row_flag[d] != nullptr) cudaFree(row_flag[d]);
        cudaStreamDestroy(streams[d]);
      }
    }
    for (int b = 0; b < 2; ++b) {
      if (staged[b] != nullptr) cudaEventDestroy(staged[b]);
      if (staging[b] != nullptr) cudaFreeHost(staging[b]);
    }
  }

  cudaStream_t stream_for(int device) {
    check_device(device);
    // Most calls find the device current already; asking is cheaper than setting it again.
    int current = -1;
    if (streams[device] != nullptr && cudaGetDevice(&current) == cudaSuccess && current == device) {
      return streams[device];
    }
    if (cudaSetDevice(device) != cudaSuccess) {
      (void)cudaGetLastError();
      int count = 0;
      if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
      (void)cudaGetLastError();
      throw std::invalid_argument(
          "GPU:" + std::to_string(device) + " is not available: " +
          (count == 0 ? std::string("this machine has no GPU (the CUDA runtime reports none); use a CPU device")
                      : "only " + std::to_string(count) + " GPU(s) exist (GPU:0..GPU:" + std::to_string(count - 1) +
                            ")"));
    }
    if (streams[device] == nullptr) {
      configure_pool(device);
      check(cudaStreamCreateWithFlags(&streams[device], cudaStreamNonBlocking), "cudaStreamCreate");
    }
    return streams[device];
  }

  void ensure_staging() {
    if (staging[0] != nullptr) return;
    for (int b = 0; b < 2; ++b) {
      check(cudaHostAlloc(&staging[b], staging_bytes, cudaHostAllocPortable), "cudaHostAlloc (staging)");
      check(cudaEventCreateWithFlags(&staged[b], cudaEventDisableTiming), "cudaEventCreate");
    }
  }
};

thread_state& state() {
  thread_local thread_state s;
  return s;
}

// After an operation: a replica leaves its work queued, any other thread waits for it.
void finish(int device, const char* what) {
  thread_state& s = state();
  if (!s.replica) check(cudaStreamSynchronize(s.streams[device]), what);
}

int code(base::scalar_type t) { return static_cast<int>(t); }

// Blocks released by threads that wait for their work (not replicas): idle, so any thread may
// take them. Never destroyed: tensors may be released during static destruction.
struct idle_pool {
  std::mutex mutex;
  std::unordered_map<std::size_t, std::vector<void*>> blocks;
  std::size_t bytes = 0;

  void* take(std::size_t size) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = blocks.find(size);
    if (it == blocks.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    bytes -= size;
    return p;
  }

  bool give(void* p, std::size_t size) {
    std::lock_guard<std::mutex> lock(mutex);
    if (bytes + size > cache_limit) return false;
    blocks[size].push_back(p);
    bytes += size;
    return true;
  }

  void drop(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& [size, list] : blocks) {
      for (void* p : list) (void)cudaFreeAsync(p, stream);
    }
    blocks.clear();
    bytes = 0;
  }
};

idle_pool& idle(int device) {
  static auto* pools = new idle_pool[max_devices];
  return pools[device];
}

// Bytes handed to tensors per GPU, for memory().
struct held_bytes {
  std::atomic<std::int64_t> current{0};
  std::atomic<std::int64_t> peak{0};

  void add(std::size_t bytes) {
    const std::int64_t now = current.fetch_add(static_cast<std::int64_t>(bytes)) + static_cast<std::int64_t>(bytes);
    std::int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
  void remove(std::size_t bytes) { current.fetch_sub(static_cast<std::int64_t>(bytes)); }
};

held_bytes& held(int device) {
  static auto* counts = new held_bytes[max_devices];  // never destroyed, as the pools
  return counts[device];
}

}  // namespace

bool built_with_cuda() noexcept { return true; }

memory_held memory(int device) {
  check_device(device);
  return {held(device).current.load(), held(device).peak.load()};
}

void reset_peak(int device) {
  check_device(device);
  held(device).peak.store(held(device).current.load());
}

void* stream(int device) { return state().stream_for(device); }

void finish_work(int device, const char* what) { finish(device, what); }

void synchronize(int device) { check(cudaStreamSynchronize(state().stream_for(device)), "cudaStreamSynchronize"); }

void* allocate(int device, std::size_t bytes, std::size_t* capacity) {
  *capacity = 0;
  if (bytes == 0) return nullptr;
  thread_state& st = state();
  cudaStream_t s = st.stream_for(device);
  const std::size_t size = block_size(bytes);
  auto it = st.cached[device].find(size);
  if (it != st.cached[device].end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    st.cached_bytes[device] -= size;
    *capacity = size;
    held(device).add(size);
    return p;
  }
  if (void* p = idle(device).take(size)) {
    *capacity = size;
    held(device).add(size);
    return p;
  }
  void* p = nullptr;
  cudaError_t rc = cudaMallocAsync(&p, size, s);
  if (rc == cudaErrorMemoryAllocation) {
    // Give the kept blocks back and try once more.
    (void)cudaGetLastError();
    st.drop_cache(device);
    idle(device).drop(s);
    (void)cudaStreamSynchronize(s);
    rc = cudaMallocAsync(&p, size, s);
  }
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_bytes = 0, total = 0;
    (void)cudaMemGetInfo(&free_bytes, &total);
    throw std::runtime_error("GPU:" + std::to_string(device) + ": cannot allocate " + std::to_string(bytes) +
                             " bytes (" + cudaGetErrorString(rc) + "; " + std::to_string(free_bytes >> 20) + " of " +
                             std::to_string(total >> 20) + " MiB free)");
  }
  *capacity = size;
  held(device).add(size);
  return p;
}

void release(int device, void* data, std::size_t capacity) noexcept {
  if (data == nullptr) return;
  if (device >= 0 && device < max_devices) held(device).remove(capacity);
  try {
    thread_state& st = state();
    cudaStream_t s = st.stream_for(device);
    try {
      if (!st.replica) {
        // Nothing of this thread's is pending on it (it waits for its work): any thread may reuse it.
        if (idle(device).give(data, capacity)) return;
      } else if (st.cached_bytes[device] + capacity <= cache_limit) {
        // The replica's own stream may still use it: only this thread's later work, ordered after
        // that on the same stream, may have it.
        st.cached[device][capacity].push_back(data);
        st.cached_bytes[device] += capacity;
        return;
      }
    } catch (const std::bad_alloc&) {
      // no room to remember it: free it
    }
    if (cudaFreeAsync(data, s) != cudaSuccess) (void)cudaGetLastError();
  } catch (...) {
    // A stream cannot be had while the process is going down: the driver reclaims the memory.
  }
}

void copy(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes) {
  if (bytes == 0) return;
  thread_state& s = state();
  if (dst_device >= 0 && src_device >= 0) {
    if (dst_device == src_device) {
      cudaStream_t st = s.stream_for(dst_device);
      check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st), "cudaMemcpyAsync (GPU to GPU)");
      finish(dst_device, "cudaStreamSynchronize");
      return;
    }
    // Another GPU: the source must be complete before the destination's stream reads it, and the
    // copy complete before this returns even on a replica: the source's memory is reused on the
    // source GPU's stream, which knows nothing of the destination's.
    check(cudaStreamSynchronize(s.stream_for(src_device)), "cudaStreamSynchronize");
    cudaStream_t st = s.stream_for(dst_device);
    check(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, st), "cudaMemcpyPeerAsync");
    check(cudaStreamSynchronize(st), "cudaStreamSynchronize");
    return;
  }
  s.ensure_staging();
  if (dst_device >= 0) {
    // Host to GPU: fill one staging buffer while the other one's copy runs.
    cudaStream_t st = s.stream_for(dst_device);
    const char* in = static_cast<const char*>(src);
    char* out = static_cast<char*>(dst);
    for (std::size_t off = 0, chunk = 0; off < bytes; off += staging_bytes, ++chunk) {
      const int b = static_cast<int>(chunk % 2);
      const std::size_t n = std::min(staging_bytes, bytes - off);
      check(cudaEventSynchronize(s.staged[b]), "cudaEventSynchronize");
      std::memcpy(s.staging[b], in + off, n);
      check(cudaMemcpyAsync(out + off, s.staging[b], n, cudaMemcpyHostToDevice, st), "cudaMemcpyAsync (to the GPU)");
      check(cudaEventRecord(s.staged[b], st), "cudaEventRecord");
    }
    finish(dst_device, "cudaStreamSynchronize");
    return;
  }
  if (src_device >= 0) {
    // GPU to host: the next chunk is copied while this one is read out of its staging buffer.
    cudaStream_t st = s.stream_for(src_device);
    const char* in = static_cast<const char*>(src);
    char* out = static_cast<char*>(dst);
    const std::size_t chunks = (bytes + staging_bytes - 1) / staging_bytes;
    auto enqueue = [&](std::size_t c) {
      const int b = static_cast<int>(c % 2);
      const std::size_t off = c * staging_bytes;
      const std::size_t n = std::min(staging_bytes, bytes - off);
      check(cudaMemcpyAsync(s.staging[b], in + off, n, cudaMemcpyDeviceToHost, st), "cudaMemcpyAsync (to the host)");
      check(cudaEventRecord(s.staged[b], st), "cudaEventRecord");
    };
    enqueue(0);
    for (std::size_t c = 0; c < chunks; ++c) {
      if (c + 1 < chunks) enqueue(c + 1);
      const int b = static_cast<int>(c % 2);
      const std::size_t off = c * staging_bytes;
      const std::size_t n = std::min(staging_bytes, bytes - off);
      check(cudaEventSynchronize(s.staged[b]), "cudaEventSynchronize");
      std::memcpy(out + off, s.staging[b], n);
    }
    return;
  }
  std::memcpy(dst, src, bytes);
}

void copy_rows(int device, void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
               std::size_t row_bytes, std::size_t rows) {
  if (row_bytes == 0 || rows == 0) return;
  cudaStream_t st = state().stream_for(device);
  check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice, st),
        "cudaMemcpy2DAsync");
  finish(device, "cudaStreamSynchronize");
}

void zero(int device, void* data, std::size_t bytes) {
  if (bytes == 0) return;
  cudaStream_t st = state().stream_for(device);
  check(cudaMemsetAsync(data, 0, bytes, st), "cudaMemsetAsync");
  finish(device, "cudaStreamSynchronize");
}

void fill(int device, void* data, std::int64_t count, base::scalar_type type, double value) {
  cudaStream_t st = state().stream_for(device);
  check_launch(kernels::launch_fill(data, count, code(type), value, st), "fill kernel");
  finish(device, "fill kernel");
}

namespace {

// Integer division: the kernel flags a zero divisor; the caller learns of it before returning.
template <class Launch>
void with_division_check(int device, bool integer_division, const char* what, Launch&& launch) {
  thread_state& s = state();
  cudaStream_t st = s.stream_for(device);
  int* flag = nullptr;
  if (integer_division) {
    if (s.div_flag[device] == nullptr) {
      void* p = nullptr;
      check(cudaMalloc(&p, sizeof(int)), "cudaMalloc");
      s.div_flag[device] = static_cast<int*>(p);
    }
    flag = s.div_flag[device];
    check(cudaMemsetAsync(flag, 0, sizeof(int), st), "cudaMemsetAsync");
  }
  check_launch(launch(flag, st), what);
  if (!integer_division) {
    finish(device, what);
    return;
  }
  int host_flag = 0;
  check(cudaMemcpyAsync(&host_flag, flag, sizeof(int), cudaMemcpyDeviceToHost, st), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(st), what);
  if (host_flag != 0) throw std::invalid_argument("operator/: integer division by zero");
}

bool is_integer(base::scalar_type t) {
  return t == base::scalar_type::i32 || t == base::scalar_type::i64;
}

}  // namespace

void binary(int device, binary_op op, const void* a, const void* b, void* out, std::int64_t count,
            base::scalar_type type) {
  with_division_check(device, op == binary_op::div && is_integer(type) && count > 0, "elementwise kernel",
                      [&](int* flag, cudaStream_t st) {
                        return kernels::launch_binary(static_cast<kernels::binary_op>(op), a, b, out, count, type,
                                                      flag, st);
                      });
}

void binary_scalar(int device, binary_op op, const void* a, double f, std::int64_t i, bool scalar_first, void* out,
                   std::int64_t count, base::scalar_type type) {
  with_division_check(device, op == binary_op::div && is_integer(type) && count > 0, "elementwise kernel",
                      [&](int* flag, cudaStream_t st) {
                        return kernels::launch_binary_scalar(static_cast<kernels::binary_op>(op), a, f, i,
                                                             scalar_first, out, count, type, flag, st);
                      });
}

void cast(int device, const void* in, base::scalar_type from, void* out, base::scalar_type to,
          std::int64_t count) {
  cudaStream_t st = state().stream_for(device);
  check_launch(kernels::launch_cast(in, from, out, to, count, st), "cast kernel");
  finish(device, "cast kernel");
}

void reduce_n(int device, const std::vector<const void*>& ins, void* out, std::int64_t count,
              base::scalar_type type, base::reduce_kind op) {
  cudaStream_t st = state().stream_for(device);
  // The kernel takes at most 64 inputs: longer lists fold into the output 63 at a time.
  constexpr std::size_t max_inputs = 64;
  if (ins.size() <= max_inputs) {
    check_launch(kernels::launch_reduce_n(ins.data(), static_cast<int>(ins.size()), out, count, type, op, st),
                 "reduce kernel");
  } else {
    std::vector<const void*> part(ins.begin(), ins.begin() + max_inputs);
    check_launch(kernels::launch_reduce_n(part.data(), static_cast<int>(part.size()), out, count, type,
                                          base::reduce_kind::sum, st),
                 "reduce kernel");
    for (std::size_t next = max_inputs; next < ins.size(); next += max_inputs - 1) {
      part.assign(1, out);
      for (std::size_t r = next; r < std::min(ins.size(), next + max_inputs - 1); ++r) part.push_back(ins[r]);
      check_launch(kernels::launch_reduce_n(part.data(), static_cast<int>(part.size()), out, count, type,
                                            base::reduce_kind::sum, st),
                   "reduce kernel");
    }
    if (op == base::reduce_kind::mean) {
      check_launch(kernels::launch_scale(out, count, code(type), 1.0 / static_cast<double>(ins.size()), st),
                   "reduce kernel");
    }
  }
  finish(device, "reduce kernel");
}

void reduce_axis(int device, const void* in, void* out, std::int64_t outer, std::int64_t along, std::int64_t inner,
                 base::scalar_type type) {
  cudaStream_t st = state().stream_for(device);
  check_launch(kernels::launch_reduce_axis(in, out, outer, along, inner, type, st), "reduce_sum kernel");
  finish(device, "reduce_sum kernel");
}

void sgd(int device, const void* w, const void* g, void* out_w, std::int64_t count, base::scalar_type type,
         double lr) {
  cudaStream_t st = state().stream_for(device);
  check_launch(kernels::launch_sgd(w, g, out_w, count, type, lr, st), "SGD kernel");
  finish(device, "SGD kernel");
}

void sgd_momentum(int device, const void* w, const void* g, const void* vel, void* out_w, void* out_vel,
                  std::int64_t count, base::scalar_type type, double lr, double momentum, bool nesterov) {
  cudaStream_t st = state().stream_for(device);
  check_launch(kernels::launch_sgd_momentum(w, g, vel, out_w, out_vel, count, type, lr, momentum, nesterov, st),
               "SGD momentum kernel");
  finish(device, "SGD momentum kernel");
}

void adam(int device, const void* w, const void* g, const void* m, const void* v, void* out_w, void* out_m,
          void* out_v, std::int64_t count, base::scalar_type type, double lr_t, double b1, double one_minus_b1,
          double b2, double one_minus_b2, double eps) {
  cudaStream_t st = state().stream_for(device);
  check_launch(kernels::launch_adam(w, g, m, v, out_w, out_m, out_v, count, type, lr_t, b1, one_minus_b1, b2,
                                    one_minus_b2, eps, st),
               "Adam kernel");
  finish(device, "Adam kernel");
}

void bias_activation(int device, const void* x, const void* bias, void* out, std::int64_t rows, std::int64_t cols,
                     bool relu, base::scalar_type type) {
  cudaStream_t st = state().stream_for(device);
  check_launch(kernels::launch_bias_activation(x, bias, out, rows, cols, relu, type, st), "bias kernel");
  finish(device, "bias kernel");
}

void relu(int device, const void* x, void* out, std::int64_t count, base::scalar_type type) {
  cudaStream_t st = state().stream_for(device);
  check_launch(kernels::launch_relu(x, out, count, type, st), "relu kernel");
  finish(device, "relu kernel");
}

void relu_grad(int device, const void* grad, const void* output, void* out, std::int64_t count,
               base::scalar_type type) {
  cudaStream_t st = state().stream_for(device);
  check_launch(kernels::launch_relu_grad(grad, output, out, count, type, st), "relu_grad kernel");
  finish(device, "relu_grad kernel");
}

void softmax(int device, const void* x, void* out, std::int64_t rows, std::int64_t cols,
             base::scalar_type type) {
  cudaStream_t st = state().stream_for(device);
  check_launch(kernels::launch_softmax(x, out, rows, cols, type, st), "softmax kernel");
  finish(device, "softmax kernel");
}

void argmax(int device, const void* x, std::int64_t* out, std::int64_t rows, std::int64_t cols,
            base::scalar_type type) {
  cudaStream_t st = state().stream_for(device);
  check_launch(kernels::launch_argmax(x, out, rows, cols, type, st), "argmax kernel");
  finish(device, "argmax kernel");
}

void multi_update(int device, update_kind kind, const std::vector<update_tensor>& tensors, base::scalar_type type,
                  double lr, double momentum, bool nesterov, double b1, double b2, double eps) {
  cudaStream_t st = state().stream_for(device);
  const kernels::update_coefficients c{lr, momentum, nesterov, b1, 1.0 - b1, b2, 1.0 - b2, eps};
  check_launch(kernels::launch_multi_update(kind, tensors.data(), static_cast<int>(tensors.size()), type, c, st),
               "optimizer kernel");
  finish(device, "optimizer kernel");
}

void step_table(int device, double* table, std::int64_t size, const void* loss, base::scalar_type loss_type,
                std::int64_t loss_at, double loss_scale, const std::int64_t* predicted, const void* labels,
                base::scalar_type label_type, std::int64_t rows) {
  cudaStream_t st = state().stream_for(device);
  check_launch(kernels::launch_step_table(table, size, loss, loss_type, loss_at, loss_scale, predicted, labels,
                                          label_type, rows, st),
               "step table kernel");
  finish(device, "step table kernel");
}

std::int64_t sparse_softmax_xent(int device, const void* logits, const std::int64_t* labels, void* per_example,
                                 void* grad, void* total, std::int64_t rows, std::int64_t cols, double scale,
                                 base::scalar_type type) {
  thread_state& s = state();
  cudaStream_t st = s.stream_for(device);
  if (s.row_flag[device] == nullptr) {
    void* p = nullptr;
    check(cudaMalloc(&p, sizeof(unsigned long long)), "cudaMalloc");
    s.row_flag[device] = static_cast<unsigned long long*>(p);
  }
  unsigned long long* flag = s.row_flag[device];
  check(cudaMemsetAsync(flag, 0xff, sizeof(unsigned long long), st), "cudaMemsetAsync");
  check_launch(kernels::launch_sparse_softmax_xent(logits, labels, base::scalar_type::i64, per_example, grad, total,
                                                   rows, cols, scale, type, flag, st),
               "softmax cross-entropy kernel");
  unsigned long long bad = 0;
  check(cudaMemcpyAsync(&bad, flag, sizeof(bad), cudaMemcpyDeviceToHost, st), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(st), "softmax cross-entropy kernel");
  return bad == ~0ULL ? -1 : static_cast<std::int64_t>(bad);
}

void squared_error(int device, const void* predictions, const void* targets, void* per_example, void* grad,
                   void* total, std::int64_t rows, std::int64_t cols, double scale, base::scalar_type type) {
  cudaStream_t st = state().stream_for(device);
  check_launch(kernels::launch_squared_error(predictions, targets, per_example, grad, total, rows, cols, scale, type, st),
               "squared error kernel");
  finish(device, "squared error kernel");
}

replica_scope::replica_scope(int device) : device_(device), previous_(state().replica) {
  state().stream_for(device);
  state().replica = true;
}

replica_scope::~replica_scope() { state().replica = previous_; }


}  // namespace troupe::detail::gpu
