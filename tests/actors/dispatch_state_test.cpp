#include <doctest/doctest.h>

#include <set>
#include <stdexcept>

#include "troupe/actors/cluster_tasks.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

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

TEST_CASE("dispatch_state cancels what is queued, and a lost worker's closures when told not to requeue them") {
  dispatch_state s(2, 1);
  s.on_worker_up(0);
  s.on_worker_up(1);
  for (std::uint64_t id = 1; id <= 5; ++id) s.enqueue(id);
  auto a = s.assign();
  REQUIRE(a.size() == 2);
  CHECK(s.cancel_queued() == std::vector<std::uint64_t>{3, 4, 5});
  CHECK(s.queued() == 0);
  CHECK(s.in_flight() == 2);  // closures in flight stay
  CHECK(s.assign().empty());
  const int w = a[0].first;
  auto back = s.on_worker_lost(w, false);
  CHECK(back == std::vector<std::uint64_t>{a[0].second});
  CHECK(s.queued() == 0);  // not put back
  CHECK(s.retried() == 0);
  CHECK(s.workers_lost() == 1);
  CHECK(s.in_flight() == 1);
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

}  // namespace TROUPE_TEST_FILE
