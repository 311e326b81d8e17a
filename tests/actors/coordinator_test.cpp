#include <doctest/doctest.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <thread>

#include "caf/all.hpp"
#include "troupe/actors/coordinator.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::actors;
using namespace std::chrono_literals;

TEST_CASE("coordinator_state counts answers once per replica and ignores stale ones") {
  coordinator_state s;
  auto step = s.begin_step(3);
  CHECK_FALSE(s.complete());
  CHECK_FALSE(s.on_done(step, 0));
  CHECK_FALSE(s.on_done(step, 0));      // repeated
  CHECK_FALSE(s.on_done(step + 7, 1));  // another step's
  CHECK_FALSE(s.on_done(step, 9));      // no such replica
  CHECK_FALSE(s.on_done(step, 1));
  CHECK(s.on_done(step, 2));
  auto next = s.begin_step(3);
  CHECK(next == step + 1);
  CHECK_FALSE(s.on_done(step, 0));
  CHECK_FALSE(s.complete());
}

TEST_CASE("coordinator_state: a lost replica completes the step and stays lost") {
  coordinator_state s;
  auto step = s.begin_step(2);
  s.on_done(step, 0);
  CHECK(s.on_lost(1, "gone"));
  CHECK(s.lost()[1] == "gone");
  s.begin_step(2);
  CHECK_FALSE(s.complete());
  CHECK(s.on_done(s.step(), 0));  // replica 1 will not answer and is not waited for
}

TEST_CASE("coordinator runs each replica on its own actor thread and collects failures") {
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  {
    coordinator c(system, 4, 20us);
    CHECK(c.replicas() == 4);
    CHECK_FALSE(c.on_replica_thread());
    std::mutex m;
    std::set<std::thread::id> threads;
    std::atomic<int> on_replica{0};
    auto errors = c.run_step(
        [&](int r) {
          {
            std::lock_guard<std::mutex> lock(m);
            threads.insert(std::this_thread::get_id());
          }
          if (c.on_replica_thread()) ++on_replica;
          if (r == 2) throw std::runtime_error("boom");
        },
        [](int, const std::string&) {});
    CHECK(threads.size() == 4);
    CHECK(on_replica == 4);
    REQUIRE(errors.size() == 4);
    CHECK_FALSE(errors[0]);
    CHECK(errors[2]);
    CHECK_THROWS_WITH(std::rethrow_exception(errors[2]), "boom");
    for (int step = 0; step < 200; ++step) {
      std::atomic<int> calls{0};
      auto ok = c.run_step([&](int) { ++calls; }, [](int, const std::string&) {});
      REQUIRE(calls == 4);
      for (auto& e : ok) REQUIRE_FALSE(e);
    }
  }
}

}  // namespace TROUPE_TEST_FILE
