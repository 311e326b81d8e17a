// The CPU kernel paths (runtime/src/cpu): the choice of a path, every path the machine runs
// against a reference, and the optimizer updates giving the same bits on every path.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "cpu/intra_op.hpp"
#include "cpu/kernels.hpp"
#include "test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using troupe::testing::contains;
using troupe::testing::message_of;
namespace cpu = troupe::detail::cpu;

namespace {

template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 engine(seed);
  std::vector<T> out(n);
  for (auto& x : out) x = static_cast<T>(lo + (hi - lo) * (static_cast<double>(engine() >> 11) * 0x1.0p-53));
  return out;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
const cpu::typed_kernels<T>& typed(const cpu::kernel_table& t) {
  if constexpr (std::is_same_v<T, float>) {
    return t.f32;
  } else {
    return t.f64;
  }
}

// op(a) · op(b) in double, element by element.
template <class T>
std::vector<double> reference_gemm(const std::vector<T>& a, const std::vector<T>& b, std::int64_t m, std::int64_t n,
                                   std::int64_t k, bool ta, bool tb) {
  std::vector<double> c(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t p = 0; p < k; ++p) {
        const double x = ta ? a[p * m + i] : a[i * k + p];
        const double y = tb ? b[j * k + p] : b[p * n + j];
        s += x * y;
      }
      c[i * n + j] = s;
    }
  }
  return c;
}

template <class T>
void check_gemm(const cpu::kernel_table& table, std::int64_t m, std::int64_t n, std::int64_t k, double tolerance) {
  for (int variant = 0; variant < 4; ++variant) {
    const bool ta = variant & 1;
    const bool tb = variant & 2;
    const auto a = random_values<T>(static_cast<std::size_t>(m * k), 1 + variant);
    const auto b = random_values<T>(static_cast<std::size_t>(k * n), 11 + variant);
    std::vector<T> c(static_cast<std::size_t>(m * n), T(7));
    typed<T>(table).gemm(a.data(), b.data(), c.data(), m, n, k, ta, tb);
    const auto want = reference_gemm(a, b, m, n, k, ta, tb);
    double worst = 0;
    for (std::size_t i = 0; i < c.size(); ++i) worst = std::max(worst, std::abs(double(c[i]) - want[i]));
    INFO("path " << cpu::isa_name(table.path) << ", " << m << "x" << n << "x" << k << ", ta " << ta << ", tb " << tb);
    CHECK(worst <= tolerance * std::max<std::int64_t>(k, 1));
  }
}

}  // namespace

TEST_CASE("the CPU kernel path: the widest the CPU runs unless TROUPE_CPU names one - bad values name the variable") {
  const cpu::cpu_features none{};
  const cpu::cpu_features avx2{true, false};
  const cpu::cpu_features all{true, true};
  CHECK(cpu::choose_isa(nullptr, none) == cpu::isa::baseline);
  CHECK(cpu::choose_isa("", none) == cpu::isa::baseline);
  CHECK(cpu::choose_isa("baseline", all) == cpu::isa::baseline);
  if (cpu::table_for(cpu::isa::avx512) != nullptr) {
    CHECK(cpu::choose_isa(nullptr, avx2) == cpu::isa::avx2);
    CHECK(cpu::choose_isa(nullptr, all) == cpu::isa::avx512);
    CHECK(cpu::choose_isa("avx2", all) == cpu::isa::avx2);
    CHECK(cpu::choose_isa("avx512", all) == cpu::isa::avx512);
    const std::string lacks = message_of([&] { cpu::choose_isa("avx512", avx2); });
    CHECK(contains(lacks, "TROUPE_CPU=avx512: this CPU lacks AVX-512"));
    CHECK(contains(lacks, "it runs baseline and avx2"));
    CHECK(contains(message_of([&] { cpu::choose_isa("avx2", none); }), "TROUPE_CPU=avx2: this CPU lacks AVX2 and FMA"));
  }
  const std::string bad = message_of([&] { cpu::choose_isa("sse9", all); });
  CHECK(bad == "TROUPE_CPU=\"sse9\" names no CPU kernel path (expected baseline, avx2 or avx512)");
  CHECK_THROWS_AS(cpu::choose_isa("AVX2", all), std::invalid_argument);

  // This process: TROUPE_CPU or the widest path.
  const std::vector<cpu::isa> here = cpu::runnable_isas();
  REQUIRE(!here.empty());
  CHECK(here.front() == cpu::isa::baseline);
  const char* env = std::getenv("TROUPE_CPU");
  const cpu::isa expected = env != nullptr && *env != '\0' ? cpu::choose_isa(env, cpu::detect_features()) : here.back();
  CHECK(Runtime::cpu_kernel_path() == cpu::isa_name(expected));
}

TEST_CASE("every CPU path this machine runs multiplies matrices like a double-precision reference") {
  for (cpu::isa path : cpu::runnable_isas()) {
    const cpu::kernel_table& t = *cpu::table_for(path);
    // Sizes around the kernels' register blocks (8, 16, 24, 48 wide), 0 and 1.
    for (auto [m, n, k] : {std::array<std::int64_t, 3>{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {64, 256, 784},
                           {0, 4, 3}, {4, 0, 3}, {4, 3, 0}, {49, 23, 129}}) {
      check_gemm<float>(t, m, n, k, 2e-7);
      check_gemm<double>(t, m, n, k, 1e-15);
    }
  }
}

TEST_CASE("every CPU path's dense layer forward and backward agree with the baseline path") {
  const cpu::kernel_table& base = *cpu::table_for(cpu::isa::baseline);
  const std::int64_t batch = 37, in = 29, units = 19;
  const auto x = random_values<float>(batch * in, 1);
  const auto w = random_values<float>(in * units, 2);
  const auto bias = random_values<float>(units, 3);
  const auto grad_out = random_values<float>(batch * units, 4);
  for (bool relu : {false, true}) {
    std::vector<float> y0(batch * units), gi0(batch * in), gk0(in * units), gb0(units);
    base.f32.dense_forward(x.data(), w.data(), bias.data(), y0.data(), batch, in, units, relu);
    base.f32.dense_backward(x.data(), w.data(), y0.data(), grad_out.data(), relu, gi0.data(), gk0.data(), gb0.data(),
                            batch, in, units);
    if (relu) {
      for (std::size_t i = 0; i < y0.size(); ++i) CHECK(y0[i] >= 0.0f);
    }
    for (cpu::isa path : cpu::runnable_isas()) {
      const cpu::kernel_table& t = *cpu::table_for(path);
      std::vector<float> y(batch * units), gi(batch * in), gk(in * units), gb(units);
      t.f32.dense_forward(x.data(), w.data(), bias.data(), y.data(), batch, in, units, relu);
      // The same output for the mask, so only the products' rounding may differ.
      t.f32.dense_backward(x.data(), w.data(), y0.data(), grad_out.data(), relu, gi.data(), gk.data(), gb.data(), batch,
                           in, units);
      INFO("path " << cpu::isa_name(path) << ", relu " << relu);
      for (std::size_t i = 0; i < y.size(); ++i) CHECK(y[i] == doctest::Approx(y0[i]).epsilon(1e-5));
      for (std::size_t i = 0; i < gi.size(); ++i) CHECK(gi[i] == doctest::Approx(gi0[i]).epsilon(1e-5));
      for (std::size_t i = 0; i < gk.size(); ++i) CHECK(gk[i] == doctest::Approx(gk0[i]).epsilon(1e-5));
      for (std::size_t i = 0; i < gb.size(); ++i) CHECK(gb[i] == doctest::Approx(gb0[i]).epsilon(1e-5));
      std::vector<float> r(x.size()), rg(x.size());
      t.f32.relu(x.data(), r.data(), static_cast<std::int64_t>(x.size()));
      t.f32.relu_grad(gi0.data(), x.data(), rg.data(), static_cast<std::int64_t>(x.size()));
      for (std::size_t i = 0; i < x.size(); ++i) {
        CHECK(r[i] == (x[i] > 0 ? x[i] : 0.0f));
        CHECK(rg[i] == (x[i] > 0 ? gi0[i] : 0.0f));
      }
    }
  }
}

TEST_CASE_TEMPLATE("optimizer updates give the same bits on every CPU path", T, float, double) {
  const cpu::kernel_table& base = *cpu::table_for(cpu::isa::baseline);
  // Lengths that leave every vector width a tail; values spread over many binades so that a fused
  // multiply-add (one rounding instead of two) would show.
  for (std::int64_t n : {1, 7, 31, 1000, 4099}) {
    const auto w = random_values<T>(n, 100 + n, -3, 3);
    const auto g = random_values<T>(n, 200 + n, -1e-3, 1e-3);
    const auto m = random_values<T>(n, 300 + n, -1e-2, 1e-2);
    const auto v = random_values<T>(n, 400 + n, 0, 1e-4);
    const T lr = T(0.0173), mom = T(0.9), b1 = T(0.9), b2 = T(0.999), eps = T(1e-7);
    auto run = [&](const cpu::kernel_table& t) {
      std::vector<std::vector<T>> out(7, std::vector<T>(n));
      const auto& k = typed<T>(t);
      k.sgd(w.data(), g.data(), out[0].data(), n, lr);
      k.sgd_momentum(w.data(), g.data(), m.data(), out[1].data(), out[2].data(), n, lr, mom, false);
      k.sgd_momentum(w.data(), g.data(), m.data(), out[3].data(), out[2].data(), n, lr, mom, true);
      k.adam(w.data(), g.data(), m.data(), v.data(), out[4].data(), out[5].data(), out[6].data(), n, T(0.00123), b1,
             T(1) - b1, b2, T(1) - b2, eps);
      return out;
    };
    const auto want = run(base);
    // The baseline path against the formulas written out here, operation by operation.
    for (std::int64_t i = 0; i < n; ++i) {
      CHECK(want[0][i] == T(w[i] - lr * g[i]));
      const T vel = T(T(mom * m[i]) - T(lr * g[i]));
      CHECK(want[1][i] == T(w[i] + vel));
      CHECK(want[3][i] == T(w[i] + T(T(mom * vel) - T(lr * g[i]))));
      const T mi = T(T(b1 * m[i]) + T(T(T(1) - b1) * g[i]));
      const T vi = T(T(b2 * v[i]) + T(T(T(1) - b2) * T(g[i] * g[i])));
      CHECK(want[5][i] == mi);
      CHECK(want[6][i] == vi);
      CHECK(want[4][i] == T(w[i] - T(T(T(0.00123) * mi) / T(std::sqrt(vi) + eps))));
    }
    for (cpu::isa path : cpu::runnable_isas()) {
      INFO("path " << cpu::isa_name(path) << ", n " << n);
      const auto got = run(*cpu::table_for(path));
      for (std::size_t j = 0; j < got.size(); ++j) CHECK(same_bits(got[j], want[j]));
    }
  }
}

TEST_CASE("intra-op threads: a replica gets the cores the others leave - parallel_for runs every part once") {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (std::getenv("TROUPE_INTRA_OP_THREADS") == nullptr) {
    CHECK(cpu::intra_op_threads_for(1) == cores);
    CHECK(cpu::intra_op_threads_for(cores * 4) == 1);
  }
  CHECK(cpu::intra_op_threads() == 1);
  {
    cpu::intra_op_scope scope(3);
    CHECK(cpu::intra_op_threads() == 3);
  }
  CHECK(cpu::intra_op_threads() == 1);
  std::vector<std::atomic<int>> hits(17);
  cpu::parallel_for(17, [&](int p) { hits[static_cast<std::size_t>(p)].fetch_add(1); });
  for (auto& h : hits) CHECK(h.load() == 1);
  CHECK(message_of([] { cpu::parallel_for(4, [](int p) { if (p == 2) throw std::runtime_error("part 2"); }); }) ==
        "part 2");
}

TEST_CASE("products and Dense layers split over 2 intra-op threads agree with one thread and repeat their bits") {
  const std::int64_t batch = 100, in = 300, units = 200;
  const Tensor x = nn::glorot_uniform(batch, in, 1) * 3.0f;
  const Tensor kernel = nn::glorot_uniform(in, units, 2);
  const Tensor bias = nn::glorot_uniform(1, units, 3).reshape({units});
  const Tensor grad = nn::glorot_uniform(batch, units, 4);
  auto run = [&](int threads) {
    cpu::intra_op_scope scope(threads);
    std::vector<Tensor> out;
    out.push_back(nn::matmul(x, kernel));
    out.push_back(nn::matmul(x, x, true, false));
    out.push_back(nn::matmul(kernel, kernel, false, true));
    const Tensor y = nn::dense_forward(x, kernel, bias, nn::Activation::relu);
    out.push_back(y);
    nn::DenseGradients d = nn::dense_backward(x, kernel, y, grad, nn::Activation::relu, true);
    out.push_back(d.input);
    out.push_back(d.kernel);
    out.push_back(d.bias);
    return out;
  };
  const auto one = run(1);
  const auto two = run(2);
  const auto again = run(2);
  for (std::size_t i = 0; i < one.size(); ++i) {
    CAPTURE(i);
    CHECK(two[i].equals(again[i]));
    const auto a = one[i].to_vector<float>();
    const auto b = two[i].to_vector<float>();
    REQUIRE(a.size() == b.size());
    double worst = 0;
    for (std::size_t k = 0; k < a.size(); ++k) worst = std::max(worst, double(std::abs(a[k] - b[k])) / (1 + std::abs(a[k])));
    CHECK(worst < 1e-5);
  }
}

// 64-byte aligned floats, as tensor storage is: Eigen's vectorized sums peel unaligned heads, so
// the bits of a column sum may depend on where its operands lie.
struct aligned_floats {
  explicit aligned_floats(std::size_t n)
      : size(n), data(static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64 + 64)), &std::free) {}
  aligned_floats(const std::vector<float>& v) : aligned_floats(v.size()) {
    std::memcpy(data.get(), v.data(), v.size() * sizeof(float));
  }
  float* get() const { return data.get(); }
  std::size_t size;
  std::unique_ptr<float, decltype(&std::free)> data;
};

TEST_CASE("cpu: a Dense kernel gradient computed in row blocks has the bits of the whole, on every path") {
  // Model::train_step computes the first layer's kernel gradient xᵀ·g in row blocks (columns of
  // x, in fresh tensors), each all-reduced as soon as it exists; the weights must not depend on it.
  struct shape {
    std::int64_t batch, in, units, block;
  };
  for (const cpu::isa path : cpu::runnable_isas()) {
    const cpu::kernel_table& table = *cpu::table_for(path);
    for (const shape s : {shape{64, 784, 256, 112}, shape{64, 784, 256, 16}, shape{256, 784, 256, 208},
                          shape{16, 96, 64, 16}, shape{8, 40, 32, 16}, shape{3, 40, 32, 48}}) {
      INFO("path " << std::string(cpu::isa_name(path)) << ", batch " << s.batch << ", " << s.in << "x" << s.units
                   << ", block " << s.block);
      const aligned_floats x(random_values<float>(static_cast<std::size_t>(s.batch * s.in), 1, -3.0, 3.0));
      const aligned_floats output(random_values<float>(static_cast<std::size_t>(s.batch * s.units), 2));
      const aligned_floats grad(random_values<float>(static_cast<std::size_t>(s.batch * s.units), 3));
      const aligned_floats kernel(std::vector<float>(static_cast<std::size_t>(s.in * s.units), 0.5f));
      const aligned_floats whole_kernel(static_cast<std::size_t>(s.in * s.units));
      const aligned_floats whole_bias(static_cast<std::size_t>(s.units));
      table.f32.dense_backward(x.get(), kernel.get(), output.get(), grad.get(), true, nullptr, whole_kernel.get(),
                               whole_bias.get(), s.batch, s.in, s.units);
      for (std::int64_t r0 = 0; r0 < s.in; r0 += s.block) {
        const std::int64_t r1 = std::min(s.in, r0 + s.block);
        const aligned_floats cols(static_cast<std::size_t>(s.batch * (r1 - r0)));
        for (std::int64_t b = 0; b < s.batch; ++b) {
          std::memcpy(cols.get() + b * (r1 - r0), x.get() + b * s.in + r0, static_cast<std::size_t>(r1 - r0) * sizeof(float));
        }
        const aligned_floats part(static_cast<std::size_t>((r1 - r0) * s.units));
        const aligned_floats bias(static_cast<std::size_t>(s.units));
        table.f32.dense_backward(cols.get(), kernel.get() + r0 * s.units, output.get(), grad.get(), true, nullptr,
                                 part.get(), bias.get(), s.batch, r1 - r0, s.units);
        CHECK(std::memcmp(part.get(), whole_kernel.get() + r0 * s.units, part.size * sizeof(float)) == 0);
        CHECK(std::memcmp(bias.get(), whole_bias.get(), bias.size * sizeof(float)) == 0);
      }
    }
  }
}

}  // namespace TROUPE_TEST_FILE
