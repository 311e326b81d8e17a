// Every CUDA kernel of kernels/cuda/kernels.hpp against a host loop that computes the same
// formula in the same order, for every element type the kernel takes. This file: elementwise
// operations, casts and reductions, and main; nn_kernels_test.cpp: the optimizers and nn kernels;
// kernel_suite.hpp: what both share. The kernels are built with --fmad=false, so the comparisons
// are bitwise, except softmax: CUDA's exp and libm's exp may differ in the last bit, and its row
// sum is a tree on the GPU.
//
// Prints "FAIL <what>" per failed check and "N passed, M failed" at the end; exits 0 when nothing
// failed, 1 otherwise, and 77 (skipped) where there is no GPU (gpu_check.hpp: a CUDA error on a
// machine with a GPU is a failure).

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "gpu_check.hpp"
#include "kernel_suite.hpp"
#include "troupe/kernels/half_kernels.hpp"
#include "troupe/kernels/reduce_kernels.hpp"

namespace troupe::testing::kernel_checks {
namespace {

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

}  // namespace troupe::testing::kernel_checks

using namespace troupe::testing::kernel_checks;

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
