// The liveness policy alone: its ranges and errors, the limit, and the rule that forgives a
// process that was itself not running.
#include "troupe/actors/liveness_policy.hpp"

#include <doctest/doctest.h>

#include <stdexcept>

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using troupe::actors::liveness_policy;
using namespace std::chrono_literals;

TEST_CASE("liveness_policy: the defaults are 500 ms and 6 beats, a limit of 3 s") {
  const liveness_policy p;
  CHECK(p.interval == 500ms);
  CHECK(p.missed == 6);
  CHECK(p.limit() == 3000ms);
  CHECK_FALSE(p.problem("X").has_value());
}

TEST_CASE("liveness_policy: one range per setting, the error names the owner, the field, its value and the range") {
  liveness_policy p;
  p.interval = 9ms;
  CHECK(p.problem("MultiWorkerOptions").value() == "MultiWorkerOptions: heartbeat_interval is 9 ms (expected 10..600000)");
  CHECK_THROWS_AS(p.check("MultiWorkerOptions"), std::invalid_argument);
  p.interval = 10ms;
  CHECK_FALSE(p.problem("X").has_value());
  p.interval = 600'000ms;
  CHECK_FALSE(p.problem("X").has_value());
  p.interval = 600'001ms;
  CHECK(p.problem("ClusterCoordinatorOptions").value() ==
        "ClusterCoordinatorOptions: heartbeat_interval is 600001 ms (expected 10..600000)");
  p.interval = -5ms;
  CHECK(p.problem("X").value() == "X: heartbeat_interval is -5 ms (expected 10..600000)");
  p = liveness_policy{};
  p.missed = 0;
  CHECK(p.problem("X").value() == "X: missed_heartbeats is 0 (expected 1..1000)");
  p.missed = 1;
  CHECK_FALSE(p.problem("X").has_value());
  p.missed = 1000;
  CHECK_FALSE(p.problem("X").has_value());
  p.missed = 1001;
  CHECK(p.problem("X").value() == "X: missed_heartbeats is 1001 (expected 1..1000)");
  try {
    p.check("ClusterCoordinatorOptions");
    FAIL("check did not throw");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) == "ClusterCoordinatorOptions: missed_heartbeats is 1001 (expected 1..1000)");
  }
}

TEST_CASE("liveness_policy: a peer is silent too long only past interval * missed") {
  const liveness_policy p{100ms, 3};
  const auto t0 = liveness_policy::clock::time_point{} + 100s;
  CHECK(p.limit() == 300ms);
  CHECK_FALSE(p.silent_too_long(t0, t0));
  CHECK_FALSE(p.silent_too_long(t0, t0 + 300ms));  // exactly the limit: not yet
  CHECK(p.silent_too_long(t0, t0 + 301ms));
}

TEST_CASE("liveness_policy: a check more than two intervals after the previous one means this process paused") {
  const liveness_policy p{100ms, 3};
  const auto t0 = liveness_policy::clock::time_point{} + 100s;
  CHECK_FALSE(p.paused(t0, t0 + 100ms));
  CHECK_FALSE(p.paused(t0, t0 + 200ms));  // two intervals exactly: a late timer, not a pause
  CHECK(p.paused(t0, t0 + 201ms));
  CHECK(p.paused(t0, t0 + 1h));
  // The rule scales with the interval.
  CHECK_FALSE(liveness_policy{1000ms, 3}.paused(t0, t0 + 2s));
  CHECK(liveness_policy{1000ms, 3}.paused(t0, t0 + 2001ms));
}

}  // namespace TROUPE_TEST_FILE
