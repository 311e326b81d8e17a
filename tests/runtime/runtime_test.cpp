#include <doctest/doctest.h>

#include <cstdlib>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "../common/free_port.hpp"
#include "test_util.hpp"

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::message_of;

TEST_CASE("runtime options come from the TROUPE_* environment") {
  setenv("TROUPE_SPIN_US", "7", 1);
  setenv("TROUPE_SCHEDULER_THREADS", "3", 1);
  RuntimeOptions o = RuntimeOptions::from_environment();
  CHECK(o.spin_us == 7);
  CHECK(o.scheduler_threads == 3);
  setenv("TROUPE_SPIN_US", "fast", 1);
  std::string msg = message_of([] { RuntimeOptions::from_environment(); });
  CHECK(contains(msg, "TROUPE_SPIN_US=\"fast\""));
  CHECK_THROWS_AS(Runtime(), std::invalid_argument);
  unsetenv("TROUPE_SPIN_US");
  setenv("TROUPE_LOG_LEVEL", "loud", 1);
  CHECK(contains(message_of([] { RuntimeOptions::from_environment(); }),
                 "TROUPE_LOG_LEVEL=\"loud\" is not a log level (expected debug, info, warning, error or off)"));
  unsetenv("TROUPE_LOG_LEVEL");
  unsetenv("TROUPE_SCHEDULER_THREADS");
  Runtime rt(RuntimeOptions{1, 0});
  CHECK(rt.options().spin_us == 0);
  CHECK(rt.options().scheduler_threads == 1);
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});  // no spinning: every wait sleeps, results are the same
  auto r = s.run([] { return get_replica_context()->all_reduce(ReduceOp::sum, Tensor::scalar<int>(2)).item<int>(); });
  CHECK(r.values() == std::vector<int>{4, 4});
}

TEST_CASE("a runtime embeds into an application's own actor system") {
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  {
    Runtime rt(system);
    CHECK(&rt.system() == &system);
    MirroredStrategy s(rt, {"CPU:0", "CPU:1", "CPU:2"});
    auto r = s.run([] { return get_replica_context()->replica_id_in_sync_group(); });
    CHECK(r.values() == std::vector<int>{0, 1, 2});
  }
}

TEST_CASE("MultiWorkerMirroredStrategy in an actor system without the middleman says what to load") {
  caf::actor_system_config cfg;  // no cfg.load<caf::io::middleman>()
  caf::actor_system system{cfg};
  Runtime rt(system);
  auto resolver = std::make_shared<SimpleClusterResolver>(
      ClusterSpec(ClusterSpec::JobMap{{"worker", {"127.0.0.1:1"}}}), "worker", 0);  // refused before any network
  CHECK_THROWS_AS(MultiWorkerMirroredStrategy(rt, {}, resolver), std::invalid_argument);
  std::string msg = message_of([&] { MultiWorkerMirroredStrategy(rt, {}, resolver); });
  CHECK(contains(msg, "MultiWorkerMirroredStrategy: the actor system has no middleman"));
  CHECK(contains(msg, "troupe::Runtime::configure(config)"));
  // Single-process strategies need no middleman.
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  CHECK(s.num_replicas_in_sync() == 2);
}

TEST_CASE("a runtime embedded in a system prepared by Runtime::configure runs a multi-worker strategy") {
  caf::actor_system_config cfg;
  Runtime::configure(cfg);
  caf::actor_system system{cfg};
  {
    Runtime rt(system);
    const std::string address = "127.0.0.1:" + std::to_string(troupe::testing::free_port());
    auto resolver = std::make_shared<SimpleClusterResolver>(ClusterSpec(ClusterSpec::JobMap{{"worker", {address}}}),
                                                            "worker", 0);
    MultiWorkerMirroredStrategy s(rt, {}, resolver);
    CHECK(s.num_replicas_in_sync() == 1);
    auto r = s.run([] { return get_replica_context()->all_reduce(ReduceOp::sum, Tensor::scalar<int>(5)); });
    CHECK(s.reduce(ReduceOp::sum, r, std::nullopt).item<int>() == 5);
  }
}

TEST_CASE("a multi-worker strategy in an actor system that was not prepared says what to call") {
  caf::actor_system_config cfg;
  cfg.load<caf::io::middleman>();
  caf::actor_system system{cfg};
  Runtime rt(system);
  const std::string address = "127.0.0.1:" + std::to_string(troupe::testing::free_port());
  auto resolver = std::make_shared<SimpleClusterResolver>(ClusterSpec(ClusterSpec::JobMap{{"worker", {address}}}),
                                                          "worker", 0);
  const std::string error = troupe::testing::message_of([&] { MultiWorkerMirroredStrategy s(rt, {}, resolver); });
  CHECK(troupe::testing::contains(error, "call troupe::Runtime::configure(config) on its config before constructing it"));
}

namespace {

std::vector<std::string> default_devices(Runtime& rt) {
  MirroredStrategy s(rt);
  std::vector<std::string> out;
  for (const Device& d : s.extended().worker_devices()) out.push_back(d.to_string());
  return out;
}

}  // namespace

TEST_CASE("gpu_count is the machine's GPUs, none under TROUPE_FORCE_CPU=1, and the default devices follow it") {
  Runtime rt;
  {
    troupe::testing::scoped_env force("TROUPE_FORCE_CPU", "1");
    CHECK(Runtime::gpu_count() == 0);
    CHECK(default_devices(rt) == std::vector<std::string>{"CPU:0"});
  }
  troupe::testing::scoped_env unforced("TROUPE_FORCE_CPU", std::nullopt);
  const int n = Runtime::gpu_count();
  const auto expected = troupe::testing::expected_gpu_count();
  if (expected) {
    CHECK(n == *expected);
  } else {
    MESSAGE("gpu_count() = " << n << " not compared: CUDA_VISIBLE_DEVICES narrows the /dev/nvidia* GPUs");
  }
  std::vector<std::string> want;
  for (int g = 0; g < n; ++g) want.push_back("GPU:" + std::to_string(g));
  if (n == 0) want.push_back("CPU:0");
  CHECK(default_devices(rt) == want);
}
