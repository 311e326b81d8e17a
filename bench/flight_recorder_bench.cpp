// The flight recorder's own cost on the recording thread: BM_FlightRecord/<threads> is one
// collective recorded and ended (begin + end: two claims of a slot, the clock read twice, 13 words
// written), from 1, 2 or 4 threads at once into one ring of the default 2000 entries, so that
// the threads contend for the entry counter as replicas do.

#include <benchmark/benchmark.h>

#include <memory>

#include "flight_recorder.hpp"
#include "troupe/flight_recorder.hpp"

namespace {

using troupe::detail::flight_collective;
using troupe::detail::FlightRecorder;

FlightRecorder& recorder() {
  static FlightRecorder fr(2000, "");
  return fr;
}

void BM_FlightRecord(benchmark::State& state) {
  FlightRecorder& fr = recorder();
  const troupe::CallSiteLabel label("fit:train_step");
  flight_collective what;
  what.op = troupe::detail::flight_op::all_reduce;
  what.participants = 2;
  what.replica = state.thread_index();
  what.has_dtype = true;
  what.bytes = 4096;
  for (auto _ : state) {
    ++what.step;
    fr.end(fr.begin(what), true);
  }
}

BENCHMARK(BM_FlightRecord)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

// The dump of a full ring as JSON (off the step's path: failures, SIGUSR1, the dashboard).
void BM_FlightRecorderJson(benchmark::State& state) {
  FlightRecorder& fr = recorder();
  flight_collective what;
  for (int i = 0; i < 2000; ++i) fr.end(fr.begin(what), true);
  for (auto _ : state) benchmark::DoNotOptimize(fr.json("bench"));
}

BENCHMARK(BM_FlightRecorderJson)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
