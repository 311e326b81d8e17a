#include <doctest/doctest.h>

#include <cstdlib>

#include "caf/all.hpp"
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
  CHECK(contains(msg, "config.load<caf::io::middleman>()"));
  // Single-process strategies need no middleman.
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  CHECK(s.num_replicas_in_sync() == 2);
}

TEST_CASE("TROUPE_FORCE_CPU hides GPUs") {
  setenv("TROUPE_FORCE_CPU", "1", 1);
  CHECK(Runtime::gpu_count() == 0);
  unsetenv("TROUPE_FORCE_CPU");
  CHECK(Runtime::gpu_count() >= 0);
}
