// All-reduce between GPUs: float32 SUM, troupe's path against bare NCCL, on 1..N local GPUs.
//
// BM_AllReduce_Nccl/<bytes>/<gpus>: a MirroredStrategy over GPU:0..gpus-1 (its default
// cross-device op on GPUs is NCCL), through the public API: inside Strategy::run every replica
// calls get_replica_context()->all_reduce(ReduceOp::sum, y) on a GPU tensor, which enqueues an
// NCCL all-reduce on the replica's own CUDA stream; run returns once every replica's stream has
// finished. One strategy per GPU count, built on first use and kept.
//
// BM_AllReduce_NcclBare/<bytes>/<gpus>: NCCL alone on the same sizes: ncclCommInitAll over the
// GPUs, one non-blocking stream and one buffer per GPU, in-place ncclAllReduce calls, one
// ncclGroupStart/End around the per-GPU calls of each all-reduce. On one GPU an in-place
// all-reduce moves no data: NCCL only enqueues it, and the time is that host-side cost.
//
// BM_AllReduce_NcclBareOutOfPlace/<bytes>/<gpus>: the same with two buffers per GPU, chained
// a -> b, b -> a: like troupe's all_reduce, which returns a new tensor, every all-reduce writes a
// buffer other than its input (on one GPU: a device-to-device copy).
//
// One benchmark iteration is ONE strategy.run (or, bare, one batch of enqueued all-reduces
// followed by cudaStreamSynchronize on every stream) holding `reps` chained all-reduces
// (y = all_reduce(SUM, y)). The reported (manual) time is the wall time of that iteration divided
// by reps: the time of one all-reduce, with troupe's per-run cost spread over the reps. reps is
// calibrated per benchmark so that an iteration lasts about --troupe_iter_ms (default 2 ms), from
// 1 to 1000. Since the manual time is per all-reduce, the iteration count is fixed
// (--troupe_iters, default 20) rather than derived from --benchmark_min_time.
//
// Counters (nccl-tests' definitions, 1 GB = 1e9 bytes): algbw_GBps = bytes / time,
// busbw_GBps = algbw * 2(n-1)/n (0 for one GPU); reps = all-reduces per iteration.
//
// Correctness is checked once per benchmark, outside the timed part: replica (GPU) r holds r+1
// in every element, one all-reduce, and every element on every GPU must equal n(n+1)/2 (exact in
// float32), else the benchmark stops with SkipWithError. The timed chains start from the same
// inputs; their sums grow (to inf for long chains with n > 1), which does not change the time.

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "own_flags.hpp"
#include "troupe/troupe.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace td = troupe::distribute;

struct Settings {
  double iter_ms = 2.0;     // target length of one benchmark iteration (reps all-reduces)
  std::int64_t iters = 20;  // benchmark iterations per benchmark (repetition)
};

Settings g_settings;
constexpr std::int64_t kMaxReps = 1000;

// ---------------------------------------------------------------------------------------------
// Errors of the bare path: a failed CUDA or NCCL call throws, the benchmark reports it.

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

void check_nccl(ncclResult_t res, const char* what) {
  if (res != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(res));
}

std::int64_t element_count(std::size_t bytes) {
  return static_cast<std::int64_t>(std::max<std::size_t>(1, bytes / sizeof(float)));
}

// reps for an iteration of about iter_ms, given the time of one all-reduce.
std::int64_t reps_for(double seconds_per_op) {
  const double want = g_settings.iter_ms * 1e-3 / std::max(seconds_per_op, 1e-9);
  return static_cast<std::int64_t>(std::clamp(want, 1.0, static_cast<double>(kMaxReps)));
}

// A first guess of reps before calibration: about 4 MiB of all-reduced data per iteration.
std::int64_t initial_reps(std::size_t bytes) {
  return std::clamp<std::int64_t>(static_cast<std::int64_t>((std::size_t{1} << 22) / std::max<std::size_t>(bytes, 1)),
                                  1, kMaxReps);
}

void set_counters(benchmark::State& state, std::size_t bytes, int n, double total_seconds, std::int64_t reps) {
  if (state.iterations() == 0 || total_seconds <= 0) return;
  const double t = total_seconds / static_cast<double>(state.iterations());
  const double algbw = static_cast<double>(bytes) / t / 1e9;
  state.counters["algbw_GBps"] = benchmark::Counter(algbw);
  state.counters["busbw_GBps"] = benchmark::Counter(n > 1 ? algbw * 2.0 * (n - 1) / n : 0.0);
  state.counters["reps"] = benchmark::Counter(static_cast<double>(reps));
}

// Expected value of every element after one SUM all-reduce of r+1 over n replicas.
float expected_sum(int n) { return static_cast<float>(n * (n + 1) / 2); }

// "" when every element of `values` equals `expected`, else what is wrong.
std::string mismatch(const std::vector<float>& values, std::int64_t count, float expected, const char* who, int r) {
  if (static_cast<std::int64_t>(values.size()) != count) {
    return std::string(who) + " " + std::to_string(r) + ": " + std::to_string(values.size()) + " elements, expected " +
           std::to_string(count);
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (values[i] != expected) {
      return std::string("wrong sum on ") + who + " " + std::to_string(r) + " at element " + std::to_string(i) + ": " +
             std::to_string(values[i]) + ", expected " + std::to_string(expected);
    }
  }
  return {};
}

// ---------------------------------------------------------------------------------------------
// troupe: one Runtime for the process and one MirroredStrategy per GPU count. Only the strategy
// of the GPU count in use is kept (benchmarks are registered GPU count by GPU count), so that the
// NCCL communicators of other counts do not hold GPU memory meanwhile.

std::unique_ptr<troupe::Runtime> g_runtime;
std::map<int, std::unique_ptr<td::MirroredStrategy>> g_strategies;

td::MirroredStrategy& strategy_for(int gpus) {
  for (auto it = g_strategies.begin(); it != g_strategies.end();) {
    it = it->first == gpus ? std::next(it) : g_strategies.erase(it);
  }
  auto& slot = g_strategies[gpus];
  if (!slot) {
    if (!g_runtime) g_runtime = std::make_unique<troupe::Runtime>();
    std::vector<std::string> devices;
    for (int g = 0; g < gpus; ++g) devices.push_back("GPU:" + std::to_string(g));
    slot = std::make_unique<td::MirroredStrategy>(*g_runtime, devices);
  }
  return *slot;
}

// One strategy.run in which every replica all-reduces its input `reps` times, chained. Returns
// the seconds the run took (it returns after every replica's stream has finished).
// The benchmark loop over `timed(reps)` (seconds for reps chained all-reduces): a warm-up with the
// first guess of reps, then reps for an iteration of about iter_ms, and the time per all-reduce of
// every iteration, summed into `total`. Returns the reps used.
template <class Timed>
std::int64_t measure(benchmark::State& state, std::size_t bytes, double& total, Timed&& timed) {
  const std::int64_t guess = initial_reps(bytes);
  timed(guess);
  const std::int64_t reps = reps_for(timed(guess) / static_cast<double>(guess));
  for (auto _ : state) {
    const double per_op = timed(reps) / static_cast<double>(reps);
    state.SetIterationTime(per_op);
    total += per_op;
  }
  return reps;
}

double timed_run(td::MirroredStrategy& strategy, const td::PerReplica<troupe::Tensor>& inputs, std::int64_t reps) {
  const auto start = Clock::now();
  // The results are returned (not dropped inside the replica function) so that no GPU buffer is
  // released within the timed part; they are destroyed after the clock stops.
  const auto results = strategy.run(
      [reps](const troupe::Tensor& x) {
        td::ReplicaContext* ctx = td::get_replica_context();
        troupe::Tensor y = x;
        for (std::int64_t i = 0; i < reps; ++i) y = ctx->all_reduce(td::ReduceOp::sum, y);
        return y;
      },
      inputs);
  const auto end = Clock::now();
  benchmark::DoNotOptimize(&results);
  return std::chrono::duration<double>(end - start).count();
}

void BM_AllReduce_Nccl(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const std::int64_t count = element_count(bytes);
  double total = 0.0;
  std::int64_t reps = 1;
  try {
    td::MirroredStrategy& strategy = strategy_for(n);
    const auto inputs = strategy.experimental_distribute_values_from_function([&](const td::ValueContext& c) {
      const int r = c.replica_id_in_sync_group;
      return troupe::Tensor::full(troupe::Shape{count}, troupe::Scalar(static_cast<float>(r + 1)),
                                  troupe::DType::f32, strategy.replica_device(r));
    });
    for (int r = 0; r < n; ++r) {
      if (!inputs[r].is_gpu()) {
        state.SkipWithError(("input of replica " + std::to_string(r) + " is on " + inputs[r].device().to_string() +
                             ", not on a GPU")
                                .c_str());
        return;
      }
    }

    // The check, once, outside the timed part.
    const auto results = strategy.run(
        [](const troupe::Tensor& x) { return td::get_replica_context()->all_reduce(td::ReduceOp::sum, x); }, inputs);
    for (int r = 0; r < n; ++r) {
      const troupe::Tensor& t = results[r];
      if (t.dtype() != troupe::DType::f32 || t.device() != strategy.replica_device(r)) {
        state.SkipWithError(("all_reduce on replica " + std::to_string(r) + " returned a " +
                             std::string(troupe::dtype_name(t.dtype())) + " tensor on " + t.device().to_string())
                                .c_str());
        return;
      }
      const std::string wrong = mismatch(t.to_vector<float>(), count, expected_sum(n), "replica", r);
      if (!wrong.empty()) {
        state.SkipWithError(wrong.c_str());
        return;
      }
    }

    reps = measure(state, bytes, total, [&](std::int64_t k) { return timed_run(strategy, inputs, k); });
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  set_counters(state, bytes, n, total, reps);
}

// ---------------------------------------------------------------------------------------------
// Bare NCCL: one communicator and one non-blocking stream per GPU, for the GPU count in use.

struct NcclComms {
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;

  explicit NcclComms(int n) : comms(static_cast<std::size_t>(n)), streams(static_cast<std::size_t>(n), nullptr) {
    std::vector<int> devices;
    for (int g = 0; g < n; ++g) devices.push_back(g);
    check_nccl(ncclCommInitAll(comms.data(), n, devices.data()), "ncclCommInitAll");
    for (int g = 0; g < n; ++g) {
      check_cuda(cudaSetDevice(g), "cudaSetDevice");
      check_cuda(cudaStreamCreateWithFlags(&streams[static_cast<std::size_t>(g)], cudaStreamNonBlocking),
                 "cudaStreamCreateWithFlags");
    }
  }
  ~NcclComms() {
    for (std::size_t g = 0; g < streams.size(); ++g) {
      if (streams[g] == nullptr) continue;
      cudaSetDevice(static_cast<int>(g));
      cudaStreamSynchronize(streams[g]);
      cudaStreamDestroy(streams[g]);
    }
    for (ncclComm_t c : comms) {
      if (c != nullptr) ncclCommDestroy(c);
    }
  }
  NcclComms(const NcclComms&) = delete;
  NcclComms& operator=(const NcclComms&) = delete;
  int size() const { return static_cast<int>(comms.size()); }
};

std::map<int, std::unique_ptr<NcclComms>> g_comms;

NcclComms& comms_for(int gpus) {
  for (auto it = g_comms.begin(); it != g_comms.end();) {
    it = it->first == gpus ? std::next(it) : g_comms.erase(it);
  }
  auto& slot = g_comms[gpus];
  if (!slot) slot = std::make_unique<NcclComms>(gpus);
  return *slot;
}

// A float buffer on one GPU, freed when it goes out of scope.
class DeviceFloats {
 public:
  DeviceFloats(int device, std::int64_t count) : device_(device) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    check_cuda(cudaMalloc(&data_, static_cast<std::size_t>(count) * sizeof(float)), "cudaMalloc");
  }
  ~DeviceFloats() {
    if (data_ != nullptr) {
      cudaSetDevice(device_);
      cudaFree(data_);
    }
  }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* data() const { return static_cast<float*>(data_); }

 private:
  int device_;
  void* data_ = nullptr;
};

// One bare benchmark's buffers: `a` on every GPU, and `b` for out-of-place all-reduces.
struct BareBuffers {
  std::vector<std::unique_ptr<DeviceFloats>> a, b;
  bool in_place() const { return b.empty(); }
  // Where the result of all-reduce number i (from 0) lands on GPU g.
  float* result(std::size_t g, std::int64_t i) const { return in_place() || i % 2 == 1 ? a[g]->data() : b[g]->data(); }
};

// Enqueues `reps` chained SUM all-reduces of every GPU's buffer (in place, or out of place
// alternating a -> b, b -> a), one NCCL group per all-reduce, then waits for every stream.
double timed_bare(NcclComms& c, const BareBuffers& buffers, std::int64_t count, std::int64_t reps) {
  const int n = c.size();
  const auto start = Clock::now();
  for (std::int64_t i = 0; i < reps; ++i) {
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int g = 0; g < n; ++g) {
      const auto ug = static_cast<std::size_t>(g);
      float* dst = buffers.result(ug, i);
      const float* src = buffers.in_place() ? dst : (i % 2 == 0 ? buffers.a[ug]->data() : buffers.b[ug]->data());
      check_nccl(ncclAllReduce(src, dst, static_cast<std::size_t>(count), ncclFloat32, ncclSum, c.comms[ug], c.streams[ug]),
                 "ncclAllReduce");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  }
  for (int g = 0; g < n; ++g) {
    check_cuda(cudaSetDevice(g), "cudaSetDevice");
    check_cuda(cudaStreamSynchronize(c.streams[static_cast<std::size_t>(g)]), "cudaStreamSynchronize");
  }
  const auto end = Clock::now();
  return std::chrono::duration<double>(end - start).count();
}

void bare_benchmark(benchmark::State& state, bool in_place) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const std::int64_t count = element_count(bytes);
  double total = 0.0;
  std::int64_t reps = 1;
  try {
    NcclComms& c = comms_for(n);
    BareBuffers buffers;
    for (int g = 0; g < n; ++g) {
      buffers.a.push_back(std::make_unique<DeviceFloats>(g, count));
      if (!in_place) buffers.b.push_back(std::make_unique<DeviceFloats>(g, count));
      const std::vector<float> host(static_cast<std::size_t>(count), static_cast<float>(g + 1));
      check_cuda(cudaMemcpy(buffers.a.back()->data(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
                 "cudaMemcpy to the GPU");
      // A copy from pageable memory may return before its DMA lands, and the NCCL streams are
      // non-blocking: wait for it before they read the buffer.
      check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }

    // The check, once, outside the timed part.
    timed_bare(c, buffers, count, 1);
    for (int g = 0; g < n; ++g) {
      std::vector<float> host(static_cast<std::size_t>(count));
      check_cuda(cudaSetDevice(g), "cudaSetDevice");
      check_cuda(cudaMemcpy(host.data(), buffers.result(static_cast<std::size_t>(g), 0), host.size() * sizeof(float),
                            cudaMemcpyDeviceToHost),
                 "cudaMemcpy to the host");
      const std::string wrong = mismatch(host, count, expected_sum(n), "GPU", g);
      if (!wrong.empty()) {
        state.SkipWithError(wrong.c_str());
        return;
      }
    }

    reps = measure(state, bytes, total, [&](std::int64_t k) { return timed_bare(c, buffers, count, k); });
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  set_counters(state, bytes, n, total, reps);
}

void BM_AllReduce_NcclBare(benchmark::State& state) { bare_benchmark(state, true); }
void BM_AllReduce_NcclBareOutOfPlace(benchmark::State& state) { bare_benchmark(state, false); }

// ---------------------------------------------------------------------------------------------

// The --troupe_* flags (the rest of argv goes to Google Benchmark).
void add_own_flags(CLI::App& app) {
  app.add_option("--troupe_iter_ms", g_settings.iter_ms, "target length of one iteration in ms")
      ->check(CLI::Range(0.001, 1e6));
  app.add_option("--troupe_iters", g_settings.iters, "iterations per benchmark")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1000000}));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"troupe's NCCL all-reduce against bare ncclAllReduce (Google Benchmark).", "allreduce_nccl_bench"};
  add_own_flags(app);
  if (int status = troupe::bench::take_own_flags(app, argc, argv); status >= 0) return status;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    std::cerr << app.help();
    return 2;
  }

  const int gpus = troupe::Runtime::gpu_count();
  if (gpus == 0) {
    std::printf("allreduce_nccl_bench: no GPU found; nothing to measure\n");
    benchmark::Shutdown();
    return 0;
  }
  int nccl_version = 0;
  ncclGetVersion(&nccl_version);
  benchmark::AddCustomContext("gpus", std::to_string(gpus));
  benchmark::AddCustomContext("nccl_version", std::to_string(nccl_version));
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) benchmark::AddCustomContext("gpu0", prop.name);

  const std::int64_t sizes[] = {4,         64,       1 << 10,  4 << 10,  16 << 10,         64 << 10,
                                256 << 10, 1 << 20,  4 << 20,  16 << 20, std::int64_t{64} << 20, std::int64_t{256} << 20};
  for (int n = 1; n <= gpus; ++n) {
    const std::pair<const char*, void (*)(benchmark::State&)> families[] = {
        {"BM_AllReduce_Nccl", BM_AllReduce_Nccl},
        {"BM_AllReduce_NcclBare", BM_AllReduce_NcclBare},
        {"BM_AllReduce_NcclBareOutOfPlace", BM_AllReduce_NcclBareOutOfPlace}};
    for (const auto& [name, fn] : families) {
      for (std::int64_t bytes : sizes) {
        benchmark::RegisterBenchmark(name, fn)
            ->Args({bytes, n})
            ->UseManualTime()
            ->Iterations(g_settings.iters)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }

  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_strategies.clear();  // every strategy before its runtime
  g_runtime.reset();
  g_comms.clear();
  return 0;
}
