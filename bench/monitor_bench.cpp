// The metrics stream's cost per training step, side by side.
//
// BM_TrainStep/<replicas>/<watched>: one step of the mlp_classifier model (32 -> 128 relu -> 128
// relu -> 4, Adam, global batch 256, cached input) through strategy.run and the loss reduce, as
// Model::fit runs it; watched=1 adds what a Monitor adds: the per-step timings recorded in the
// strategy (replica spans, the all-reduce, the input wait), the replica losses, and the step
// boundary that copies one event per step into the metrics stream's ring, with the dashboard's
// server listening. Wall-clock time, and the CPU time of the whole process (every thread: the
// replicas, the stream, the server), which a loaded machine blurs less.
//
// BM_StepBoundary/<replicas>: Monitor::on_step_end (with record_replica_losses) alone after a
// trivial step, in CPU time of the calling thread: the fixed cost the monitor adds to every step,
// which a loaded machine does not blur. Divided by a real step's time it is the throughput cost.

#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "troupe/troupe.hpp"

namespace {

using namespace troupe;
namespace td = troupe::distribute;

struct Setup {
  std::unique_ptr<td::MirroredStrategy> strategy;
  std::unique_ptr<nn::Model> model;
  std::vector<td::PerReplica<data::Element>> batches;
  std::unique_ptr<Monitor> monitor;
  std::ostringstream log;
};

std::unique_ptr<Runtime> g_runtime;
std::map<int, std::unique_ptr<Setup>> g_setups;

Setup& setup_for(int replicas) {
  auto& slot = g_setups[replicas];
  if (slot) return *slot;
  if (!g_runtime) g_runtime = std::make_unique<Runtime>();
  slot = std::make_unique<Setup>();
  std::vector<std::string> devices;
  for (int r = 0; r < replicas; ++r) devices.push_back("CPU:" + std::to_string(r));
  slot->strategy = std::make_unique<td::MirroredStrategy>(*g_runtime, devices);
  auto scope = slot->strategy->scope();
  slot->model = std::make_unique<nn::Model>(nn::Sequential({nn::Dense(32, 128, nn::Activation::relu, 1),
                                                            nn::Dense(128, 128, nn::Activation::relu, 2),
                                                            nn::Dense(128, 4, nn::Activation::none, 3)}));
  slot->model->compile(std::make_shared<nn::Adam>(0.003f), nn::Loss::sparse_categorical_crossentropy());
  nn::BlobOptions blobs;
  blobs.samples = 4096;
  const nn::ClassificationData d = nn::make_blobs(blobs);
  auto dist = slot->strategy->experimental_distribute_dataset(
      data::Dataset::from_tensor_slices({d.features, d.labels}).batch(256, true));
  for (const auto& b : dist) slot->batches.push_back(b);
  return *slot;
}

// Watched: a Monitor attached (its dashboard listening); unwatched: none, so no timing is recorded.
void watch(Setup& s, bool on) {
  if (!on) {
    s.monitor.reset();
    return;
  }
  if (s.monitor) return;
  MonitorOptions o;
  o.dashboard_port = 0;
  o.global_batch_size = 256;
  o.log = &s.log;
  s.monitor = std::make_unique<Monitor>(*s.strategy, s.model->optimizer().get(), o);
}

void BM_TrainStep(benchmark::State& state) {
  const int replicas = static_cast<int>(state.range(0));
  const bool watched = state.range(1) != 0;
  Setup& s = setup_for(replicas);
  watch(s, watched);
  auto scope = s.strategy->scope();
  td::Strategy& strategy = *s.strategy;
  nn::Model& model = *s.model;
  std::int64_t step = 0;
  std::size_t i = 0;
  for (auto _ : state) {
    const auto& batch = s.batches[i++ % s.batches.size()];
    auto losses = strategy.run([&](const data::Element& e) { return model.train_step(e, 256); }, batch);
    const double loss = strategy.reduce(td::ReduceOp::sum, losses, std::nullopt).item<float>();
    if (watched) {
      s.monitor->record_replica_losses(losses.values());
      if (s.monitor->on_step_end(++step, loss) != StepDecision::proceed) state.SkipWithError("stopped");
    }
  }
  state.SetItemsProcessed(state.iterations() * 256);
}

void BM_StepBoundary(benchmark::State& state) {
  const int replicas = static_cast<int>(state.range(0));
  Setup& s = setup_for(replicas);
  watch(s, true);
  auto scope = s.strategy->scope();
  auto losses = s.strategy->run([] { return Tensor::scalar<float>(0.25f); });
  std::int64_t step = 1000000;
  for (auto _ : state) {
    s.monitor->record_replica_losses(losses.values());
    if (s.monitor->on_step_end(++step, 0.5) != StepDecision::proceed) state.SkipWithError("stopped");
  }
}

// Run with --benchmark_repetitions=N --benchmark_enable_random_interleaving=true so that the
// watched and unwatched runs alternate and a noisy neighbour slows both alike.
BENCHMARK(BM_TrainStep)->ArgsProduct({{1, 2}, {0, 1}})->UseRealTime()->MeasureProcessCPUTime()->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(BM_StepBoundary)->Arg(1)->Arg(2)->Unit(benchmark::kNanosecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_setups.clear();
  g_runtime.reset();
  return 0;
}
