#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/transport/collective.hpp"

namespace troupe::transport::cuda {

/// GPUs the CUDA runtime reports; 0 without a driver or a device (never throws).
int device_count();
/// "2.28.9": the NCCL library this process loaded.
std::string nccl_version();
/// A new ncclUniqueId (ncclGetUniqueId) as 256 hex digits: what the chief hands every worker.
std::string nccl_unique_id_hex();

/// A CUDA or NCCL call failed; what() names the call and the error string.
class cuda_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Device memory for one buffer on one GPU (cudaMalloc, never managed memory).
class device_buffer {
 public:
  device_buffer(int device, std::size_t bytes);
  ~device_buffer();
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  void* data() const noexcept { return data_; }
  std::size_t bytes() const noexcept { return bytes_; }
  int device() const noexcept { return device_; }
  /// Host <-> device copies (synchronous).
  void copy_from_host(const void* host, std::size_t bytes);
  void copy_to_host(void* host, std::size_t bytes) const;
  /// Sets `count` elements of `type` to `value` with a kernel.
  void fill(std::int64_t count, scalar_type type, double value);

 private:
  int device_;
  std::size_t bytes_;
  void* data_ = nullptr;
};

/// One NCCL communicator per local GPU (ncclCommInitAll) with a stream each: the replicas of one
/// process all-reduce through it in a single group call.
class nccl_group {
 public:
  explicit nccl_group(std::vector<int> devices);
  /// One communicator spanning several processes: this process's GPUs `devices` become ranks
  /// first_rank, first_rank + 1, ... of `nranks`, joined by the chief's id (nccl_unique_id_hex).
  /// The communicators are non-blocking: a rank that never joins makes this throw cuda_error
  /// after `timeout` (0: wait as long as it takes) instead of hanging, and aborts what was made.
  nccl_group(std::vector<int> devices, int nranks, int first_rank, const std::string& unique_id_hex,
             std::chrono::milliseconds timeout);
  /// ncclCommDestroy, or nothing after abort().
  ~nccl_group();
  nccl_group(const nccl_group&) = delete;
  nccl_group& operator=(const nccl_group&) = delete;

  int size() const noexcept { return static_cast<int>(devices_.size()); }
  /// Ranks of the whole communicator: size() within one process, more across processes.
  int nranks() const noexcept { return nranks_; }

  /// For non-blocking communicators: waits until rank `rank`'s calls since the last ncclGroupEnd
  /// are issued (ncclCommGetAsyncError leaves ncclInProgress); throws cuda_error on an error.
  void settle(int rank);

  /// All-reduces buffers[i] (on devices[i]) in place, as one NCCL group call, and waits for the
  /// streams. A wait longer than `timeout` (0: none) aborts every communicator (ncclCommAbort)
  /// and throws cuda_error instead of hanging; the group is unusable afterwards.
  void all_reduce(const std::vector<void*>& buffers, std::int64_t count, scalar_type type, reduce_kind op,
                  std::chrono::milliseconds timeout = std::chrono::milliseconds{0});

  /// Aborts every communicator: pending and later collectives fail.
  void abort();
  bool aborted() const noexcept;

  /// The ncclComm_t of rank `rank` (as void*, to keep NCCL's header out of this one), for callers
  /// that enqueue their own NCCL calls on their own streams.
  void* communicator(int rank) const;

 private:
  struct impl;
  std::vector<int> devices_;
  int nranks_ = 0;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::transport::cuda
