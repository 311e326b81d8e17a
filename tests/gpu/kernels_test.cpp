// Every CUDA kernel of kernels/cuda/kernels.hpp against a host loop that computes the same
// formula in the same order, for every element type the kernel takes. The kernels are built with
// --fmad=false, so the comparisons are bitwise, except softmax: CUDA's exp and libm's exp may
// differ in the last bit, and its row sum is a tree on the GPU.
//
// Prints "FAIL <what>" per failed check and "N passed, M failed" at the end; exits 0 when nothing
// failed, 1 otherwise, and 77 (skipped) where there is no GPU (gpu_check.hpp: a CUDA error on a
// machine with a GPU is a failure).

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "gpu_check.hpp"
#include "kernels.hpp"
#include "nccl_group.hpp"
#include "troupe/kernels/half_kernels.hpp"
#include "troupe/kernels/reduce_kernels.hpp"

namespace {

namespace kernels = troupe::kernels::cuda;
using kernels::binary_op;
using troupe::base::reduce_kind;
using troupe::base::scalar_type;

// A CUDA runtime call around the kernels failed: the device is unusable and the run stops.
void check_cuda(cudaError_t e, const char* what) {
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

const char* op_name(binary_op op) {
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

std::string cat(std::initializer_list<std::string> parts) {
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
const binary_op ops[] = {binary_op::add, binary_op::sub, binary_op::mul, binary_op::div};

template <class T>
T host_apply(binary_op op, T x, T y, bool& div_by_zero) {
  switch (op) {
    case binary_op::add: return static_cast<T>(x + y);
    case binary_op::sub: return static_cast<T>(x - y);
    case binary_op::mul: return static_cast<T>(x * y);
    case binary_op::div:
      if constexpr (std::is_integral_v<T>) {
        if (y == 0) {
          div_by_zero = true;
          return T(0);
        }
      }
      return static_cast<T>(x / y);
  }
  return T(0);
}

// Operands: floats in [-4, 4] with some zeros (x / 0 is inf, 0 / 0 nan); integers small enough
// that no product overflows, divisors in [-5, 5] so that some are zero.
template <class T>
std::vector<T> left_operand(suite& t, std::int64_t count) {
  std::vector<T> v = std::is_floating_point_v<T> ? t.random<T>(count, -4, 4) : t.random<T>(count, -1000, 1000);
  t.sprinkle(v, 0.01, T(0));
  return v;
}

template <class T>
std::vector<T> right_operand(suite& t, std::int64_t count) {
  std::vector<T> v = std::is_floating_point_v<T> ? t.random<T>(count, -4, 4) : t.random<T>(count, -5, 5);
  t.sprinkle(v, 0.01, T(0));
  return v;
}

template <class T>
void test_binary(suite& t) {
  for (std::int64_t n : sizes) {
    const std::vector<T> a = left_operand<T>(t, n);
    const std::vector<T> b = right_operand<T>(t, n);
    auto da = t.upload(a);
    auto db = t.upload(b);
    for (binary_op op : ops) {
      const std::string what = cat({"binary ", op_name(op), " ", type_name<T>(), " n=", std::to_string(n)});
      std::vector<T> want(a.size());
      bool want_flag = false;
      for (std::size_t i = 0; i < a.size(); ++i) want[i] = host_apply(op, a[i], b[i], want_flag);
      auto out = t.garbage<T>(n);
      auto flag = t.zero_flag();
      if (!t.launched(kernels::launch_binary(op, da->get(), db->get(), out->get(), n, type_of<T>(), flag->as<int>(),
                                             t.s()),
                      what)) {
        continue;
      }
      t.expect_equal(t.download<T>(*out, n), want, what);
      const int got_flag = t.read_flag(*flag);
      t.record(got_flag == (want_flag ? 1 : 0), what + " div_by_zero flag",
               "flag " + std::to_string(got_flag) + ", expected " + std::to_string(want_flag ? 1 : 0));
      if (op == binary_op::div && std::is_integral_v<T>) {
        // No flag to set: the zeros are still written.
        auto out2 = t.garbage<T>(n);
        const std::string what2 = what + " without a flag";
        if (t.launched(kernels::launch_binary(op, da->get(), db->get(), out2->get(), n, type_of<T>(), nullptr, t.s()),
                       what2)) {
          t.expect_equal(t.download<T>(*out2, n), want, what2);
        }
      }
    }
  }
}

template <class T>
void test_binary_scalar(suite& t) {
  // The kernel must take `f` for floating types and `i` for integer types: the other one is a decoy.
  const double fs[] = {0.75, -3.0, 0.1, 0.0};
  const std::int64_t is[] = {7, -3, 1, 0};
  for (std::int64_t n : sizes) {
    const std::vector<T> a = left_operand<T>(t, n);
    auto da = t.upload(a);
    for (int c = 0; c < 4; ++c) {
      const double f = std::is_floating_point_v<T> ? fs[c] : 0.5;
      const std::int64_t i = std::is_floating_point_v<T> ? 12345 : is[c];
      const T s = std::is_floating_point_v<T> ? static_cast<T>(f) : static_cast<T>(i);
      for (bool scalar_first : {false, true}) {
        for (binary_op op : ops) {
          const std::string what = cat({"binary_scalar ", op_name(op), " ", type_name<T>(), " n=", std::to_string(n),
                                        " scalar=", show(s), scalar_first ? " first" : " second"});
          std::vector<T> want(a.size());
          bool want_flag = false;
          for (std::size_t k = 0; k < a.size(); ++k) {
            want[k] = scalar_first ? host_apply(op, s, a[k], want_flag) : host_apply(op, a[k], s, want_flag);
          }
          auto out = t.garbage<T>(n);
          auto flag = t.zero_flag();
          if (!t.launched(kernels::launch_binary_scalar(op, da->get(), f, i, scalar_first, out->get(), n, type_of<T>(),
                                                        flag->as<int>(), t.s()),
                          what)) {
            continue;
          }
          t.expect_equal(t.download<T>(*out, n), want, what);
          const int got_flag = t.read_flag(*flag);
          t.record(got_flag == (want_flag ? 1 : 0), what + " div_by_zero flag",
                   "flag " + std::to_string(got_flag) + ", expected " + std::to_string(want_flag ? 1 : 0));
        }
      }
    }
  }
}

// Inputs every target type can hold after the C++ conversion: floats below 2^31 in magnitude
// (half with fractions, to check truncation toward zero), integers over their whole range but
// i64 within +-2^62 (i64 -> i32 wraps, the same on both sides; i64 -> f32 rounds).
template <class From>
std::vector<From> cast_input(suite& t, std::int64_t count) {
  std::vector<From> v;
  if constexpr (std::is_floating_point_v<From>) {
    v = t.random<From>(count, -2.0e9, 2.0e9);
    const std::vector<From> small = t.random<From>(count, -100, 100);
    for (std::size_t i = 0; i < v.size(); i += 2) v[i] = small[i];
  } else if constexpr (std::is_same_v<From, std::int32_t>) {
    v = t.random<From>(count, std::numeric_limits<std::int32_t>::min(), std::numeric_limits<std::int32_t>::max());
  } else {
    v = t.random<From>(count, -4.0e18, 4.0e18);
    const std::vector<From> small = t.random<From>(count, -100000, 100000);
    for (std::size_t i = 0; i < v.size(); i += 2) v[i] = small[i];
  }
  return v;
}

template <class From, class To>
void test_cast_to(suite& t, std::int64_t n, const std::vector<From>& in, const device_buffer& din) {
  const std::string what = cat({"cast ", type_name<From>(), " -> ", type_name<To>(), " n=", std::to_string(n)});
  std::vector<To> want(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) want[i] = static_cast<To>(in[i]);
  auto out = t.garbage<To>(n);
  if (t.launched(kernels::launch_cast(din.get(), type_of<From>(), out->get(), type_of<To>(), n, t.s()), what)) {
    t.expect_equal(t.download<To>(*out, n), want, what);
  }
}

template <class From>
void test_cast_from(suite& t) {
  for (std::int64_t n : sizes) {
    const std::vector<From> in = cast_input<From>(t, n);
    auto din = t.upload(in);
    test_cast_to<From, float>(t, n, in, *din);
    test_cast_to<From, double>(t, n, in, *din);
    test_cast_to<From, std::int32_t>(t, n, in, *din);
    test_cast_to<From, std::int64_t>(t, n, in, *din);
  }
}

template <class T>
void test_reduce_n(suite& t) {
  for (int n : {1, 2, 3, 8, 64}) {
    for (std::int64_t count : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1001},
                               n <= 3 ? std::int64_t{1} << 20 : std::int64_t{65536}}) {
      std::vector<std::vector<T>> ins;
      ins.reserve(static_cast<std::size_t>(n));
      std::vector<std::unique_ptr<device_buffer>> dins;
      std::vector<const void*> host_ptrs;
      std::vector<const void*> dev_ptrs;
      for (int r = 0; r < n; ++r) {
        ins.push_back(std::is_floating_point_v<T> ? t.random<T>(count, -1, 1) : t.random<T>(count, -1000, 1000));
        dins.push_back(t.upload(ins.back()));
        host_ptrs.push_back(ins.back().data());
        dev_ptrs.push_back(dins.back()->get());
      }
      for (reduce_kind op : {reduce_kind::sum, reduce_kind::mean}) {
        const std::string what = cat({"reduce_n ", op == reduce_kind::sum ? "sum " : "mean ", type_name<T>(),
                                      " n=", std::to_string(n), " count=", std::to_string(count)});
        std::vector<T> want(static_cast<std::size_t>(count));
        for (std::size_t i = 0; i < want.size(); ++i) {
          T acc = ins[0][i];
          for (int r = 1; r < n; ++r) acc += ins[static_cast<std::size_t>(r)][i];
          if (op == reduce_kind::mean) acc /= static_cast<T>(n);
          want[i] = acc;
        }
        // The header promises the CPU's reduce_range bits: check the loop above is that.
        std::vector<T> cpu(want.size());
        void* cpu_out = cpu.data();
        troupe::kernels::reduce_range(host_ptrs.data(), n, &cpu_out, 1, 0, count, type_of<T>(), op);
        t.expect_equal(cpu, want, what + " (reduce_range on the host)");

        auto out = t.garbage<T>(count);
        if (t.launched(kernels::launch_reduce_n(dev_ptrs.data(), n, out->get(), count, type_of<T>(), op, t.s()),
                       what)) {
          t.expect_equal(t.download<T>(*out, count), want, what);
        }
        // In place: out aliases ins[0].
        auto first = t.upload(ins[0]);
        std::vector<const void*> aliased = dev_ptrs;
        aliased[0] = first->get();
        const std::string what2 = what + " into ins[0]";
        if (t.launched(kernels::launch_reduce_n(aliased.data(), n, first->get(), count, type_of<T>(), op, t.s()),
                       what2)) {
          t.expect_equal(t.download<T>(*first, count), want, what2);
        }
      }
    }
  }
  auto dummy = t.garbage<T>(4);
  std::vector<const void*> too_many(65, dummy->get());
  t.expect_rc(kernels::launch_reduce_n(too_many.data(), 0, dummy->get(), 4, type_of<T>(), reduce_kind::sum, t.s()),
              cudaErrorInvalidValue, cat({"reduce_n ", type_name<T>(), " n=0 is refused"}));
  t.expect_rc(kernels::launch_reduce_n(too_many.data(), 65, dummy->get(), 4, type_of<T>(), reduce_kind::sum, t.s()),
              cudaErrorInvalidValue, cat({"reduce_n ", type_name<T>(), " n=65 is refused"}));
}

template <class T>
void test_reduce_axis(suite& t) {
  struct shape {
    std::int64_t outer, along, inner;
  };
  const shape shapes[] = {{0, 3, 4},    {3, 4, 0},      {2, 0, 3},   {1, 1, 1},    {5, 7, 3},
                          {3, 1001, 17}, {1000, 10, 1}, {1, 1000, 1}, {4, 4096, 64}, {2, 3, 70000},
                          // the tiled kernel of long axes: a Dense bias gradient's shapes, partial
                          // tiles and column blocks, and more rows of outputs than a grid holds
                          {1, 4096, 1024}, {1, 4096, 10},   {3, 129, 33}, {2, 128, 32},  {70000, 64, 1}};
  for (const shape& sh : shapes) {
    const std::string what = cat({"reduce_axis ", type_name<T>(), " [", std::to_string(sh.outer), ", ",
                                  std::to_string(sh.along), ", ", std::to_string(sh.inner), "]"});
    const std::vector<T> in = std::is_floating_point_v<T> ? t.random<T>(sh.outer * sh.along * sh.inner, -1, 1)
                                                          : t.random<T>(sh.outer * sh.along * sh.inner, -1000, 1000);
    std::vector<T> want(static_cast<std::size_t>(sh.outer * sh.inner));
    for (std::int64_t o = 0; o < sh.outer; ++o) {
      for (std::int64_t k = 0; k < sh.inner; ++k) {
        T acc = T(0);
        for (std::int64_t a = 0; a < sh.along; ++a) {
          acc += in[static_cast<std::size_t>((o * sh.along + a) * sh.inner + k)];
        }
        want[static_cast<std::size_t>(o * sh.inner + k)] = acc;
      }
    }
    auto din = t.upload(in);
    auto out = t.garbage<T>(sh.outer * sh.inner);
    const int rc =
        kernels::launch_reduce_axis(din->get(), out->get(), sh.outer, sh.along, sh.inner, type_of<T>(), t.s());
    if (t.launched(rc, what)) {
      t.expect_equal(t.download<T>(*out, sh.outer * sh.inner), want, what);
    }
  }
}

template <class T>
void test_sgd(suite& t) {
  for (std::int64_t n : sizes) {
    const std::vector<T> w = t.random<T>(n, -1, 1);
    const std::vector<T> g = t.random<T>(n, -1, 1);
    const std::vector<T> vel = t.random<T>(n, -1, 1);
    auto dw = t.upload(w);
    auto dg = t.upload(g);
    auto dvel = t.upload(vel);
    for (double lr_d : {0.01, 0.1, 1e-3}) {
      const std::string what = cat({"sgd ", type_name<T>(), " n=", std::to_string(n), " lr=", show(lr_d)});
      const T lr = static_cast<T>(lr_d);
      std::vector<T> want(w.size());
      for (std::size_t i = 0; i < w.size(); ++i) want[i] = w[i] - rounded(lr * g[i]);
      auto out = t.garbage<T>(n);
      if (t.launched(kernels::launch_sgd(dw->get(), dg->get(), out->get(), n, type_of<T>(), lr_d, t.s()), what)) {
        t.expect_equal(t.download<T>(*out, n), want, what);
      }
    }
    struct setting {
      double lr, momentum;
      bool nesterov;
    };
    for (const setting& c : {setting{0.01, 0.9, false}, setting{0.01, 0.9, true}, setting{0.1, 0.0, false},
                             setting{0.05, 0.5, true}}) {
      const std::string what = cat({"sgd_momentum ", type_name<T>(), " n=", std::to_string(n), " lr=", show(c.lr),
                                    " momentum=", show(c.momentum), c.nesterov ? " nesterov" : ""});
      const T lr = static_cast<T>(c.lr);
      const T m = static_cast<T>(c.momentum);
      std::vector<T> want_w(w.size());
      std::vector<T> want_vel(w.size());
      for (std::size_t i = 0; i < w.size(); ++i) {
        want_vel[i] = rounded(m * vel[i]) - rounded(lr * g[i]);
        want_w[i] = c.nesterov ? w[i] + (rounded(m * want_vel[i]) - rounded(lr * g[i])) : w[i] + want_vel[i];
      }
      auto out_w = t.garbage<T>(n);
      auto out_vel = t.garbage<T>(n);
      if (t.launched(kernels::launch_sgd_momentum(dw->get(), dg->get(), dvel->get(), out_w->get(), out_vel->get(), n,
                                                  type_of<T>(), c.lr, c.momentum, c.nesterov, t.s()),
                     what)) {
        t.expect_equal(t.download<T>(*out_w, n), want_w, what + " w");
        t.expect_equal(t.download<T>(*out_vel, n), want_vel, what + " velocity");
      }
    }
  }
}

template <class T>
void test_adam(suite& t) {
  for (std::int64_t n : sizes) {
    const std::vector<T> w = t.random<T>(n, -1, 1);
    const std::vector<T> g = t.random<T>(n, -1, 1);
    const std::vector<T> m = t.random<T>(n, -1, 1);
    const std::vector<T> v = t.random<T>(n, 0, 1);
    auto dw = t.upload(w);
    auto dg = t.upload(g);
    auto dm = t.upload(m);
    auto dv = t.upload(v);
    // The coefficients as the CPU's Adam derives them, for steps 1 and 7.
    for (double step : {1.0, 7.0}) {
      const double lr = 0.001, b1 = 0.9, b2 = 0.999, eps = 1e-7;
      const double lr_t = lr * std::sqrt(1.0 - std::pow(b2, step)) / (1.0 - std::pow(b1, step));
      const std::string what = cat({"adam ", type_name<T>(), " n=", std::to_string(n), " step=", show(step)});
      const T c_lr = static_cast<T>(lr_t), c_b1 = static_cast<T>(b1), c_omb1 = static_cast<T>(1.0 - b1),
              c_b2 = static_cast<T>(b2), c_omb2 = static_cast<T>(1.0 - b2), c_eps = static_cast<T>(eps);
      std::vector<T> want_w(w.size()), want_m(w.size()), want_v(w.size());
      for (std::size_t i = 0; i < w.size(); ++i) {
        want_m[i] = rounded(c_b1 * m[i]) + rounded(c_omb1 * g[i]);
        // g squared first, then scaled: the CPU's Adam (Eigen's g.square()) rounds in that order.
        want_v[i] = rounded(c_b2 * v[i]) + rounded(c_omb2 * rounded(g[i] * g[i]));
        want_w[i] = w[i] - rounded(c_lr * want_m[i]) / (std::sqrt(want_v[i]) + c_eps);
      }
      auto out_w = t.garbage<T>(n);
      auto out_m = t.garbage<T>(n);
      auto out_v = t.garbage<T>(n);
      if (t.launched(kernels::launch_adam(dw->get(), dg->get(), dm->get(), dv->get(), out_w->get(), out_m->get(),
                                          out_v->get(), n, type_of<T>(), lr_t, b1, 1.0 - b1, b2, 1.0 - b2, eps, t.s()),
                     what)) {
        t.expect_equal(t.download<T>(*out_w, n), want_w, what + " w");
        t.expect_equal(t.download<T>(*out_m, n), want_m, what + " m");
        t.expect_equal(t.download<T>(*out_v, n), want_v, what + " v");
      }
    }
  }
}

template <class T>
void test_bias_activation(suite& t) {
  struct shape {
    std::int64_t rows, cols;
  };
  for (const shape& sh : {shape{0, 5}, shape{3, 0}, shape{1, 1}, shape{7, 13}, shape{1001, 33}, shape{1024, 1024}}) {
    const std::vector<T> x = t.random<T>(sh.rows * sh.cols, -1, 1);
    const std::vector<T> bias = t.random<T>(sh.cols, -1, 1);
    auto dx = t.upload(x);
    auto dbias = t.upload(bias);
    for (bool relu : {false, true}) {
      const std::string what = cat({"bias_activation ", type_name<T>(), " [", std::to_string(sh.rows), ", ",
                                    std::to_string(sh.cols), "]", relu ? " relu" : ""});
      std::vector<T> want(x.size());
      for (std::int64_t r = 0; r < sh.rows; ++r) {
        for (std::int64_t c = 0; c < sh.cols; ++c) {
          const std::size_t i = static_cast<std::size_t>(r * sh.cols + c);
          const T y = x[i] + bias[static_cast<std::size_t>(c)];
          want[i] = relu && y < T(0) ? T(0) : y;
        }
      }
      auto out = t.garbage<T>(sh.rows * sh.cols);
      if (t.launched(kernels::launch_bias_activation(dx->get(), dbias->get(), out->get(), sh.rows, sh.cols, relu,
                                                     type_of<T>(), t.s()),
                     what)) {
        t.expect_equal(t.download<T>(*out, sh.rows * sh.cols), want, what);
      }
    }
  }
}

template <class T>
void test_relu(suite& t) {
  for (std::int64_t n : sizes) {
    // Zeros of both signs: relu keeps x when it is not below 0, relu_grad passes grad only above 0.
    std::vector<T> x = t.random<T>(n, -1, 1);
    t.sprinkle(x, 0.05, T(0));
    t.sprinkle(x, 0.05, -T(0));
    const std::vector<T> grad = t.random<T>(n, -1, 1);
    auto dx = t.upload(x);
    auto dgrad = t.upload(grad);
    {
      const std::string what = cat({"relu ", type_name<T>(), " n=", std::to_string(n)});
      std::vector<T> want(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) want[i] = x[i] < T(0) ? T(0) : x[i];
      auto out = t.garbage<T>(n);
      if (t.launched(kernels::launch_relu(dx->get(), out->get(), n, type_of<T>(), t.s()), what)) {
        t.expect_equal(t.download<T>(*out, n), want, what);
      }
    }
    {
      const std::string what = cat({"relu_grad ", type_name<T>(), " n=", std::to_string(n)});
      std::vector<T> want(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) want[i] = x[i] > T(0) ? grad[i] : T(0);
      auto out = t.garbage<T>(n);
      if (t.launched(kernels::launch_relu_grad(dgrad->get(), dx->get(), out->get(), n, type_of<T>(), t.s()), what)) {
        t.expect_equal(t.download<T>(*out, n), want, what);
      }
    }
  }
}

struct matrix_shape {
  std::int64_t rows, cols;
};
// 5000 rows: more than the grid's 4096 blocks, so a block takes a second row.
const matrix_shape row_shapes[] = {{0, 4}, {4, 0}, {1, 1}, {3, 7}, {64, 1001}, {1000, 10}, {2, 4096}, {5000, 3}};

template <class T>
void test_softmax(suite& t) {
  // The reference in double from the same x - max as the kernel's. The kernel's exp is within 2
  // ulp, and its tree sum of at most 16 + 8 roundings stays well inside the tolerance.
  const double rel = std::is_same_v<T, float> ? 1e-6 : 1e-12;
  for (const matrix_shape& sh : row_shapes) {
    const std::string what = cat({"softmax ", type_name<T>(), " [", std::to_string(sh.rows), ", ",
                                  std::to_string(sh.cols), "]"});
    const std::vector<T> x = t.random<T>(sh.rows * sh.cols, -5, 5);
    std::vector<double> want(x.size());
    for (std::int64_t r = 0; r < sh.rows && sh.cols > 0; ++r) {
      const T* row = x.data() + r * sh.cols;
      double* out = want.data() + r * sh.cols;
      T max = row[0];
      for (std::int64_t c = 1; c < sh.cols; ++c) max = row[c] > max ? row[c] : max;
      double sum = 0;
      for (std::int64_t c = 0; c < sh.cols; ++c) {
        out[c] = std::exp(static_cast<double>(static_cast<T>(row[c] - max)));
        sum += out[c];
      }
      for (std::int64_t c = 0; c < sh.cols; ++c) out[c] /= sum;
    }
    auto dx = t.upload(x);
    auto out = t.garbage<T>(sh.rows * sh.cols);
    if (t.launched(kernels::launch_softmax(dx->get(), out->get(), sh.rows, sh.cols, type_of<T>(), t.s()), what)) {
      t.expect_close(t.download<T>(*out, sh.rows * sh.cols), want, rel, what);
    }
  }
}

template <class T>
void test_argmax(suite& t) {
  for (bool ties : {false, true}) {
    for (const matrix_shape& sh : row_shapes) {
      if (sh.cols == 0 && sh.rows > 0) continue;  // no answer to give (the CPU's argmax refuses it)
      const std::string what = cat({"argmax ", type_name<T>(), " [", std::to_string(sh.rows), ", ",
                                    std::to_string(sh.cols), "]", ties ? " with ties" : ""});
      // With ties, the values are the integers -1..4, so most rows hold their maximum several times.
      std::vector<T> x = t.random<T>(sh.rows * sh.cols, -5, 5);
      if (ties) {
        for (T& v : x) v = std::floor(v / 2) + 2;
      }
      std::vector<std::int64_t> want(static_cast<std::size_t>(sh.rows));
      for (std::int64_t r = 0; r < sh.rows; ++r) {
        const T* row = x.data() + r * sh.cols;
        std::int64_t best = 0;
        for (std::int64_t c = 1; c < sh.cols; ++c) {
          if (row[c] > row[best]) best = c;
        }
        want[static_cast<std::size_t>(r)] = best;
      }
      auto dx = t.upload(x);
      auto out = t.garbage<std::int64_t>(sh.rows);
      if (t.launched(kernels::launch_argmax(dx->get(), out->as<std::int64_t>(), sh.rows, sh.cols, type_of<T>(), t.s()),
                     what)) {
        t.expect_equal(t.download<std::int64_t>(*out, sh.rows), want, what);
      }
    }
  }
}

// A step's table: the loss (of type T) added at 0 and, scaled, at loss_at; the rows whose prediction
// equals their label (int32 or int64, some out of range) added at 1; the other entries kept.
template <class T, class L>
void test_step_table(suite& t) {
  for (std::int64_t rows : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{4096}, std::int64_t{5001}}) {
    for (bool with_hits : {false, true}) {
      for (std::int64_t loss_at : {std::int64_t{-1}, std::int64_t{4}}) {
        const std::string what = cat({"step_table loss ", type_name<T>(), " labels ", type_name<L>(), " rows ",
                                      std::to_string(rows), with_hits ? " with hits" : "", " loss_at ",
                                      std::to_string(loss_at)});
        std::vector<double> table = t.random<double>(6, -3, 3);
        const std::vector<T> loss = t.random<T>(1, 0, 5);
        std::vector<std::int64_t> predicted(static_cast<std::size_t>(rows));
        std::vector<L> labels(static_cast<std::size_t>(rows));
        std::int64_t hits = 0;
        for (std::int64_t r = 0; r < rows; ++r) {
          predicted[static_cast<std::size_t>(r)] = static_cast<std::int64_t>(t.rng()() % 10);
          // Mostly classes 0..9; every 13th label is out of range and never predicted.
          labels[static_cast<std::size_t>(r)] =
              r % 13 == 5 ? static_cast<L>(-1) : static_cast<L>(r % 3 == 0 ? predicted[static_cast<std::size_t>(r)] : t.rng()() % 10);
          hits += predicted[static_cast<std::size_t>(r)] == static_cast<std::int64_t>(labels[static_cast<std::size_t>(r)]) ? 1 : 0;
        }
        const double scale = 4096.0 / 7.0;
        std::vector<double> want = table;
        want[0] += static_cast<double>(loss[0]);
        if (loss_at >= 0) want[static_cast<std::size_t>(loss_at)] += static_cast<double>(loss[0]) * scale;
        if (with_hits) want[1] += static_cast<double>(hits);
        auto dtable = t.upload(table);
        auto dloss = t.upload(loss);
        auto dpredicted = t.upload(predicted);
        auto dlabels = t.upload(labels);
        if (t.launched(kernels::launch_step_table(dtable->as<double>(), 6, dloss->get(), type_of<T>(), loss_at, scale,
                                                  with_hits ? dpredicted->as<std::int64_t>() : nullptr, dlabels->get(),
                                                  type_of<L>(), rows, t.s()),
                       what)) {
          t.expect_equal(t.download<double>(*dtable, 6), want, what);
        }
      }
    }
  }
  // Refused without a launch: a loss_at past the table, hits without a place for them, float labels.
  auto buf = t.garbage<double>(8);
  void* p = buf->get();
  const int invalid = static_cast<int>(cudaErrorInvalidValue);
  t.expect_rc(kernels::launch_step_table(buf->as<double>(), 4, p, type_of<T>(), 4, 1.0, nullptr, p, type_of<L>(), 1, t.s()),
              invalid, "step_table refuses loss_at past the table");
  t.expect_rc(kernels::launch_step_table(buf->as<double>(), 1, p, type_of<T>(), -1, 1.0, buf->as<std::int64_t>(), p,
                                         type_of<L>(), 1, t.s()),
              invalid, "step_table refuses hits in a table of one");
  t.expect_rc(kernels::launch_step_table(buf->as<double>(), 4, p, type_of<T>(), -1, 1.0, nullptr, p, scalar_type::f32, 1,
                                         t.s()),
              invalid, "step_table refuses float labels");
}

// The optimizer and nn kernels take f32 and f64 only; the others are refused without a launch.
template <class T>
void test_refused_types(suite& t) {
  auto buf = t.garbage<double>(64);
  void* p = buf->get();
  const int invalid = static_cast<int>(cudaErrorInvalidValue);
  const scalar_type type = type_of<T>();
  const std::string suffix = cat({" refuses ", type_name<T>()});
  t.expect_rc(kernels::launch_sgd(p, p, p, 8, type, 0.1, t.s()), invalid, "sgd" + suffix);
  t.expect_rc(kernels::launch_sgd_momentum(p, p, p, p, p, 8, type, 0.1, 0.9, true, t.s()), invalid,
              "sgd_momentum" + suffix);
  t.expect_rc(kernels::launch_adam(p, p, p, p, p, p, p, 8, type, 0.1, 0.9, 0.1, 0.999, 0.001, 1e-7, t.s()), invalid,
              "adam" + suffix);
  t.expect_rc(kernels::launch_bias_activation(p, p, p, 2, 4, true, type, t.s()), invalid, "bias_activation" + suffix);
  t.expect_rc(kernels::launch_relu(p, p, 8, type, t.s()), invalid, "relu" + suffix);
  t.expect_rc(kernels::launch_relu_grad(p, p, p, 8, type, t.s()), invalid, "relu_grad" + suffix);
  t.expect_rc(kernels::launch_softmax(p, p, 2, 4, type, t.s()), invalid, "softmax" + suffix);
  t.expect_rc(kernels::launch_argmax(p, static_cast<std::int64_t*>(p), 2, 4, type, t.s()), invalid,
              "argmax" + suffix);
}

void test_refused_arguments(suite& t) {
  auto buf = t.garbage<double>(64);
  void* p = buf->get();
  const int invalid = static_cast<int>(cudaErrorInvalidValue);
  const auto bad_op = static_cast<binary_op>(7);
  const auto bad_type = static_cast<scalar_type>(9);
  t.expect_rc(kernels::launch_binary(bad_op, p, p, p, 8, scalar_type::f32, nullptr, t.s()), invalid,
              "binary refuses op 7");
  t.expect_rc(kernels::launch_binary_scalar(bad_op, p, 1.0, 1, false, p, 8, scalar_type::f32, nullptr, t.s()), invalid,
              "binary_scalar refuses op 7");
  t.expect_rc(kernels::launch_binary(binary_op::add, p, p, p, 8, bad_type, nullptr, t.s()), invalid,
              "binary refuses type 9");
  t.expect_rc(kernels::launch_cast(p, bad_type, p, scalar_type::f32, 8, t.s()), invalid, "cast refuses from type 9");
  t.expect_rc(kernels::launch_cast(p, scalar_type::f32, p, bad_type, 8, t.s()), invalid, "cast refuses to type 9");
  t.expect_rc(kernels::launch_reduce_axis(p, p, 2, 2, 2, bad_type, t.s()), invalid, "reduce_axis refuses type 9");
  // Refusals launch nothing, so they leave no error behind.
  t.expect_rc(static_cast<int>(cudaGetLastError()), 0, "refused launches leave no CUDA error");
}

template <class T>
void test_every_type(suite& t) {
  test_binary<T>(t);
  test_binary_scalar<T>(t);
  test_cast_from<T>(t);
  test_reduce_n<T>(t);
  test_reduce_axis<T>(t);
}

template <class T>
void test_float_type(suite& t) {
  test_sgd<T>(t);
  test_adam<T>(t);
  test_bias_activation<T>(t);
  test_relu<T>(t);
  test_softmax<T>(t);
  test_argmax<T>(t);
  test_step_table<T, std::int32_t>(t);
  test_step_table<T, std::int64_t>(t);
}

}  // namespace

// float16 and bfloat16: launch_reduce_n sums them in float32 and rounds once (the bits of the
// host's reduce_range), and launch_cast widens every bit pattern as half_kernels does.
void test_16bit(suite& t) {
  for (scalar_type type : {scalar_type::f16, scalar_type::bf16}) {
    const char* name = type == scalar_type::f16 ? "float16" : "bfloat16";
    const auto narrow = type == scalar_type::f16 ? troupe::kernels::float_to_f16 : troupe::kernels::float_to_bf16;
    const auto widen = type == scalar_type::f16 ? troupe::kernels::f16_to_float : troupe::kernels::bf16_to_float;
    for (int n : {1, 2, 3, 8, 64}) {
      for (std::int64_t count : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1001}, std::int64_t{65536}}) {
        std::vector<std::vector<std::uint16_t>> ins;
        std::vector<std::unique_ptr<device_buffer>> dins;
        std::vector<const void*> host_ptrs;
        std::vector<const void*> dev_ptrs;
        for (int r = 0; r < n; ++r) {
          std::vector<std::uint16_t> bits;
          for (float v : t.random<float>(count, -100, 100)) bits.push_back(narrow(v));
          ins.push_back(std::move(bits));
          dins.push_back(t.upload(ins.back()));
          host_ptrs.push_back(ins.back().data());
          dev_ptrs.push_back(dins.back()->get());
        }
        for (reduce_kind op : {reduce_kind::sum, reduce_kind::mean}) {
          const std::string what = cat({"reduce_n ", op == reduce_kind::sum ? "sum " : "mean ", name,
                                        " n=", std::to_string(n), " count=", std::to_string(count)});
          std::vector<std::uint16_t> want(static_cast<std::size_t>(count));
          void* want_out = want.data();
          troupe::kernels::reduce_range(host_ptrs.data(), n, &want_out, 1, 0, count, type, op);
          auto out = t.garbage<std::uint16_t>(count);
          if (t.launched(kernels::launch_reduce_n(dev_ptrs.data(), n, out->get(), count, type, op, t.s()), what)) {
            t.expect_equal(t.download<std::uint16_t>(*out, count), want, what);
          }
        }
      }
    }
    std::vector<std::uint16_t> all(65536);
    for (std::uint32_t b = 0; b < 65536; ++b) all[b] = static_cast<std::uint16_t>(b);
    std::vector<std::uint32_t> want(65536);
    for (std::uint32_t b = 0; b < 65536; ++b) {
      const float f = widen(static_cast<std::uint16_t>(b));
      std::memcpy(&want[b], &f, sizeof f);
    }
    auto din = t.upload(all);
    auto out = t.garbage<std::uint32_t>(65536);
    const std::string what = cat({"cast ", name, " -> float32, every bit pattern"});
    if (t.launched(kernels::launch_cast(din->get(), type, out->get(), scalar_type::f32, 65536, t.s()), what)) {
      t.expect_equal(t.download<std::uint32_t>(*out, 65536), want, what);
    }
    std::vector<std::uint16_t> back(65536);
    for (std::uint32_t b = 0; b < 65536; ++b) {
      float f;
      std::memcpy(&f, &want[b], sizeof f);
      back[b] = narrow(f);
    }
    auto again = t.garbage<std::uint16_t>(65536);
    const std::string what2 = cat({"cast float32 -> ", name, ", every widened pattern"});
    if (t.launched(kernels::launch_cast(out->get(), scalar_type::f32, again->get(), type, 65536, t.s()), what2)) {
      t.expect_equal(t.download<std::uint16_t>(*again, 65536), back, what2);
    }
  }
}

int main() {
  const auto gpus = troupe::testing::check_gpus("CUDA kernel tests");
  if (!gpus.run()) return gpus.exit_code;
  std::unique_ptr<suite> t;
  int aborted = 0;
  try {
    check_cuda(cudaSetDevice(0), "cudaSetDevice");
    t = std::make_unique<suite>();
    test_every_type<float>(*t);
    test_every_type<double>(*t);
    test_every_type<std::int32_t>(*t);
    test_every_type<std::int64_t>(*t);
    test_float_type<float>(*t);
    test_float_type<double>(*t);
    test_refused_types<std::int32_t>(*t);
    test_refused_types<std::int64_t>(*t);
    test_refused_arguments(*t);
    test_16bit(*t);
  } catch (const std::exception& ex) {
    std::printf("FAIL %s (the remaining checks did not run)\n", ex.what());
    aborted = 1;
  }
  const int passed = t ? t->passed() : 0;
  const int failed = (t ? t->failed() : 0) + aborted;
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
