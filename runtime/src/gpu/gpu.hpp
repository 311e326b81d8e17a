#pragma once

// The runtime's view of GPU memory, streams and kernels. Built on CUDA when troupe found it
// (gpu_cuda.cpp), else every function here throws (gpu_none.cpp): without CUDA no GPU tensor can
// exist, so only the error paths reach it.
//
// Streams. Every thread that works on GPU `d` has its own CUDA stream for it. A replica thread
// (inside Strategy::run, see replica_scope) enqueues its work and returns at once; the replica's
// stream is drained when its function ends, before its results reach any other thread. Any other
// thread waits for each operation before it returns. So a tensor that crosses threads never has
// work pending on another thread's stream, and memory is freed, stream-ordered, on the stream of
// the thread that drops the last reference.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "troupe/base/elements.hpp"
#include "troupe/kernels/multi_update.hpp"

namespace troupe::detail::gpu {

/// Elementwise binary operations (the values of kernels::cuda::binary_op).
enum class binary_op : int { add = 0, sub = 1, mul = 2, div = 3 };

/// True when this build has CUDA support.
bool built_with_cuda() noexcept;

/// Device memory on GPU `device` (stream-ordered pool, never managed memory); nullptr for 0 bytes.
/// Sets *capacity to the block's size, which release() needs back. Released blocks are kept (up
/// to 2 GiB per GPU in each place) and allocated again without a CUDA call: a replica's in its own
/// cache, since its stream may still use them; any other thread's in a pool every thread draws from.
void* allocate(int device, std::size_t bytes, std::size_t* capacity);
/// Bytes that allocate() has handed out and release() not yet taken back on one GPU, now and at
/// most (config::experimental::get_memory_info).
struct memory_held {
  std::int64_t current = 0;
  std::int64_t peak = 0;
};
memory_held memory(int device);
/// Starts the peak again from the current bytes.
void reset_peak(int device);

/// Returns memory from allocate(), ordered after the calling thread's work on that GPU.
void release(int device, void* data, std::size_t capacity) noexcept;

/// Copies `bytes` between host memory (device -1) and GPU memory, or between two GPUs. Host
/// memory goes through pinned staging buffers. Returns when the destination is safe to use from
/// the calling thread (and, for a host destination, holds the bytes).
void copy(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes);
/// Copies `rows` rows of `row_bytes` bytes between two buffers of one GPU, with pitches.
void copy_rows(int device, void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
               std::size_t row_bytes, std::size_t rows);
/// Sets `bytes` bytes to zero.
void zero(int device, void* data, std::size_t bytes);

/// The kernels of kernels/cuda/kernels.hpp on the calling thread's stream, followed by a wait
/// when the caller is not a replica. Arguments as there; errors throw std::runtime_error naming
/// `what`, and an integer division by zero throws std::invalid_argument.
void fill(int device, void* data, std::int64_t count, base::scalar_type type, double value);
void binary(int device, binary_op op, const void* a, const void* b, void* out, std::int64_t count,
            base::scalar_type type);
void binary_scalar(int device, binary_op op, const void* a, double f, std::int64_t i,
                   bool scalar_first, void* out, std::int64_t count, base::scalar_type type);
void cast(int device, const void* in, base::scalar_type from, void* out, base::scalar_type to,
          std::int64_t count);
void reduce_n(int device, const std::vector<const void*>& ins, void* out, std::int64_t count,
              base::scalar_type type, base::reduce_kind op);
void reduce_axis(int device, const void* in, void* out, std::int64_t outer, std::int64_t along, std::int64_t inner,
                 base::scalar_type type);
void sgd(int device, const void* w, const void* g, void* out_w, std::int64_t count, base::scalar_type type,
         double lr);
void sgd_momentum(int device, const void* w, const void* g, const void* vel, void* out_w, void* out_vel,
                  std::int64_t count, base::scalar_type type, double lr, double momentum, bool nesterov);
void adam(int device, const void* w, const void* g, const void* m, const void* v, void* out_w, void* out_m,
          void* out_v, std::int64_t count, base::scalar_type type, double lr_t, double b1, double one_minus_b1,
          double b2, double one_minus_b2, double eps);
/// One tensor of multi_update, and its optimizer (kernels/multi_update.hpp).
using troupe::kernels::update_kind;
using troupe::kernels::update_tensor;
/// Updates every tensor of one type on `device` with one launch per 24 tensors (a multi-tensor
/// apply): sgd/sgd_momentum/adam's formulas and bits; lr is adam's lr_t for adam.
void multi_update(int device, update_kind kind, const std::vector<update_tensor>& tensors, base::scalar_type type,
                  double lr, double momentum, bool nesterov, double b1, double b2, double eps);
/// c[m, n] = op(a) · op(b) through cuBLASLt (gpu_blas.cpp), then, when `bias` is given, + bias[n]
/// per row, then max(., 0) when relu: one launch. `tf32` lets float32 products round their inputs
/// to TensorFloat-32 on the tensor cores (config::enable_tensor_float_32_execution); without it
/// they are exact float32 products. float32 or float64. The same product gives the same bits on
/// every replica of one GPU model.
void gemm(int device, const void* a, const void* b, void* c, std::int64_t m, std::int64_t n, std::int64_t k,
          bool transpose_a, bool transpose_b, base::scalar_type type, const void* bias, bool relu, bool tf32);
void bias_activation(int device, const void* x, const void* bias, void* out, std::int64_t rows, std::int64_t cols,
                     bool relu, base::scalar_type type);
void relu(int device, const void* x, void* out, std::int64_t count, base::scalar_type type);
void relu_grad(int device, const void* grad, const void* output, void* out, std::int64_t count,
               base::scalar_type type);
void softmax(int device, const void* x, void* out, std::int64_t rows, std::int64_t cols, base::scalar_type type);
void argmax(int device, const void* x, std::int64_t* out, std::int64_t rows, std::int64_t cols,
            base::scalar_type type);
/// Completes a training step's table of `size` doubles on the device in place (kernels.hpp's
/// launch_step_table): the loss added at 0 (and, scaled, at loss_at >= 0), and with `predicted`
/// the rows predicted right added at 1. Queued on a replica's stream without waiting.
void step_table(int device, double* table, std::int64_t size, const void* loss, base::scalar_type loss_type,
                std::int64_t loss_at, double loss_scale, const std::int64_t* predicted, const void* labels,
                base::scalar_type label_type, std::int64_t rows);
/// Sparse softmax cross-entropy (kernels.hpp): per_example [rows], grad (optional, [rows, cols])
/// and total (optional, one element) on the device; labels int64 [rows]. Returns -1, or the first
/// row whose label is outside 0..cols-1 (found by reading one word back, which waits for the kernel).
std::int64_t sparse_softmax_xent(int device, const void* logits, const std::int64_t* labels, void* per_example,
                                 void* grad, void* total, std::int64_t rows, std::int64_t cols, double scale,
                                 base::scalar_type type);
/// Squared error (kernels.hpp), as above; targets of the predictions' type and shape.
void squared_error(int device, const void* predictions, const void* targets, void* per_example, void* grad,
                   void* total, std::int64_t rows, std::int64_t cols, double scale, base::scalar_type type);

/// After an operation enqueued on the calling thread's stream: a replica leaves it queued, any
/// other thread waits for it (errors name `what`).
void finish_work(int device, const char* what);

/// The calling thread's CUDA stream for `device` (a cudaStream_t), created on first use.
void* stream(int device);
/// Waits for the calling thread's work on `device`.
void synchronize(int device);

/// Marks the calling thread as replica `device`'s thread while it lives: operations no longer
/// wait. The owner drains the stream (bounded, see NcclCollectives::drain) before the replica's
/// results leave the thread.
class replica_scope {
 public:
  explicit replica_scope(int device);
  ~replica_scope();
  replica_scope(const replica_scope&) = delete;
  replica_scope& operator=(const replica_scope&) = delete;

 private:
  int device_;
  bool previous_;
};

}  // namespace troupe::detail::gpu
