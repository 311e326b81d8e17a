#pragma once

// What the CUDA kernel tests share (kernels_test.cpp: elementwise, casts and reductions;
// nn_kernels_test.cpp: optimizers and nn kernels): device buffers, the stream, the element types'
// names, bitwise comparison, and the suite that counts passed and failed checks.

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels.hpp"
#include "nccl_group.hpp"

namespace troupe::testing::kernel_checks {

namespace kernels = troupe::kernels::cuda;
using kernels::binary_op;
using troupe::base::reduce_kind;
using troupe::base::scalar_type;

// A CUDA runtime call around the kernels failed: the device is unusable and the run stops.
inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// The library's device memory on GPU 0, never empty, so count-0 launches still get valid pointers.
class device_buffer : public troupe::transport::cuda::device_buffer {
 public:
  explicit device_buffer(std::size_t bytes) : troupe::transport::cuda::device_buffer(0, bytes == 0 ? 16 : bytes) {}
  void* get() const { return data(); }
  template <class T>
  T* as() const {
    return static_cast<T*>(data());
  }
};

/// A created CUDA stream, destroyed with its owner.
class stream {
 public:
  stream() { check_cuda(cudaStreamCreate(&stream_), "cudaStreamCreate"); }
  ~stream() { cudaStreamDestroy(stream_); }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;

  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

template <class T>
constexpr scalar_type type_of() {
  if constexpr (std::is_same_v<T, float>) return scalar_type::f32;
  if constexpr (std::is_same_v<T, double>) return scalar_type::f64;
  if constexpr (std::is_same_v<T, std::int32_t>) return scalar_type::i32;
  return scalar_type::i64;
}

template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "f32";
  if constexpr (std::is_same_v<T, double>) return "f64";
  if constexpr (std::is_same_v<T, std::int32_t>) return "i32";
  return "i64";
}

inline const char* op_name(binary_op op) {
  switch (op) {
    case binary_op::add: return "add";
    case binary_op::sub: return "sub";
    case binary_op::mul: return "mul";
    case binary_op::div: return "div";
  }
  return "?";
}

template <class T>
std::string show(T v) {
  char text[64];
  if constexpr (std::is_floating_point_v<T>) {
    std::snprintf(text, sizeof text, "%.17g", static_cast<double>(v));
  } else {
    std::snprintf(text, sizeof text, "%lld", static_cast<long long>(v));
  }
  return text;
}

inline std::string cat(std::initializer_list<std::string> parts) {
  std::string out;
  for (const std::string& p : parts) out += p;
  return out;
}

// The host references round every product to T before it is added, as the kernels do (built with
// --fmad=false). Without the volatile store a compiler allowed to contract (GCC's default for GNU
// C++ on targets with FMA, such as aarch64) could fuse a * b + c and change the last bit.
template <class T>
T rounded(T x) {
  volatile T v = x;
  return v;
}

// Bitwise equality; any NaN equals any NaN (x86 and CUDA make different NaN payloads for 0/0).
template <class T>
bool same(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) && std::isnan(b)) return true;
  }
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

class suite {
 public:
  int passed() const { return passed_; }
  int failed() const { return failed_; }
  cudaStream_t s() const { return stream_.get(); }
  std::mt19937& rng() { return rng_; }

  void record(bool ok, const std::string& what, const std::string& detail = {}) {
    if (ok) {
      ++passed_;
      return;
    }
    ++failed_;
    std::printf("FAIL %s%s%s\n", what.c_str(), detail.empty() ? "" : ": ", detail.c_str());
  }

  // A launch returned success and the stream ran it without error.
  bool launched(int rc, const std::string& what) {
    if (rc != 0) {
      record(false, what, "launch returned " + std::to_string(rc));
      return false;
    }
    const cudaError_t e = cudaStreamSynchronize(s());
    if (e != cudaSuccess) {
      record(false, what, std::string("kernel failed: ") + cudaGetErrorString(e));
      throw std::runtime_error(what + ": the device is unusable after a kernel failure");
    }
    return true;
  }

  template <class T>
  std::unique_ptr<device_buffer> upload(const std::vector<T>& host) {
    auto buf = std::make_unique<device_buffer>(host.size() * sizeof(T));
    if (!host.empty()) {
      check_cuda(cudaMemcpyAsync(buf->get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, s()),
                 "cudaMemcpyAsync");
    }
    check_cuda(cudaStreamSynchronize(s()), "cudaStreamSynchronize");
    return buf;
  }

  // An output buffer full of 0xff bytes (NaN for floats, -1 for integers), so that an element the
  // kernel fails to write shows up.
  template <class T>
  std::unique_ptr<device_buffer> garbage(std::int64_t count) {
    const std::size_t bytes = static_cast<std::size_t>(count) * sizeof(T);
    auto buf = std::make_unique<device_buffer>(bytes);
    check_cuda(cudaMemsetAsync(buf->get(), 0xff, bytes == 0 ? 16 : bytes, s()), "cudaMemsetAsync");
    check_cuda(cudaStreamSynchronize(s()), "cudaStreamSynchronize");
    return buf;
  }

  template <class T>
  std::vector<T> download(const device_buffer& buf, std::int64_t count) {
    std::vector<T> host(static_cast<std::size_t>(count));
    if (count > 0) {
      check_cuda(cudaMemcpyAsync(host.data(), buf.get(), host.size() * sizeof(T), cudaMemcpyDeviceToHost, s()),
                 "cudaMemcpyAsync");
    }
    check_cuda(cudaStreamSynchronize(s()), "cudaStreamSynchronize");
    return host;
  }

  int read_flag(const device_buffer& flag) { return download<int>(flag, 1)[0]; }

  std::unique_ptr<device_buffer> zero_flag() {
    auto flag = std::make_unique<device_buffer>(sizeof(int));
    check_cuda(cudaMemsetAsync(flag->get(), 0, sizeof(int), s()), "cudaMemsetAsync");
    return flag;
  }

  // Elementwise bitwise comparison; reports the number of differing elements and the first one.
  template <class T>
  void expect_equal(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
    if (got.size() != want.size()) {
      record(false, what, "size " + std::to_string(got.size()) + ", expected " + std::to_string(want.size()));
      return;
    }
    std::size_t bad = 0;
    std::size_t first = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (!same(got[i], want[i]) && bad++ == 0) first = i;
    }
    if (bad == 0) {
      record(true, what);
      return;
    }
    record(false, what,
           cat({std::to_string(bad), " of ", std::to_string(got.size()), " elements differ, first [",
                std::to_string(first), "] = ", show(got[first]), ", expected ", show(want[first])}));
  }

  // |got - want| <= rel * |want| for every element (want computed in double or better).
  template <class T>
  void expect_close(const std::vector<T>& got, const std::vector<double>& want, double rel, const std::string& what) {
    if (got.size() != want.size()) {
      record(false, what, "size " + std::to_string(got.size()) + ", expected " + std::to_string(want.size()));
      return;
    }
    std::size_t bad = 0;
    std::size_t first = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double g = static_cast<double>(got[i]);
      if (!(std::fabs(g - want[i]) <= rel * std::fabs(want[i])) && bad++ == 0) first = i;
    }
    if (bad == 0) {
      record(true, what);
      return;
    }
    record(false, what,
           cat({std::to_string(bad), " of ", std::to_string(got.size()), " elements off by more than ", show(rel),
                " (relative), first [", std::to_string(first), "] = ", show(got[first]), ", expected ",
                show(want[first])}));
  }

  void expect_rc(int rc, int want, const std::string& what) {
    record(rc == want, what, "returned " + std::to_string(rc) + ", expected " + std::to_string(want));
  }

  // Uniform values in [lo, hi]; integers for integer T.
  template <class T>
  std::vector<T> random(std::int64_t count, double lo, double hi) {
    std::vector<T> out(static_cast<std::size_t>(count));
    if constexpr (std::is_floating_point_v<T>) {
      std::uniform_real_distribution<double> dist(lo, hi);
      for (T& v : out) v = static_cast<T>(dist(rng_));
    } else {
      std::uniform_int_distribution<std::int64_t> dist(static_cast<std::int64_t>(lo), static_cast<std::int64_t>(hi));
      for (T& v : out) v = static_cast<T>(dist(rng_));
    }
    return out;
  }

  // Sets about `fraction` of the elements to `value` (zeros for divisions and relu).
  template <class T>
  void sprinkle(std::vector<T>& v, double fraction, T value) {
    std::bernoulli_distribution pick(fraction);
    for (T& x : v) {
      if (pick(rng_)) x = value;
    }
  }

 private:
  stream stream_;
  std::mt19937 rng_{20240611u};
  int passed_ = 0;
  int failed_ = 0;
};

const std::int64_t sizes[] = {0, 1, 1001, std::int64_t{1} << 20};

// The optimizer and nn kernels' tests (nn_kernels_test.cpp), for float and double.
template <class T>
void test_float_type(suite& t);
// The optimizer and nn kernels refuse the other types (nn_kernels_test.cpp), for int32 and int64.
template <class T>
void test_refused_types(suite& t);

}  // namespace troupe::testing::kernel_checks
