#include <doctest/doctest.h>

#include <set>
#include <stdexcept>

#include "troupe/actors/cluster_tasks.hpp"

using namespace troupe::actors;

TEST_CASE("dispatch_state hands closures to the least loaded workers that are up, within the window") {
  dispatch_state s(2, 2);
  for (std::uint64_t id = 1; id <= 5; ++id) s.enqueue(id);
  CHECK(s.assign().empty());  // no worker is up
  s.on_worker_up(1);
  auto a = s.assign();
  REQUIRE(a.size() == 2);  // worker 1's window
  CHECK(a[0] == std::make_pair(1, std::uint64_t{1}));
  CHECK(a[1] == std::make_pair(1, std::uint64_t{2}));
  s.on_worker_up(0);
  a = s.assign();
  REQUIRE(a.size() == 2);
  CHECK(a[0].first == 0);
  CHECK(a[1].first == 0);
  CHECK(s.queued() == 1);
  CHECK(s.in_flight() == 4);
  CHECK(s.on_finished(1, 1));
  CHECK_FALSE(s.on_finished(1, 1));  // answered twice
  CHECK_FALSE(s.on_finished(0, 2));  // closure 2 runs on worker 1, not 0: stale
  a = s.assign();
  REQUIRE(a.size() == 1);
  CHECK(a[0] == std::make_pair(1, std::uint64_t{5}));
  CHECK(s.workers_up() == 2);
}

TEST_CASE("dispatch_state puts a lost worker's closures back at the front, in order, at least once") {
  dispatch_state s(3, 4);
  for (int w = 0; w < 3; ++w) s.on_worker_up(w);
  for (std::uint64_t id = 1; id <= 9; ++id) s.enqueue(id);
  std::set<std::uint64_t> on_worker_2;
  for (auto [w, id] : s.assign()) {
    if (w == 2) on_worker_2.insert(id);
  }
  CHECK(on_worker_2.size() == 3);
  s.enqueue(10);
  auto back = s.on_worker_lost(2);
  CHECK(std::set<std::uint64_t>(back.begin(), back.end()) == on_worker_2);
  CHECK(s.retried() == 3);
  CHECK(s.workers_lost() == 1);
  CHECK(s.on_worker_lost(2).empty());  // lost once
  CHECK(s.workers_lost() == 1);
  CHECK_FALSE(s.on_finished(2, *on_worker_2.begin()));  // a late answer of the lost worker
  // The retried closures go out before closure 10, which was queued after them.
  for (int w = 0; w < 2; ++w) {
    for (std::uint64_t id = 1; id <= 9; ++id) s.on_finished(w, id);
  }
  auto a = s.assign();
  REQUIRE(a.size() == 4);
  for (int i = 0; i < 3; ++i) CHECK(on_worker_2.count(a[static_cast<std::size_t>(i)].second) == 1);
  CHECK(a[3].second == 10);
  for (auto [w, id] : a) CHECK(w != 2);
  // The worker comes back and takes work again.
  s.on_worker_up(2);
  s.enqueue(11);
  a = s.assign();
  REQUIRE(a.size() == 1);
  CHECK(a[0].first == 2);
}

TEST_CASE("dispatch_state refuses a window below 1") {
  CHECK_THROWS_AS(dispatch_state(2, 0), std::invalid_argument);
  dispatch_state s(1, 1);
  CHECK_THROWS_AS(s.set_window(0), std::invalid_argument);
  s.set_window(3);
  s.on_worker_up(0);
  for (std::uint64_t id = 1; id <= 5; ++id) s.enqueue(id);
  CHECK(s.assign().size() == 3);
}

TEST_CASE("heartbeat_state names a watched peer silent for more than missed intervals, once, until it beats") {
  using namespace std::chrono_literals;
  heartbeat_state h(3, 500ms, 6);
  CHECK(h.limit() == 3000ms);
  const auto t0 = heartbeat_state::clock::time_point{} + 100s;
  CHECK(h.overdue(t0 + 60s).empty());  // nobody watched
  h.watch(0, t0);
  h.watch(2, t0);
  CHECK(h.overdue(t0 + 3000ms).empty());  // exactly the limit: not yet
  CHECK_FALSE(h.beat(2, t0 + 2900ms));     // peer 2 answers in time
  CHECK_FALSE(h.beat(1, t0 + 2900ms));     // not watched: nothing
  auto late = h.overdue(t0 + 3001ms);
  REQUIRE(late.size() == 1);
  CHECK(late[0] == 0);
  CHECK(h.is_overdue(0));
  CHECK(h.overdue(t0 + 10s) == std::vector<int>{2});  // peer 0 is not named again
  CHECK(h.beat(0, t0 + 11s));                          // back
  CHECK_FALSE(h.is_overdue(0));
  CHECK(h.overdue(t0 + 13s).empty());
  CHECK(h.overdue(t0 + 14100ms) == std::vector<int>{0});
  h.forget(0);
  CHECK_FALSE(h.watched(0));
  CHECK_FALSE(h.beat(0, t0 + 20s));
  CHECK(h.overdue(t0 + 60s).empty());  // peer 2 is still overdue from before, 0 is forgotten
  CHECK_THROWS_AS(heartbeat_state(1, 0ms, 6), std::invalid_argument);
  CHECK_THROWS_AS(heartbeat_state(1, 500ms, 0), std::invalid_argument);
}
