#include <doctest/doctest.h>

#include <cstring>

#include "../common/temp_dir.hpp"
#include "test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::cpus;
using troupe::testing::message_of;

TEST_CASE("CentralStorageStrategy: variables live once on the parameter device, on_read ones per replica") {
  Runtime rt;
  CentralStorageStrategy s(rt, cpus(4));
  CHECK(s.num_replicas_in_sync() == 4);
  CHECK(s.parameter_device().to_string() == "CPU:0");
  auto scope = s.scope();
  Variable w(Tensor::from_vector<float>({1.0f, 2.0f}), "w");
  REQUIRE(w.components().size() == 1);
  CHECK(w.devices()[0].to_string() == "CPU:0");
  CHECK(s.experimental_local_results(w).size() == 1);
  Variable metric(Tensor::scalar<float>(0.0f), "metric", VariableSynchronization::on_read, VariableAggregation::sum);
  CHECK(metric.components().size() == 4);
  // Every replica reads the one value.
  auto seen = s.run([&] { return w.value(); });
  for (const Tensor& t : s.experimental_local_results(seen)) CHECK(t.to_vector<float>() == std::vector<float>{1.0f, 2.0f});
  // A single compute device is also the parameter device (TensorFlow's default).
  CentralStorageStrategy one(rt, {"CPU:1"});
  CHECK(one.parameter_device().to_string() == "CPU:1");
}

TEST_CASE("CentralStorageStrategy: a bad device is refused, naming it") {
  Runtime rt;
  CHECK(contains(message_of([&] { CentralStorageStrategy s(rt, cpus(2), "GPU:99"); }), "parameter device GPU:99"));
  CHECK(contains(message_of([&] { CentralStorageStrategy s(rt, cpus(2), "TPU:0"); }), "CentralStorageStrategy"));
  CHECK(contains(message_of([&] { CentralStorageStrategy s(rt, {"CPU:0", "CPU:0"}); }), "listed twice"));
}

TEST_CASE("CentralStorageStrategy: replica-context writes are aggregated and applied once") {
  Runtime rt;
  CentralStorageStrategy s(rt, cpus(4));
  auto scope = s.scope();
  Variable sum(Tensor::scalar<float>(0.0f), "sum", VariableSynchronization::on_write, VariableAggregation::sum);
  Variable mean(Tensor::scalar<float>(0.0f), "mean", VariableSynchronization::on_write, VariableAggregation::mean);
  Variable first(Tensor::scalar<float>(0.0f), "first", VariableSynchronization::on_write,
                 VariableAggregation::only_first_replica);
  Variable local(Tensor::scalar<float>(0.0f), "local");
  for (int step = 0; step < 100; ++step) {
    s.run([&] {
      const float id = static_cast<float>(get_replica_context()->replica_id_in_sync_group());
      sum.assign_add(Tensor::scalar<float>(id));      // +6 per step
      mean.assign(Tensor::scalar<float>(id * 2));     // mean of 0, 2, 4, 6
      first.assign(Tensor::scalar<float>(id + 7));    // replica 0's
      // Every replica reads the value and writes value + 1: one increment per step, not four,
      // and no replica reads another's write before its own read.
      local.assign_local(local.value() + Scalar(1.0));
      return local.value();
    });
  }
  CHECK(sum.value().item<float>() == 600.0f);
  CHECK(mean.value().item<float>() == 3.0f);
  CHECK(first.value().item<float>() == 7.0f);
  CHECK(local.value().item<float>() == 100.0f);
  // Without an aggregation a replica-context write is refused, as under MirroredStrategy.
  CHECK(contains(message_of([&] { s.run([&] { local.assign_add(Tensor::scalar<float>(1.0f)); }); }),
                 "needs an aggregation"));
}

namespace {

// Trains Dense(6,8,relu) -> Dense(8,3) with SGD momentum or Adam on 4 CPU replicas under `strategy` for
// 12 steps of a fixed dataset and returns every trainable variable's value, then the losses.
template <class S>
std::pair<std::vector<Tensor>, std::vector<double>> train(Runtime& rt, bool adam) {
  S strategy(rt, cpus(4));
  auto scope = strategy.scope();
  nn::Model model(nn::Sequential({nn::Dense(6, 8, nn::Activation::relu, 3), nn::Dense(8, 3, nn::Activation::none, 4)}));
  std::shared_ptr<nn::Optimizer> optimizer;
  if (adam) {
    optimizer = std::make_shared<nn::Adam>(0.01f);
  } else {
    optimizer = std::make_shared<nn::SGD>(0.05f, 0.9f);
  }
  model.compile(optimizer, nn::Loss::sparse_categorical_crossentropy());
  std::vector<float> x(48 * 6);
  std::vector<std::int64_t> y(48);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 11) / 11.0f - 0.4f;
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int64_t>((i * 7) % 3);
  auto ds = data::Dataset::from_tensor_slices({Tensor::from_vector(x, {48, 6}), Tensor::from_vector(y, {48})}).batch(16);
  nn::FitOptions quiet;
  quiet.verbose = 0;
  const nn::History history = model.fit(ds, 4, -1, quiet);
  std::vector<Tensor> values;
  for (const Variable& v : model.trainable_variables()) values.push_back(v.value());
  return {values, history.loss};
}

}  // namespace

TEST_CASE("CentralStorageStrategy trains to the same bits as MirroredStrategy, with SGD momentum and Adam") {
  Runtime rt;
  for (const bool adam : {false, true}) {
    CAPTURE(adam);
    const auto mirrored = train<MirroredStrategy>(rt, adam);
    const auto central = train<CentralStorageStrategy>(rt, adam);
    REQUIRE(mirrored.first.size() == central.first.size());
    REQUIRE(mirrored.first.size() == 4);
    for (std::size_t i = 0; i < mirrored.first.size(); ++i) {
      const Tensor& a = mirrored.first[i];
      const Tensor& b = central.first[i];
      REQUIRE(a.nbytes() == b.nbytes());
      CHECK(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
    }
    CHECK(mirrored.second == central.second);
    CHECK(central.second.back() < central.second.front());  // it learnt something
  }
}

TEST_CASE("CentralStorageStrategy: a checkpoint saves and restores its variables and optimizer slots") {
  Runtime rt;
  CentralStorageStrategy s(rt, cpus(3));
  troupe::testing::temp_dir dir("central-ckpt");
  auto scope = s.scope();
  nn::Model model(nn::Sequential({nn::Dense(4, 2, nn::Activation::none, 5)}));
  model.compile(std::make_shared<nn::SGD>(0.1f, 0.5f), nn::Loss::mean_squared_error());
  auto ds = data::Dataset::from_tensor_slices({Tensor::full({6, 4}, 0.5, DType::f32), Tensor::full({6, 2}, 1.0, DType::f32)})
                .batch(3);
  nn::FitOptions quiet;
  quiet.verbose = 0;
  model.fit(ds, 2, -1, quiet);
  Checkpoint ckpt(model.variables());
  const std::string path = ckpt.save((dir.path / "central").string());
  std::map<std::string, std::vector<float>> saved;
  for (const auto& [name, v] : ckpt.variables()) {
    CHECK(v.components().size() == 1);  // every one lives once, on the CPU
    if (v.dtype() == DType::f32) saved[name] = v.value().to_vector<float>();
  }
  for (auto& [name, v] : ckpt.variables()) {
    Variable copy = v;
    copy.assign(Tensor::zeros(v.shape(), v.dtype()));
  }
  ckpt.restore(path);
  for (const auto& [name, v] : ckpt.variables()) {
    if (v.dtype() == DType::f32) CHECK(v.value().to_vector<float>() == saved[name]);
  }
  CHECK(model.optimizer()->iterations().value().item<std::int64_t>() == 4);
}

}  // namespace TROUPE_TEST_FILE
