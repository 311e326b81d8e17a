// What an elastic cluster's in-memory commit costs at a step boundary (not asserted anywhere):
// BM_ElasticCommit/<model> copies every variable of a compiled model (its weights, Adam's two
// slots per weight and the iteration count) into the commit's reused host buffers, and a random
// engine; BM_ElasticRestore/<model> assigns them back (a change of membership only).
//   model 0: multi_worker_trainer's MLP (32-64-64-4: 6.5 K weights, 78 KB with Adam's slots)
//   model 1: a 784-1024-1024-10 MLP (1.86 M weights, 22.4 MB with Adam's slots)
// bytes_per_second is the commit's bytes over its time; compare with a step of the same model.

#include <benchmark/benchmark.h>

#include <memory>
#include <random>

#include "distribute/strategies/elastic_commit.hpp"
#include "troupe/troupe.hpp"

namespace {

using namespace troupe;

std::unique_ptr<nn::Model> make_model(int which) {
  auto model = which == 0 ? std::make_unique<nn::Model>(nn::Sequential({nn::Dense(32, 64, nn::Activation::relu, 1),
                                                                         nn::Dense(64, 64, nn::Activation::relu, 2),
                                                                         nn::Dense(64, 4, nn::Activation::none, 3)}))
                          : std::make_unique<nn::Model>(nn::Sequential({nn::Dense(784, 1024, nn::Activation::relu, 1),
                                                                         nn::Dense(1024, 1024, nn::Activation::relu, 2),
                                                                         nn::Dense(1024, 10, nn::Activation::none, 3)}));
  model->compile(std::make_shared<nn::Adam>(0.001f), nn::Loss::sparse_categorical_crossentropy());
  return model;
}

void BM_ElasticCommit(benchmark::State& state) {
  const auto model = make_model(static_cast<int>(state.range(0)));
  std::mt19937_64 engine(7);
  distribute::detail::CommittedState committed;
  committed.track(model->variables());
  committed.track_rng("shuffle", engine);
  distribute::detail::CommitPosition at;
  committed.commit(at);  // the first commit makes the buffers
  for (auto _ : state) {
    ++at.step;
    committed.commit(at);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * committed.bytes()));
  state.counters["commit_bytes"] = static_cast<double>(committed.bytes());
}
BENCHMARK(BM_ElasticCommit)->Arg(0)->Arg(1)->UseRealTime();

void BM_ElasticRestore(benchmark::State& state) {
  const auto model = make_model(static_cast<int>(state.range(0)));
  distribute::detail::CommittedState committed;
  committed.track(model->variables());
  committed.commit({});
  for (auto _ : state) benchmark::DoNotOptimize(committed.restore(0));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * committed.bytes()));
}
BENCHMARK(BM_ElasticRestore)->Arg(0)->Arg(1)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
