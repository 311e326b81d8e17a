// BM_AllReduce_Shm/<bytes>/<replicas>: float32 SUM all-reduce between the replicas of a
// MirroredStrategy over CPU:0..CPU:n-1, through the public API (ReplicaContext::all_reduce inside
// Strategy::run), against the machine's own memory bandwidth.
//
// One benchmark iteration is ONE strategy.run in which every replica calls all_reduce K times;
// the reported (manual) time is the time per all-reduce: from the first replica starting its
// loop to the last replica finishing it, divided by K. K is calibrated per benchmark so that an
// iteration lasts about --troupe_iter_ms. Since the manual time is per operation and an iteration
// holds K of them, the number of iterations is fixed (--troupe_iters) instead of being derived
// from --benchmark_min_time, which would otherwise multiply the run time by K.
//
// Counters (nccl-tests' definitions): algbw = bytes / time and busbw = algbw * 2(n-1)/n, in GB/s
// (1e9 bytes/s). efficiency = t_min / time, where t_min = 2*n*bytes / stream bandwidth is the
// time to move the 2*n*bytes an in-place all-reduce of n buffers must read and write at the
// bandwidth that two threads streaming `a[i] += b[i]` reach on this machine (measured at start).

#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "own_flags.hpp"
#include "troupe/troupe.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace td = troupe::distribute;

struct Settings {
  int stream_runs = 5;       // best of this many runs of the streaming kernel; 0 skips it
  double iter_ms = 5.0;      // target length of one benchmark iteration (K all-reduces)
  std::int64_t iters = 10;   // benchmark iterations per benchmark (repetition)
};

Settings g_settings;
double g_stream_bytes_per_s = 0.0;  // 0 when not measured

// One Runtime for the process and one cached strategy per replica count; destroyed in main
// after the benchmarks, strategies first.
std::unique_ptr<troupe::Runtime> g_runtime;
std::map<int, std::unique_ptr<td::MirroredStrategy>> g_strategies;

td::MirroredStrategy& strategy_for(int replicas) {
  auto& slot = g_strategies[replicas];
  if (!slot) {
    if (!g_runtime) g_runtime = std::make_unique<troupe::Runtime>();
    std::vector<std::string> devices;
    for (int r = 0; r < replicas; ++r) devices.push_back("CPU:" + std::to_string(r));
    slot = std::make_unique<td::MirroredStrategy>(*g_runtime, devices);
  }
  return *slot;
}

// ---------------------------------------------------------------------------------------------
// The memory bound: two threads each streaming a[i] += b[i] over their half of two arrays.

float* alloc_big(std::size_t bytes) {
  constexpr std::size_t huge = 2 * 1024 * 1024;
  const std::size_t capacity = (bytes + huge - 1) / huge * huge;
  void* p = std::aligned_alloc(huge, capacity);
  if (p == nullptr) {
    std::fprintf(stderr, "allreduce_shm_bench: cannot allocate %zu bytes\n", capacity);
    std::exit(1);
  }
  madvise(p, capacity, MADV_HUGEPAGE);  // as troupe's own large tensors do
  return static_cast<float*>(p);
}

__attribute__((noinline)) void add_inplace(float* __restrict a, const float* __restrict b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) a[i] += b[i];
}

// Bytes per second of traffic (3 x 4 bytes per element: read a, read b, write a), best of `runs`.
double measure_stream_bandwidth(int runs) {
  constexpr std::size_t bytes = std::size_t{64} << 20;  // per array
  constexpr std::size_t n = bytes / sizeof(float);
  constexpr int threads = 2;
  float* a = alloc_big(bytes);
  float* b = alloc_big(bytes);
  double best = 0.0;
  for (int run = -1; run < runs; ++run) {  // run -1: first touch (page faults), not counted
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    Clock::time_point ends[threads];
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const std::size_t lo = n * t / threads, hi = n * (t + 1) / threads;
        if (run < 0) {
          std::fill(a + lo, a + hi, 0.0f);
          std::fill(b + lo, b + hi, 1.0f);
        }
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) {
        }
        add_inplace(a + lo, b + lo, hi - lo);
        ends[t] = Clock::now();
      });
    }
    while (ready.load() < threads) {
    }
    const auto start = Clock::now();
    go.store(true, std::memory_order_release);
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(*std::max_element(ends, ends + threads) - start).count();
    if (run >= 0) best = std::max(best, 3.0 * static_cast<double>(bytes) / s);
  }
  benchmark::DoNotOptimize(a[n / 2]);
  if (a[n - 1] != static_cast<float>(runs + 1)) {
    std::fprintf(stderr, "allreduce_shm_bench: stream kernel computed %g, expected %d\n", a[n - 1], runs + 1);
    std::exit(1);
  }
  std::free(a);
  std::free(b);
  return best;
}

// ---------------------------------------------------------------------------------------------

// One strategy.run in which every replica all-reduces `inputs` k times after a one-element
// all-reduce that lines the replicas up. Returns seconds from the first replica starting its
// loop to the last one finishing it.
double timed_loop(td::MirroredStrategy& strategy, const td::PerReplica<troupe::Tensor>& inputs,
                  const troupe::Tensor& sync, std::int64_t k) {
  const int n = strategy.num_replicas_in_sync();
  std::vector<Clock::time_point> t0(static_cast<std::size_t>(n)), t1(static_cast<std::size_t>(n));
  strategy.run(
      [&](const troupe::Tensor& x, const troupe::Tensor& s) {
        td::ReplicaContext* ctx = td::get_replica_context();
        const auto r = static_cast<std::size_t>(ctx->replica_id_in_sync_group());
        troupe::Tensor lined_up = ctx->all_reduce(td::ReduceOp::sum, s);
        benchmark::DoNotOptimize(lined_up.raw_data());
        const auto start = Clock::now();
        for (std::int64_t i = 0; i < k; ++i) {
          troupe::Tensor y = ctx->all_reduce(td::ReduceOp::sum, x);
          benchmark::DoNotOptimize(y.raw_data());
        }
        const auto end = Clock::now();
        t0[r] = start;
        t1[r] = end;
      },
      inputs, sync);
  return std::chrono::duration<double>(*std::max_element(t1.begin(), t1.end()) -
                                       *std::min_element(t0.begin(), t0.end()))
      .count();
}

void BM_AllReduce_Shm(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const auto count = static_cast<std::int64_t>(std::max<std::size_t>(1, bytes / sizeof(float)));
  td::MirroredStrategy& strategy = strategy_for(n);

  const auto inputs = strategy.experimental_distribute_values_from_function([&](const td::ValueContext& c) {
    return troupe::Tensor::full({count}, c.replica_id_in_sync_group + 1, troupe::DType::f32);
  });
  const troupe::Tensor sync = troupe::Tensor::full({1}, 1, troupe::DType::f32);

  // The check, once, outside the timed loop: every element of every replica's result is n(n+1)/2.
  const auto results = strategy.run(
      [](const troupe::Tensor& x) { return td::get_replica_context()->all_reduce(td::ReduceOp::sum, x); }, inputs);
  const float expected = static_cast<float>(n * (n + 1) / 2);
  for (int r = 0; r < n; ++r) {
    const troupe::Tensor& t = results[r];
    if (t.num_elements() != count || t.dtype() != troupe::DType::f32) {
      state.SkipWithError("all_reduce returned a tensor of the wrong shape or dtype");
      return;
    }
    const float* p = t.data<float>();
    for (std::int64_t i = 0; i < count; ++i) {
      if (p[i] != expected) {
        const std::string msg = "wrong sum on replica " + std::to_string(r) + " at element " + std::to_string(i) +
                                ": " + std::to_string(p[i]) + ", expected " + std::to_string(expected);
        state.SkipWithError(msg.c_str());
        return;
      }
    }
  }

  // K: enough all-reduces for an iteration of about iter_ms (calibrated on a short loop).
  const std::int64_t probe = bytes >= (std::size_t{4} << 20) ? 1 : 8;
  const double per_op_guess = timed_loop(strategy, inputs, sync, probe) / static_cast<double>(probe);
  const auto k = static_cast<std::int64_t>(
      std::clamp(g_settings.iter_ms * 1e-3 / std::max(per_op_guess, 1e-9), 1.0, 100000.0));

  double total = 0.0;
  for (auto _ : state) {
    const double per_op = timed_loop(strategy, inputs, sync, k) / static_cast<double>(k);
    state.SetIterationTime(per_op);
    total += per_op;
  }

  const double t = total / static_cast<double>(state.iterations());
  const double algbw = static_cast<double>(bytes) / t;
  state.counters["algbw"] = algbw / 1e9;
  state.counters["busbw"] = algbw * 2.0 * (n - 1) / n / 1e9;
  state.counters["ops_per_iter"] = static_cast<double>(k);
  if (g_stream_bytes_per_s > 0) {
    const double t_min = 2.0 * n * static_cast<double>(bytes) / g_stream_bytes_per_s;
    state.counters["efficiency"] = t_min / t;
    state.counters["stream_GBps"] = g_stream_bytes_per_s / 1e9;
  }
}

// The --troupe_* flags (the rest of argv goes to Google Benchmark).
void add_own_flags(CLI::App& app) {
  app.add_option("--troupe_stream_runs", g_settings.stream_runs,
                 "best of this many runs of the streaming kernel (0 skips the bandwidth measurement)")
      ->check(CLI::Range(0, 1000));
  app.add_option("--troupe_iter_ms", g_settings.iter_ms, "target length of one iteration in ms")
      ->check(CLI::Range(0.001, 1e6));
  app.add_option("--troupe_iters", g_settings.iters, "iterations per benchmark")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1000000}));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Shared-memory all-reduce against the machine's memory bandwidth (Google Benchmark).",
               "allreduce_shm_bench"};
  add_own_flags(app);
  if (int status = troupe::bench::take_own_flags(app, argc, argv); status >= 0) return status;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    std::cerr << app.help();
    return 2;
  }

  if (g_settings.stream_runs > 0) {
    g_stream_bytes_per_s = measure_stream_bandwidth(g_settings.stream_runs);
    std::fprintf(stderr, "stream bandwidth (2 threads, a[i] += b[i], 12 B/element, best of %d): %.2f GB/s\n",
                 g_settings.stream_runs, g_stream_bytes_per_s / 1e9);
    benchmark::AddCustomContext("stream_GBps", std::to_string(g_stream_bytes_per_s / 1e9));
  }

  const std::int64_t sizes[] = {4,         64,        1 << 10,   4 << 10,  16 << 10, 64 << 10,
                                256 << 10, 1 << 20,   4 << 20,   16 << 20, 64 << 20};
  for (int replicas : {2, 4, 8}) {
    for (std::int64_t bytes : sizes) {
      benchmark::RegisterBenchmark("BM_AllReduce_Shm", BM_AllReduce_Shm)
          ->Args({bytes, replicas})
          ->UseManualTime()
          ->Iterations(g_settings.iters)
          ->Unit(benchmark::kMicrosecond);
    }
  }

  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_strategies.clear();  // every strategy before its runtime
  g_runtime.reset();
  return 0;
}
