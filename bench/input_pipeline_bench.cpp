// The input pipeline: its throughput, and how much of a training step waits for input.
//
// BM_InputThroughput/<replicas>: batches per second that a distributed dataset delivers when the
//   consumer does nothing else (a [64, 256] float32 global batch split over the replicas).
// BM_InputWait/<prefetch>/<produce_us>/<compute_us>: a synthetic training loop on one CPU
//   replica: producing a batch busy-waits produce_us on the input pipeline's thread, each step's
//   replica function busy-waits compute_us. Counter wait_fraction = time get_next waited / total
//   loop time. With prefetch on (> 0) and compute longer than production, the wait should stay
//   under 5 % of the step; with prefetch 0 every step also pays the production.

#include <benchmark/benchmark.h>

#include <chrono>

#include <troupe/troupe.hpp>

namespace td = troupe::distribute;
using troupe::data::Dataset;
using troupe::data::Element;

namespace {

troupe::Runtime& runtime() {
  static troupe::Runtime rt;
  return rt;
}

void busy_wait(std::chrono::microseconds d) {
  const auto end = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < end) {
  }
}

std::vector<std::string> cpus(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back("CPU:" + std::to_string(i));
  return out;
}

void BM_InputThroughput(benchmark::State& state) {
  const int replicas = static_cast<int>(state.range(0));
  td::MirroredStrategy s(runtime(), cpus(replicas));
  const troupe::Tensor batch = troupe::Tensor::zeros({64, 256});
  auto dist = s.experimental_distribute_dataset(Dataset::from_tensors({batch}).repeat(-1));
  auto it = dist.make_iterator();
  std::int64_t batches = 0;
  for (auto _ : state) {
    auto x = it.get_next();
    benchmark::DoNotOptimize(x);
    ++batches;
  }
  state.counters["batches_per_s"] = benchmark::Counter(static_cast<double>(batches), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_InputThroughput)->Arg(1)->Arg(2)->Arg(4)->UseRealTime();

void BM_InputWait(benchmark::State& state) {
  const auto prefetch = state.range(0);
  const std::chrono::microseconds produce_us(state.range(1));
  const std::chrono::microseconds compute_us(state.range(2));
  td::MirroredStrategy s(runtime(), {"CPU:0"});
  td::InputOptions options;
  options.experimental_prefetch_to_device = prefetch;
  const troupe::Tensor batch = troupe::Tensor::zeros({32, 16});
  auto ds = Dataset::from_tensors({batch}).repeat(-1).map([produce_us](const Element& e) {
    busy_wait(produce_us);
    return e;
  });
  auto it = s.experimental_distribute_dataset(ds, options).make_iterator();
  it.get_next();  // start-up is not a step
  const auto waited_before = it.time_waiting();
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    auto x = it.get_next();
    s.run([compute_us](const Element&) { busy_wait(compute_us); }, x);
  }
  const auto total = std::chrono::steady_clock::now() - start;
  const double waited = std::chrono::duration<double>(it.time_waiting() - waited_before).count();
  state.counters["wait_fraction"] = waited / std::chrono::duration<double>(total).count();
}
BENCHMARK(BM_InputWait)
    ->Args({0, 200, 400})
    ->Args({2, 200, 400})
    ->Args({0, 500, 1000})
    ->Args({2, 500, 1000})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
