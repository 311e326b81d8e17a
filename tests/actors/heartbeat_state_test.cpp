// The cluster tasks' liveness rules alone (heartbeat_state with its liveness_policy), time passed in.
#include "troupe/actors/heartbeat_state.hpp"

#include <doctest/doctest.h>

#include <stdexcept>
#include <vector>

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::actors;

TEST_CASE("heartbeat_state names a watched peer silent for more than missed intervals, once, until it beats") {
  using namespace std::chrono_literals;
  heartbeat_state h(3, liveness_policy{500ms, 6});
  CHECK(h.limit() == 3000ms);
  const auto t0 = heartbeat_state::clock::time_point{} + 100s;
  CHECK(h.overdue(t0).empty());  // nobody watched
  h.watch(0, t0);
  h.watch(2, t0);
  // Checked every interval, as the actors do.
  auto at = t0;
  auto tick = [&](std::chrono::milliseconds step) {
    at += step;
    return h.overdue(at);
  };
  for (int k = 0; k < 5; ++k) CHECK(tick(500ms).empty());
  CHECK(tick(500ms).empty());          // t0 + 3000 ms: exactly the limit, not yet
  CHECK_FALSE(h.beat(2, at));           // peer 2 answers in time
  CHECK_FALSE(h.beat(1, at));           // not watched: nothing
  CHECK(tick(1ms) == std::vector<int>{0});
  CHECK(h.is_overdue(0));
  for (int k = 0; k < 5; ++k) CHECK(tick(500ms).empty());  // peer 0 is not named again
  CHECK(tick(500ms) == std::vector<int>{2});                // t0 + 6001 ms: 3001 ms since peer 2's beat
  CHECK(h.beat(0, at));                                     // back
  CHECK_FALSE(h.is_overdue(0));
  for (int k = 0; k < 6; ++k) CHECK(tick(500ms).empty());
  CHECK(tick(500ms) == std::vector<int>{0});
  h.forget(0);
  CHECK_FALSE(h.watched(0));
  CHECK_FALSE(h.beat(0, at));
  for (int k = 0; k < 10; ++k) CHECK(tick(500ms).empty());  // 0 forgotten, 2 already named
  CHECK_THROWS_AS(heartbeat_state(1, liveness_policy{0ms, 6}), std::invalid_argument);
  CHECK_THROWS_AS(heartbeat_state(1, liveness_policy{500ms, 0}), std::invalid_argument);
  CHECK_THROWS_AS(heartbeat_state(-1, liveness_policy{}), std::invalid_argument);
}

TEST_CASE("heartbeat_state blames nobody for a gap in its own checks (this process was stopped)") {
  using namespace std::chrono_literals;
  heartbeat_state h(1, liveness_policy{500ms, 6});
  const auto t0 = heartbeat_state::clock::time_point{} + 100s;
  h.watch(0, t0);
  CHECK(h.overdue(t0 + 500ms).empty());
  CHECK(h.overdue(t0 + 1500ms).empty());  // two intervals since the last check: not yet a pause
  CHECK(h.overdue(t0 + 20s).empty());     // 18.5 s since the last check: we were stopped, not the peer
  CHECK_FALSE(h.is_overdue(0));
  for (int k = 1; k <= 5; ++k) CHECK(h.overdue(t0 + 20s + k * 500ms).empty());  // a fresh limit from t0 + 20 s
  CHECK(h.overdue(t0 + 23001ms) == std::vector<int>{0});                        // then silent for real
  heartbeat_state g(1, liveness_policy{500ms, 6});
  g.watch(0, t0);
  CHECK(g.overdue(t0 + 10s).empty());  // no check since it was watched: a pause too
}

}  // namespace TROUPE_TEST_FILE
