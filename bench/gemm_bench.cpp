// The machine's reachable matrix-product rate, and the MLP's products against it, through
// troupe's nn::matmul on this process's CPU kernel path (TROUPE_CPU picks one; the widest the CPU
// runs otherwise).
//
//   BM_Matmul/<n>/threads:<t>: float32 [n, n] · [n, n], t threads at once (one product each);
//     FLOP/s counts 2n³ per product, summed over the threads, per second of wall time (the Time
//     column is wall time over every thread's iterations, not one product's latency). The largest rate over n and t is
//     what the machine reaches.
//   BM_MlpGemms/<batch>: one training step's products of the 784-256-256-10 MLP at a per-replica
//     batch (forward: x·W for 3 layers; backward: xᵀ·g for 3 layers, g·Wᵀ for the upper 2), the
//     shapes mlp_classifier runs (batch 64 per replica at 4 replicas of 256, 256 at 1).
//
// The path is kept in the JSON context (and logged at startup with TROUPE_LOG_LEVEL=info:
// "troupe: info: CPU kernels: ...").

#include <benchmark/benchmark.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "troupe/troupe.hpp"

namespace {

using troupe::Tensor;

Tensor filled(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  return troupe::nn::glorot_uniform(rows, cols, seed);
}

// One element of op(a)·op(b) against a double loop: the product must be right before it is timed.
void check(const Tensor& a, const Tensor& b, const Tensor& c, bool ta, bool tb) {
  const std::int64_t m = c.shape()[0], n = c.shape()[1], k = ta ? a.shape()[0] : a.shape()[1];
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  for (auto [i, j] : {std::array<std::int64_t, 2>{0, 0}, {m - 1, n - 1}, {m / 2, n / 3}}) {
    double s = 0;
    for (std::int64_t p = 0; p < k; ++p) {
      s += double(ta ? pa[p * m + i] : pa[i * k + p]) * double(tb ? pb[j * k + p] : pb[p * n + j]);
    }
    if (std::abs(s - c.data<float>()[i * n + j]) > 1e-4 * (1 + std::abs(s))) {
      std::cerr << "gemm_bench: wrong product at (" << i << ", " << j << "): " << c.data<float>()[i * n + j]
                << ", expected " << s << "\n";
      std::exit(1);
    }
  }
}

void BM_Matmul(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const Tensor a = filled(n, n, 1 + state.thread_index());
  const Tensor b = filled(n, n, 2 + state.thread_index());
  check(a, b, troupe::nn::matmul(a, b), false, false);
  for (auto _ : state) benchmark::DoNotOptimize(troupe::nn::matmul(a, b));
  // Google Benchmark sums a counter over the threads and multiplies an iteration-invariant one
  // by the iterations of every thread, then divides by the threads' mean wall time: without
  // kAvgThreads a t-thread rate is counted t times over (an 878 GFLOP/s "2-thread" figure against
  // 223 on one thread). With it the counter is the products of all threads per second of wall
  // time: the rate the machine reaches with t threads at once.
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * double(n) * double(n) * double(n),
                         benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kAvgThreads);
}

struct product {
  std::int64_t a_rows, a_cols, b_rows, b_cols;
  bool ta, tb;
};

void BM_MlpGemms(benchmark::State& state) {
  const std::int64_t batch = state.range(0);
  const std::array<std::int64_t, 4> width{784, 256, 256, 10};
  std::vector<product> products;
  for (int l = 0; l < 3; ++l) {
    const std::int64_t in = width[l], out = width[l + 1];
    products.push_back({batch, in, in, out, false, false});              // forward x·W
    products.push_back({batch, in, batch, out, true, false});            // kernel gradient xᵀ·g
    if (l > 0) products.push_back({batch, out, in, out, false, true});   // input gradient g·Wᵀ
  }
  std::vector<std::array<Tensor, 2>> operands;
  double flop = 0;
  std::uint64_t seed = 10;
  for (const product& p : products) {
    operands.push_back({filled(p.a_rows, p.a_cols, seed++), filled(p.b_rows, p.b_cols, seed++)});
    const std::int64_t m = p.ta ? p.a_cols : p.a_rows, k = p.ta ? p.a_rows : p.a_cols, n = p.tb ? p.b_rows : p.b_cols;
    flop += 2.0 * double(m) * double(n) * double(k);
    check(operands.back()[0], operands.back()[1],
          troupe::nn::matmul(operands.back()[0], operands.back()[1], p.ta, p.tb), p.ta, p.tb);
  }
  for (auto _ : state) {
    for (std::size_t i = 0; i < products.size(); ++i) {
      benchmark::DoNotOptimize(troupe::nn::matmul(operands[i][0], operands[i][1], products[i].ta, products[i].tb));
    }
  }
  state.counters["FLOP/s"] = benchmark::Counter(flop, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["FLOP"] = flop;
}

BENCHMARK(BM_Matmul)->Arg(256)->Arg(512)->Arg(1024)->Threads(1)->Threads(2)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MlpGemms)->Arg(64)->Arg(256)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::AddCustomContext("troupe_cpu_path", troupe::Runtime::cpu_kernel_path());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
