// BM_StrategyRun/<replicas>: the fixed cost of one Strategy::run step of a MirroredStrategy over
// CPU:0..CPU:n-1 whose replica function does nothing but return an int: the coordinator sending
// the step to every replica actor, each running the function on its own thread, and the results
// gathered back into a PerReplica<int>. Wall-clock time (UseRealTime), since the work runs on
// the replicas' threads.

#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "troupe/troupe.hpp"

namespace {

namespace td = troupe::distribute;

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

void BM_StrategyRun(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  td::MirroredStrategy& strategy = strategy_for(n);
  auto fn = [] { return td::get_replica_context()->replica_id_in_sync_group(); };

  // Once, outside the timed loop: every replica ran, on its own context.
  const td::PerReplica<int> check = strategy.run(fn);
  for (int r = 0; r < n; ++r) {
    if (check.num_replicas() != n || check[r] != r) {
      state.SkipWithError(("strategy.run returned " + check.to_string()).c_str());
      return;
    }
  }

  for (auto _ : state) {
    td::PerReplica<int> out = strategy.run(fn);
    benchmark::DoNotOptimize(out);
  }
}

BENCHMARK(BM_StrategyRun)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->UseRealTime()->Unit(benchmark::kMicrosecond);

// BM_StrategyRunAllReduce/<replicas>: a step whose replicas all-reduce one float32 scalar: the
// smallest step that records collectives, so the flight recorder's cost is the largest share of
// it (bench/flight_recorder_overhead.sh runs it with TROUPE_FLIGHT_RECORDER_ENTRIES=0 and unset).
void BM_StrategyRunAllReduce(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  td::MirroredStrategy& strategy = strategy_for(n);
  const troupe::Tensor one = troupe::Tensor::scalar<float>(1.0f);
  auto fn = [&one] { return td::get_replica_context()->all_reduce(td::ReduceOp::sum, one); };
  const td::PerReplica<troupe::Tensor> check = strategy.run(fn);
  if (check[0].item<float>() != static_cast<float>(n)) {
    state.SkipWithError("the all-reduce returned a wrong sum");
    return;
  }
  for (auto _ : state) {
    td::PerReplica<troupe::Tensor> out = strategy.run(fn);
    benchmark::DoNotOptimize(out);
  }
}

BENCHMARK(BM_StrategyRunAllReduce)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_strategies.clear();  // every strategy before its runtime
  g_runtime.reset();
  return 0;
}
