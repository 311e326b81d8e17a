#include "nccl_group.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <thread>

#include "kernels.hpp"

namespace troupe::transport::cuda {
namespace {

using kernels::cuda::launch_fill;

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw cuda_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

void check(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) throw cuda_error(std::string(what) + ": " + ncclGetErrorString(rc));
}

ncclDataType_t to_nccl(scalar_type t) {
  switch (t) {
    case scalar_type::f32: return ncclFloat32;
    case scalar_type::f64: return ncclFloat64;
    case scalar_type::i32: return ncclInt32;
    case scalar_type::i64: return ncclInt64;
    case scalar_type::f16: return ncclFloat16;
    case scalar_type::bf16: return ncclBfloat16;
  }
  return ncclFloat32;
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: a CPU-only machine
    return 0;
  }
  return n;
}

std::string nccl_version() {
  int v = 0;
  ncclGetVersion(&v);
  return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
}

device_buffer::device_buffer(int device, std::size_t bytes) : device_(device), bytes_(bytes) {
  check(cudaSetDevice(device), "cudaSetDevice");
  if (bytes > 0) check(cudaMalloc(&data_, bytes), "cudaMalloc");
}

device_buffer::~device_buffer() {
  if (data_ != nullptr) {
    cudaSetDevice(device_);
    cudaFree(data_);
  }
}

void device_buffer::copy_from_host(const void* host, std::size_t bytes) {
  check(cudaSetDevice(device_), "cudaSetDevice");
  check(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
}

void device_buffer::copy_to_host(void* host, std::size_t bytes) const {
  check(cudaSetDevice(device_), "cudaSetDevice");
  check(cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
}

void device_buffer::fill(std::int64_t count, scalar_type type, double value) {
  check(cudaSetDevice(device_), "cudaSetDevice");
  check(static_cast<cudaError_t>(launch_fill(data_, count, static_cast<int>(type), value, nullptr)), "fill kernel");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

std::string nccl_unique_id_hex() {
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (char c : id.internal) {
    const auto b = static_cast<unsigned char>(c);
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

struct nccl_group::impl {
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  bool aborted = false;
  bool nonblocking = false;
};

nccl_group::nccl_group(std::vector<int> devices, int nranks, int first_rank, const std::string& unique_id_hex,
                       std::chrono::milliseconds timeout)
    : devices_(std::move(devices)), nranks_(nranks), impl_(std::make_unique<impl>()) {
  ncclUniqueId id;
  if (unique_id_hex.size() != 2 * sizeof id.internal) {
    throw std::invalid_argument("nccl_group: the collective id has " + std::to_string(unique_id_hex.size()) +
                                " hex digits, expected " + std::to_string(2 * sizeof id.internal));
  }
  auto digit = [&](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw std::invalid_argument("nccl_group: the collective id is not hex");
  };
  for (std::size_t i = 0; i < sizeof id.internal; ++i) {
    id.internal[i] = static_cast<char>(digit(unique_id_hex[2 * i]) * 16 + digit(unique_id_hex[2 * i + 1]));
  }
  if (devices_.empty()) throw std::invalid_argument("nccl_group: no devices");
  if (first_rank < 0 || first_rank + static_cast<int>(devices_.size()) > nranks) {
    throw std::invalid_argument("nccl_group: ranks " + std::to_string(first_rank) + ".." +
                                std::to_string(first_rank + static_cast<int>(devices_.size()) - 1) + " do not fit in " +
                                std::to_string(nranks));
  }
  impl_->nonblocking = true;
  impl_->comms.assign(devices_.size(), nullptr);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t rc = ncclGroupStart();
  for (std::size_t i = 0; rc == ncclSuccess && i < devices_.size(); ++i) {
    check(cudaSetDevice(devices_[i]), "cudaSetDevice");
    rc = ncclCommInitRankConfig(&impl_->comms[i], nranks, id, first_rank + static_cast<int>(i), &config);
  }
  ncclResult_t end = ncclGroupEnd();
  if (rc == ncclSuccess || rc == ncclInProgress) rc = end;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (std::size_t i = 0; (rc == ncclSuccess || rc == ncclInProgress) && i < impl_->comms.size(); ++i) {
    for (;;) {
      if (impl_->comms[i] == nullptr) break;
      ncclResult_t state = ncclSuccess;
      rc = ncclCommGetAsyncError(impl_->comms[i], &state);
      if (rc != ncclSuccess) break;
      if (state != ncclInProgress) {
        rc = state;
        break;
      }
      if (timeout.count() > 0 && std::chrono::steady_clock::now() >= deadline) {
        abort();
        throw cuda_error("nccl_group: not every rank of " + std::to_string(nranks) + " joined within " +
                         std::to_string(timeout.count()) + " ms; the communicators were aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  if (rc != ncclSuccess) {
    abort();
    check(rc, "ncclCommInitRankConfig");
  }
  for (int d : devices_) {
    check(cudaSetDevice(d), "cudaSetDevice");
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    impl_->streams.push_back(s);
  }
}

void nccl_group::settle(int rank) {
  if (!impl_->nonblocking) return;
  ncclComm_t comm = impl_->comms.at(static_cast<std::size_t>(rank));
  for (;;) {
    ncclResult_t state = ncclSuccess;
    check(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError");
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) check(state, "NCCL");
    std::this_thread::yield();
  }
}

nccl_group::nccl_group(std::vector<int> devices) : devices_(std::move(devices)), impl_(std::make_unique<impl>()) {
  nranks_ = static_cast<int>(devices_.size());
  if (devices_.empty()) throw std::invalid_argument("nccl_group: no devices");
  const int available = device_count();
  for (int d : devices_) {
    if (d < 0 || d >= available) {
      throw std::invalid_argument("nccl_group: GPU " + std::to_string(d) + " does not exist (" +
                                  std::to_string(available) + " GPUs)");
    }
  }
  impl_->comms.resize(devices_.size());
  check(ncclCommInitAll(impl_->comms.data(), static_cast<int>(devices_.size()), devices_.data()), "ncclCommInitAll");
  for (int d : devices_) {
    check(cudaSetDevice(d), "cudaSetDevice");
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    impl_->streams.push_back(s);
  }
}

nccl_group::~nccl_group() {
  for (std::size_t i = 0; i < impl_->streams.size(); ++i) {
    cudaSetDevice(devices_[i]);
    cudaStreamDestroy(impl_->streams[i]);
  }
  if (!impl_->aborted) {
    for (ncclComm_t c : impl_->comms) ncclCommDestroy(c);
  }
}

void nccl_group::abort() {
  if (impl_->aborted) return;
  impl_->aborted = true;
  for (ncclComm_t c : impl_->comms) {
    if (c != nullptr) ncclCommAbort(c);
  }
}

bool nccl_group::aborted() const noexcept { return impl_->aborted; }

void* nccl_group::communicator(int rank) const {
  if (impl_->aborted) throw cuda_error("nccl_group: the communicators were aborted");
  return impl_->comms.at(static_cast<std::size_t>(rank));
}

void nccl_group::all_reduce(const std::vector<void*>& buffers, std::int64_t count, scalar_type type, reduce_kind op,
                            std::chrono::milliseconds timeout) {
  if (impl_->aborted) throw cuda_error("nccl_group: the communicators were aborted");
  if (buffers.size() != devices_.size()) {
    throw std::invalid_argument("nccl_group: " + std::to_string(buffers.size()) + " buffers for " +
                                std::to_string(devices_.size()) + " GPUs");
  }
  if (count == 0) return;
  check(ncclGroupStart(), "ncclGroupStart");
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    check(ncclAllReduce(buffers[i], buffers[i], static_cast<std::size_t>(count), to_nccl(type),
                        op == reduce_kind::sum ? ncclSum : ncclAvg, impl_->comms[i], impl_->streams[i]),
          "ncclAllReduce");
  }
  check(ncclGroupEnd(), "ncclGroupEnd");
  // Wait without blocking forever: a peer that never joins must not hang the caller.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (std::size_t i = 0; i < impl_->streams.size(); ++i) {
    for (;;) {
      cudaError_t rc = cudaStreamQuery(impl_->streams[i]);
      if (rc == cudaSuccess) break;
      if (rc != cudaErrorNotReady) check(rc, "cudaStreamQuery");
      if (timeout.count() > 0 && std::chrono::steady_clock::now() >= deadline) {
        abort();
        throw cuda_error("nccl_group: all_reduce timed out after " + std::to_string(timeout.count()) +
                         " ms on GPU " + std::to_string(devices_[i]) + "; the communicators were aborted");
      }
      std::this_thread::yield();
    }
  }
}

}  // namespace troupe::transport::cuda
