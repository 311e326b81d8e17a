#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::cpus;
using troupe::testing::message_of;

TEST_CASE("MirroredStrategy runs one replica per device, each on its own thread") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(4));
  CHECK(s.num_replicas_in_sync() == 4);
  CHECK(s.extended().worker_devices().size() == 4);
  CHECK(s.extended().worker_devices()[3].to_string() == "CPU:3");
  CHECK(s.extended().cross_device_ops().name() == "ReductionToOneDevice");
  CHECK(s.cluster_resolver() == nullptr);
  std::mutex m;
  std::set<std::thread::id> threads;
  auto ids = s.run([&] {
    std::lock_guard<std::mutex> lock(m);
    threads.insert(std::this_thread::get_id());
    auto* ctx = get_replica_context();
    REQUIRE(ctx != nullptr);
    return ctx->replica_id_in_sync_group() * 10 + ctx->num_replicas_in_sync();
  });
  CHECK(threads.size() == 4);
  CHECK(threads.count(std::this_thread::get_id()) == 0);
  CHECK(ids.values() == std::vector<int>{4, 14, 24, 34});
}

TEST_CASE("run passes PerReplica components and plain arguments, and supports void functions") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(3));
  auto per = s.experimental_distribute_values_from_function(
      [](const ValueContext& c) { return c.replica_id_in_sync_group; });
  auto r = s.run([](int a, int b, const std::string& tag) { return tag + std::to_string(a + b); }, per, 10,
                 std::string("r"));
  CHECK(r.values() == std::vector<std::string>{"r10", "r11", "r12"});
  std::atomic<int> calls{0};
  s.run([&] { ++calls; });
  CHECK(calls == 3);
}

TEST_CASE("the default device list is CPU:0 on a machine without GPUs") {
  troupe::testing::scoped_env no_gpus("TROUPE_FORCE_CPU", "1");  // hides any GPU this machine has
  Runtime rt;
  MirroredStrategy s(rt);
  CHECK(s.num_replicas_in_sync() == 1);
  CHECK(s.extended().worker_devices()[0].to_string() == "CPU:0");
}

TEST_CASE("OneDeviceStrategy runs a single replica") {
  Runtime rt;
  OneDeviceStrategy s(rt, "CPU:0");
  CHECK(s.num_replicas_in_sync() == 1);
  auto r = s.run([] { return get_replica_context()->all_reduce(ReduceOp::sum, Tensor::scalar<int>(5)); });
  CHECK(s.experimental_local_results(r)[0].item<int>() == 5);
  CHECK(s.reduce(ReduceOp::sum, Tensor::scalar<int>(5), std::nullopt).item<int>() == 5);
  CHECK_THROWS_AS(OneDeviceStrategy(rt, "GPU:0"), std::invalid_argument);
}

TEST_CASE("scope, get_strategy, has_strategy and the replica context in each context") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  // No strategy: the default one, with a default replica context.
  CHECK_FALSE(has_strategy());
  CHECK_FALSE(in_cross_replica_context());
  REQUIRE(get_replica_context() != nullptr);
  CHECK(get_replica_context()->num_replicas_in_sync() == 1);
  CHECK(get_strategy().num_replicas_in_sync() == 1);
  CHECK(get_replica_context()->all_reduce(ReduceOp::sum, Tensor::scalar<int>(3)).item<int>() == 3);
  {
    auto scope = s.scope();
    CHECK(has_strategy());
    CHECK(&get_strategy() == &s);
    CHECK(in_cross_replica_context());
    CHECK(get_replica_context() == nullptr);
    auto inside = s.run([&] {
      return std::make_tuple(&get_strategy() == &s, has_strategy(), in_cross_replica_context(),
                             get_replica_context() != nullptr);
    });
    for (const auto& t : inside.values()) CHECK(t == std::make_tuple(true, true, false, true));
  }
  CHECK_FALSE(has_strategy());
  CHECK_FALSE(in_cross_replica_context());
  // run without a scope still installs the replica context.
  auto ids = s.run([&] { return static_cast<int>(&get_strategy() == &s && has_strategy()); });
  CHECK(ids.values() == std::vector<int>{1, 1});
}

TEST_CASE("the default strategy runs on the calling thread") {
  Strategy& d = get_strategy();
  auto r = d.run([] { return std::this_thread::get_id(); });
  CHECK(r[0] == std::this_thread::get_id());
  CHECK(d.reduce(ReduceOp::sum, Tensor::scalar<int>(2), std::nullopt).item<int>() == 2);
}

TEST_CASE("reduce MEAN without an axis averages across replicas") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(4));
  auto v = s.experimental_distribute_values_from_function(
      [](const ValueContext& c) { return Tensor::from_vector<float>({float(c.replica_id_in_sync_group), 1.0f}); });
  CHECK(s.reduce(ReduceOp::mean, v, std::nullopt).to_vector<float>() == std::vector<float>{1.5f, 1.0f});
  CHECK(s.reduce("mean", v, 0).item<float>() == doctest::Approx((0 + 1 + 2 + 3 + 4) / 8.0));
}

TEST_CASE("reduce of a plain value follows TensorFlow") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  CHECK(s.reduce(ReduceOp::mean, Tensor::scalar<float>(4.0f), std::nullopt).item<float>() == 4.0f);
  CHECK(s.reduce(ReduceOp::mean, Tensor::from_vector<float>({1, 3}), 0).item<float>() == 2.0f);
  CHECK(contains(message_of([&] { s.reduce(ReduceOp::sum, Tensor::scalar<float>(4.0f), std::nullopt); }),
                 "cannot be summed over 2 replicas"));
}

TEST_CASE("reduce and gather reject bad ops, axes and component counts") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto v = s.experimental_distribute_values_from_function([](const ValueContext&) { return Tensor::zeros({2, 3}); });
  CHECK_THROWS_AS(s.reduce("MAX", v, std::nullopt), std::invalid_argument);
  CHECK(contains(message_of([&] { s.reduce("MAX", v, std::nullopt); }), "\"MAX\""));
  CHECK(contains(message_of([&] { s.gather(v, 2); }), "gather: axis 2 out of range for rank-2 tensor (expected 0..1)"));
  CHECK(contains(message_of([&] { s.reduce(ReduceOp::sum, v, 5); }), "axis 5 out of range"));
  CHECK(s.gather(v, -1).shape() == Shape{2, 6});
  PerReplica<Tensor> three({Tensor::zeros({1}), Tensor::zeros({1}), Tensor::zeros({1})});
  CHECK(contains(message_of([&] { s.reduce(ReduceOp::sum, three, std::nullopt); }), "3 components"));
  auto uneven = s.experimental_distribute_values_from_function([](const ValueContext& c) {
    return Tensor::zeros({c.replica_id_in_sync_group + 1, 3});
  });
  CHECK(s.gather(uneven, 0).shape() == Shape{3, 3});
  CHECK(contains(message_of([&] { s.gather(uneven, 1); }), "replica 1 sent float32 tensor of shape [2, 3]"));
}

TEST_CASE("cross-device ops agree and NCCL is refused on CPU replicas") {
  Runtime rt;
  for (int n : {1, 2, 3, 5}) {
    CAPTURE(n);
    MirroredStrategy one(rt, cpus(n), std::make_shared<ReductionToOneDevice>());
    MirroredStrategy tree(rt, cpus(n), std::make_shared<HierarchicalCopyAllReduce>());
    CHECK(tree.extended().cross_device_ops().name() == "HierarchicalCopyAllReduce");
    auto make = [](const ValueContext& c) {
      return Tensor::from_vector<std::int64_t>({c.replica_id_in_sync_group, 7, -3});
    };
    auto a = one.experimental_distribute_values_from_function(make);
    auto b = tree.experimental_distribute_values_from_function(make);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean}) {
      CHECK(one.reduce(op, a, std::nullopt).equals(tree.reduce(op, b, std::nullopt)));
    }
    CHECK(one.reduce(ReduceOp::sum, a, std::nullopt).to_vector<std::int64_t>() ==
          std::vector<std::int64_t>{n * (n - 1) / 2, 7 * n, -3 * n});
  }
  std::string msg = message_of([&] { MirroredStrategy(rt, cpus(2), std::make_shared<NcclAllReduce>()); });
  CHECK(contains(msg, "NcclAllReduce"));
  CHECK(contains(msg, "GPU"));
  CHECK_THROWS_AS(HierarchicalCopyAllReduce(0), std::invalid_argument);
}

TEST_CASE("broadcast gives one copy of the value per destination device, with every op") {
  const Tensor value = Tensor::from_vector<std::int64_t>({3, -1, 4, 1, -5, 9}, {2, 3});
  const std::vector<Device> destinations{Device(Device::Type::cpu, 0), Device(Device::Type::cpu, 2),
                                         Device(Device::Type::cpu, 1)};
  std::vector<std::shared_ptr<CrossDeviceOps>> ops{std::make_shared<ReductionToOneDevice>(),
                                                   std::make_shared<HierarchicalCopyAllReduce>()};
  for (const auto& op : ops) {
    CAPTURE(op->name());
    const std::vector<Tensor> copies = op->broadcast(value, destinations);
    REQUIRE(copies.size() == 3);
    const char* names[] = {"CPU:0", "CPU:2", "CPU:1"};
    for (std::size_t i = 0; i < copies.size(); ++i) {
      CAPTURE(i);
      CHECK(copies[i].device().to_string() == names[i]);
      CHECK(copies[i].dtype() == DType::i64);
      CHECK(copies[i].shape() == Shape{2, 3});
      CHECK(copies[i].to_vector<std::int64_t>() == std::vector<std::int64_t>{3, -1, 4, 1, -5, 9});
    }
    CHECK(op->broadcast(value, {}).empty());
  }
}

TEST_CASE("asking for a GPU without one, or a device twice, is a clear error") {
  Runtime rt;
  {
    troupe::testing::scoped_env no_gpus("TROUPE_FORCE_CPU", "1");  // hides any GPU this machine has
    std::string msg = message_of([&] { MirroredStrategy(rt, {"GPU:0"}); });
    CHECK(contains(msg, "GPU:0"));
    CHECK(contains(msg, "no GPU"));
    CHECK_THROWS_AS(MirroredStrategy(rt, {"CPU:0", "GPU:0"}), std::invalid_argument);
  }
  // One past the machine's GPUs, whatever their number.
  const int n = Runtime::gpu_count();
  const std::string past = "GPU:" + std::to_string(n);
  std::string missing = message_of([&] { MirroredStrategy(rt, {past}); });
  CHECK(contains(missing, past));
  CHECK(contains(missing, n == 0 ? std::string("no GPU") : "only " + std::to_string(n) + " GPU(s) exist"));
  std::string dup = message_of([&] { MirroredStrategy(rt, {"CPU:0", "CPU:1", "/cpu:1"}); });
  CHECK(contains(dup, "CPU:1 is listed twice"));
  CHECK(contains(message_of([&] { MirroredStrategy(rt, {"XPU:0"}); }), "MirroredStrategy"));
  CHECK(contains(message_of([&] { MirroredStrategy(rt, {"/job:worker/task:1/device:CPU:0"}); }),
                 "MultiWorkerMirroredStrategy"));
  CHECK(MirroredStrategy(rt, {"/job:localhost/replica:0/task:0/device:CPU:0"}).num_replicas_in_sync() == 1);
}

TEST_CASE("run from a replica function of the same strategy is refused, not a deadlock") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  std::string msg = message_of([&] { s.run([&] { s.run([] {}); }); });
  CHECK(contains(msg, "called from inside a replica function"));
}

TEST_CASE("many steps in a row keep working") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(4));
  for (int step = 0; step < 500; ++step) {
    auto r = s.run([step] {
      return get_replica_context()->all_reduce(ReduceOp::sum, Tensor::scalar<int>(step)).item<int>();
    });
    REQUIRE(r.values() == std::vector<int>(4, 4 * step));
  }
}

TEST_CASE("MultiWorkerMirroredStrategy refuses a compression outside the enum, naming it, before any rendezvous") {
  Runtime rt;
  auto resolver = std::make_shared<SimpleClusterResolver>(ClusterSpec(ClusterSpec::JobMap{{"worker", {"127.0.0.1:1"}}}), "worker", 0);
  CommunicationOptions bad;
  bad.compression = static_cast<Compression>(7);
  const auto start = std::chrono::steady_clock::now();
  std::string msg = message_of([&] { MultiWorkerMirroredStrategy(rt, bad, resolver); });
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK(msg == "MultiWorkerMirroredStrategy: CommunicationOptions::compression 7 is not a Compression (expected none, fp16 or bf16)");
  CHECK(std::string(compression_name(Compression::fp16)) == "fp16");
  CHECK(std::string(compression_name(Compression::bf16)) == "bf16");
  CHECK(std::string(compression_name(Compression::none)) == "none");
}

TEST_CASE("MultiWorkerMirroredStrategy refuses NCCL without GPUs, saying why, before any rendezvous") {
  troupe::testing::scoped_env no_gpus("TROUPE_FORCE_CPU", "1");  // hides any GPU this machine has
  Runtime rt;
  auto resolver = std::make_shared<SimpleClusterResolver>(ClusterSpec(ClusterSpec::JobMap{{"worker", {"127.0.0.1:1"}}}), "worker", 0);
  CommunicationOptions nccl;
  nccl.implementation = CommunicationImplementation::nccl;
  const auto start = std::chrono::steady_clock::now();
  std::string msg = message_of([&] { MultiWorkerMirroredStrategy(rt, nccl, resolver); });
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK(contains(msg, "CommunicationImplementation::NCCL needs GPUs and this machine has none"));
  CHECK(contains(msg, "use AUTO or RING"));
}

}  // namespace TROUPE_TEST_FILE
