#include <doctest/doctest.h>

#include <cstdlib>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "../common/free_port.hpp"
#include "test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

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
  CHECK(msg == "TROUPE_SPIN_US='fast' is not a number in 0..10000000");
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

TEST_CASE("the restart count comes from TROUPE_RESTART_COUNT, which troupe-launch sets") {
  unsetenv("TROUPE_RESTART_COUNT");
  CHECK(MultiWorkerOptions::from_environment().restart_count == 0);
  setenv("TROUPE_RESTART_COUNT", "3", 1);
  CHECK(MultiWorkerOptions::from_environment().restart_count == 3);
  setenv("TROUPE_RESTART_COUNT", "-1", 1);
  CHECK(message_of([] { MultiWorkerOptions::from_environment(); }) ==
        "TROUPE_RESTART_COUNT=-1 is outside 0..1000000 (a negative value is never valid)");
  unsetenv("TROUPE_RESTART_COUNT");
}

TEST_CASE("the stall inspector's bounds and the missed heartbeats come from the environment, each in its range") {
  using namespace std::chrono_literals;
  for (const char* name : {"TROUPE_STALL_WARNING_S", "TROUPE_STALL_SHUTDOWN_S", "TROUPE_MISSED_HEARTBEATS"}) {
    unsetenv(name);
  }
  auto o = MultiWorkerOptions::from_environment();
  CHECK(o.stall_warning == 60s);
  CHECK(o.stall_shutdown == 0s);
  CHECK(o.missed_heartbeats == 6);
  setenv("TROUPE_STALL_WARNING_S", "1", 1);
  setenv("TROUPE_STALL_SHUTDOWN_S", "30", 1);
  setenv("TROUPE_MISSED_HEARTBEATS", "40", 1);
  o = MultiWorkerOptions::from_environment();
  CHECK(o.stall_warning == 1s);
  CHECK(o.stall_shutdown == 30s);
  CHECK(o.missed_heartbeats == 40);
  setenv("TROUPE_STALL_WARNING_S", "0", 1);
  CHECK(message_of([] { MultiWorkerOptions::from_environment(); }) == "TROUPE_STALL_WARNING_S=0 is outside 1..604800");
  setenv("TROUPE_STALL_WARNING_S", "1", 1);
  setenv("TROUPE_STALL_SHUTDOWN_S", "soon", 1);
  CHECK(message_of([] { MultiWorkerOptions::from_environment(); }) ==
        "TROUPE_STALL_SHUTDOWN_S='soon' is not a number in 0..604800");
  setenv("TROUPE_STALL_SHUTDOWN_S", "0", 1);
  setenv("TROUPE_MISSED_HEARTBEATS", "1001", 1);
  CHECK(message_of([] { MultiWorkerOptions::from_environment(); }) == "TROUPE_MISSED_HEARTBEATS=1001 is outside 1..1000");
  for (const char* name : {"TROUPE_STALL_WARNING_S", "TROUPE_STALL_SHUTDOWN_S", "TROUPE_MISSED_HEARTBEATS"}) {
    unsetenv(name);
  }
}

TEST_CASE("the elastic settings come from TROUPE_ELASTIC, TROUPE_MIN_WORKERS, TROUPE_MAX_WORKERS and TROUPE_COMMIT_EVERY_STEPS") {
  const char* names[] = {"TROUPE_ELASTIC", "TROUPE_MIN_WORKERS", "TROUPE_MAX_WORKERS", "TROUPE_COMMIT_EVERY_STEPS"};
  for (const char* name : names) unsetenv(name);
  auto o = MultiWorkerOptions::from_environment();
  CHECK_FALSE(o.elastic);
  CHECK(o.min_workers == 1);
  CHECK(o.max_workers == 0);
  CHECK(o.commit_every_steps == 1);
  setenv("TROUPE_ELASTIC", "1", 1);
  setenv("TROUPE_MIN_WORKERS", "2", 1);
  setenv("TROUPE_MAX_WORKERS", "8", 1);
  setenv("TROUPE_COMMIT_EVERY_STEPS", "10", 1);
  o = MultiWorkerOptions::from_environment();
  CHECK(o.elastic);
  CHECK(o.min_workers == 2);
  CHECK(o.max_workers == 8);
  CHECK(o.commit_every_steps == 10);
  setenv("TROUPE_ELASTIC", "yes", 1);
  CHECK(message_of([] { MultiWorkerOptions::from_environment(); }) ==
        "TROUPE_ELASTIC=\"yes\" is not 0 or 1 (1 turns on elastic membership)");
  setenv("TROUPE_ELASTIC", "1", 1);
  setenv("TROUPE_MIN_WORKERS", "0", 1);
  CHECK(message_of([] { MultiWorkerOptions::from_environment(); }) == "TROUPE_MIN_WORKERS=0 is outside 1..65536");
  setenv("TROUPE_MIN_WORKERS", "3", 1);
  setenv("TROUPE_MAX_WORKERS", "2", 1);
  CHECK(message_of([] { MultiWorkerOptions::from_environment(); }) ==
        "TROUPE_MAX_WORKERS=2 is below TROUPE_MIN_WORKERS=3 (expected 0, or 3..65536)");
  setenv("TROUPE_MAX_WORKERS", "0", 1);
  setenv("TROUPE_COMMIT_EVERY_STEPS", "0", 1);
  CHECK(message_of([] { MultiWorkerOptions::from_environment(); }) ==
        "TROUPE_COMMIT_EVERY_STEPS=0 is outside 1..1000000");
  setenv("TROUPE_COMMIT_EVERY_STEPS", "many", 1);
  CHECK(message_of([] { MultiWorkerOptions::from_environment(); }) ==
        "TROUPE_COMMIT_EVERY_STEPS='many' is not a number in 1..1000000");
  for (const char* name : names) unsetenv(name);
}

TEST_CASE("elastic settings outside their range, or that the cluster cannot meet, are refused naming the setting") {
  Runtime rt(RuntimeOptions{1, 0});
  const std::string address = "127.0.0.1:" + std::to_string(troupe::testing::free_port());
  auto resolver =
      std::make_shared<SimpleClusterResolver>(ClusterSpec(ClusterSpec::JobMap{{"worker", {address}}}), "worker", 0);
  MultiWorkerOptions settings;
  settings.elastic = true;
  settings.min_workers = 0;
  CHECK(message_of([&] { MultiWorkerMirroredStrategy s(rt, {}, resolver, settings); }) ==
        "MultiWorkerOptions: min_workers is 0 (expected 1..65536)");
  settings.min_workers = 2;
  settings.max_workers = 1;
  CHECK(message_of([&] { MultiWorkerMirroredStrategy s(rt, {}, resolver, settings); }) ==
        "MultiWorkerOptions: max_workers is 1 (expected 0 for the cluster's size at start, or min_workers (2)..65536)");
  settings.max_workers = 0;
  settings.commit_every_steps = 0;
  CHECK(message_of([&] { MultiWorkerMirroredStrategy s(rt, {}, resolver, settings); }) ==
        "MultiWorkerOptions: commit_every_steps is 0 steps (expected 1..1000000)");
  settings.commit_every_steps = 1;
  // A one-worker cluster cannot keep two.
  CHECK(message_of([&] { MultiWorkerMirroredStrategy s(rt, {}, resolver, settings); }) ==
        "MultiWorkerMirroredStrategy: MultiWorkerOptions::min_workers (TROUPE_MIN_WORKERS) is 2 but the cluster has 1 "
        "worker(s) (expected 1..1)");
  settings.min_workers = 1;
  settings.max_workers = 4;
  MultiWorkerMirroredStrategy s(rt, {}, resolver, settings);
  CHECK(s.num_replicas_in_sync() == 1);
}

TEST_CASE("TROUPE_HEARTBEAT_MS sets the heartbeat of both cluster stacks, in one range") {
  using namespace std::chrono_literals;
  unsetenv("TROUPE_HEARTBEAT_MS");
  CHECK(MultiWorkerOptions::from_environment().heartbeat_interval == 500ms);
  CHECK(ClusterCoordinatorOptions::from_environment().heartbeat_interval == 500ms);
  CHECK(MultiWorkerOptions{}.missed_heartbeats == 6);
  CHECK(ClusterCoordinatorOptions{}.missed_heartbeats == 6);
  for (const auto& [text, expected] : {std::pair{"10", 10ms}, std::pair{"200", 200ms}, std::pair{"600000", 600000ms}}) {
    setenv("TROUPE_HEARTBEAT_MS", text, 1);
    CHECK(MultiWorkerOptions::from_environment().heartbeat_interval == expected);
    CHECK(ClusterCoordinatorOptions::from_environment().heartbeat_interval == expected);
  }
  const std::pair<const char*, const char*> refused[] = {
      {"9", "TROUPE_HEARTBEAT_MS=9 is outside 10..600000"},
      {"600001", "TROUPE_HEARTBEAT_MS=600001 is outside 10..600000"},
      {"-5", "TROUPE_HEARTBEAT_MS=-5 is outside 10..600000 (a negative value is never valid)"},
      {"fast", "TROUPE_HEARTBEAT_MS='fast' is not a number in 10..600000"},
      {"200ms", "TROUPE_HEARTBEAT_MS='200ms' is not a number in 10..600000"},
      {" 200", "TROUPE_HEARTBEAT_MS=' 200' is not a number in 10..600000"},
  };
  for (const auto& [value, message] : refused) {
    setenv("TROUPE_HEARTBEAT_MS", value, 1);
    CHECK(message_of([] { MultiWorkerOptions::from_environment(); }) == message);
    CHECK(message_of([] { ClusterCoordinatorOptions::from_environment(); }) == message);
  }
  unsetenv("TROUPE_HEARTBEAT_MS");
  // Both cluster stacks take the missed beats from the same variable, with the same range.
  setenv("TROUPE_MISSED_HEARTBEATS", "40", 1);
  CHECK(MultiWorkerOptions::from_environment().missed_heartbeats == 40);
  CHECK(ClusterCoordinatorOptions::from_environment().missed_heartbeats == 40);
  setenv("TROUPE_MISSED_HEARTBEATS", "0", 1);
  CHECK(message_of([] { ClusterCoordinatorOptions::from_environment(); }) ==
        "TROUPE_MISSED_HEARTBEATS=0 is outside 1..1000");
  unsetenv("TROUPE_MISSED_HEARTBEATS");
  CHECK(ClusterCoordinatorOptions::from_environment().missed_heartbeats == 6);
}

TEST_CASE("TROUPE_STALL_WARNING_S and TROUPE_STALL_SHUTDOWN_S set a ClusterCoordinator's stall bounds") {
  using namespace std::chrono_literals;
  unsetenv("TROUPE_STALL_WARNING_S");
  unsetenv("TROUPE_STALL_SHUTDOWN_S");
  CHECK(ClusterCoordinatorOptions::from_environment().stall_warning == 60000ms);
  CHECK(ClusterCoordinatorOptions::from_environment().stall_shutdown == 0ms);
  setenv("TROUPE_STALL_WARNING_S", "2", 1);
  setenv("TROUPE_STALL_SHUTDOWN_S", "30", 1);
  CHECK(ClusterCoordinatorOptions::from_environment().stall_warning == 2000ms);
  CHECK(ClusterCoordinatorOptions::from_environment().stall_shutdown == 30000ms);
  setenv("TROUPE_STALL_WARNING_S", "0", 1);
  CHECK(message_of([] { ClusterCoordinatorOptions::from_environment(); }) ==
        "TROUPE_STALL_WARNING_S=0 is outside 1..604800");
  unsetenv("TROUPE_STALL_WARNING_S");
  unsetenv("TROUPE_STALL_SHUTDOWN_S");
}

TEST_CASE("TROUPE_PS_DATA_PORT sets a ps task's data port, 0..65535") {
  unsetenv("TROUPE_PS_DATA_PORT");
  CHECK(ServerOptions::from_environment().data_port == 0);
  setenv("TROUPE_PS_DATA_PORT", "7070", 1);
  CHECK(ServerOptions::from_environment().data_port == 7070);
  setenv("TROUPE_PS_DATA_PORT", "65536", 1);
  CHECK(message_of([] { ServerOptions::from_environment(); }) == "TROUPE_PS_DATA_PORT=65536 is outside 0..65535");
  setenv("TROUPE_PS_DATA_PORT", "0x10", 1);
  CHECK(message_of([] { ServerOptions::from_environment(); }) == "TROUPE_PS_DATA_PORT='0x10' is not a number in 0..65535");
  unsetenv("TROUPE_PS_DATA_PORT");
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

TEST_CASE("TROUPE_FORCE_CPU other than 0 or 1 is refused naming the variable, by gpu_count and by a Runtime") {
  for (const char* value : {"yes", "true", "on", "2"}) {
    CAPTURE(value);
    troupe::testing::scoped_env env("TROUPE_FORCE_CPU", value);
    const std::string expected = std::string("TROUPE_FORCE_CPU=\"") + value + "\" is not 0 or 1 (1 hides GPUs from troupe)";
    CHECK_THROWS_WITH_AS(Runtime::gpu_count(), expected.c_str(), std::invalid_argument);
    CHECK_THROWS_WITH_AS(RuntimeOptions::from_environment(), expected.c_str(), std::invalid_argument);
    CHECK_THROWS_WITH_AS([] { Runtime rt; }(), expected.c_str(), std::invalid_argument);
  }
  {
    troupe::testing::scoped_env unset_env("TROUPE_FORCE_CPU", std::nullopt);
    const int unforced = Runtime::gpu_count();
    troupe::testing::scoped_env zero("TROUPE_FORCE_CPU", "0");
    CHECK(Runtime::gpu_count() == unforced);  // 0 is "not forced", the same as unset
    CHECK_NOTHROW(RuntimeOptions::from_environment());
  }
}

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

TEST_CASE("a negative collective timeout is refused, naming the setting") {
  {
    troupe::testing::scoped_env env("TROUPE_COLLECTIVE_TIMEOUT_MS", "-5");
    CHECK(message_of([] { RuntimeOptions::from_environment(); }) ==
          "TROUPE_COLLECTIVE_TIMEOUT_MS=-5 is outside 0..86400000 (a negative value is never valid)");
    CHECK_THROWS_AS(Runtime(), std::invalid_argument);
  }
  RuntimeOptions o;
  o.collective_timeout_ms = -5;
  CHECK(message_of([&] { Runtime rt(o); }) ==
        "RuntimeOptions: collective_timeout_ms is -5 ms (expected -1 for TROUPE_COLLECTIVE_TIMEOUT_MS, 0 for no "
        "bound, or 1..86400000)");
  o = RuntimeOptions{};
  o.spin_us = -2;
  CHECK(message_of([&] { Runtime rt(o); }) ==
        "RuntimeOptions: spin_us is -2 us (expected -1 for TROUPE_SPIN_US, or 0..10000000)");
  o = RuntimeOptions{};
  o.scheduler_threads = -1;
  CHECK(message_of([&] { Runtime rt(o); }) ==
        "RuntimeOptions: scheduler_threads is -1 (expected 0 for TROUPE_SCHEDULER_THREADS, or 1..1024)");
}

TEST_CASE("negative multi-worker timeouts are refused before anything starts, naming the setting") {
  Runtime rt(RuntimeOptions{1, 0});
  const std::string address = "127.0.0.1:" + std::to_string(troupe::testing::free_port());
  auto resolver =
      std::make_shared<SimpleClusterResolver>(ClusterSpec(ClusterSpec::JobMap{{"worker", {address}}}), "worker", 0);
  CommunicationOptions comm;
  comm.timeout = std::chrono::milliseconds(-5);
  CHECK(message_of([&] { MultiWorkerMirroredStrategy s(rt, comm, resolver, MultiWorkerOptions{}); }) ==
        "CommunicationOptions: timeout is -5 ms (expected 0 for RuntimeOptions::collective_timeout_ms, or "
        "1..86400000)");
  CHECK_THROWS_AS(MultiWorkerMirroredStrategy(rt, comm, resolver, MultiWorkerOptions{}), std::invalid_argument);
  MultiWorkerOptions settings;
  settings.start_timeout = std::chrono::milliseconds(-5);
  CHECK(message_of([&] { MultiWorkerMirroredStrategy s(rt, {}, resolver, settings); }) ==
        "MultiWorkerOptions: start_timeout is -5 ms (expected 1..86400000)");
  settings = MultiWorkerOptions{};
  settings.heartbeat_interval = std::chrono::milliseconds(-5);
  CHECK(message_of([&] { MultiWorkerMirroredStrategy s(rt, {}, resolver, settings); }) ==
        "MultiWorkerOptions: heartbeat_interval is -5 ms (expected 10..600000)");
  settings = MultiWorkerOptions{};
  settings.missed_heartbeats = -1;
  CHECK(message_of([&] { MultiWorkerMirroredStrategy s(rt, {}, resolver, settings); }) ==
        "MultiWorkerOptions: missed_heartbeats is -1 (expected 1..1000)");
  settings = MultiWorkerOptions{};
  settings.devices_per_worker = -3;
  CHECK(message_of([&] { MultiWorkerMirroredStrategy s(rt, {}, resolver, settings); }) ==
        "MultiWorkerOptions: devices_per_worker is -3 (expected 0 for the default, or 1..1024)");
  // Valid settings still start.
  MultiWorkerMirroredStrategy s(rt, {}, resolver, MultiWorkerOptions{});
  CHECK(s.num_replicas_in_sync() == 1);
}

}  // namespace TROUPE_TEST_FILE
