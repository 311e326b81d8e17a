#include <doctest/doctest.h>

#include <stdexcept>

#include "troupe/actors/cluster_tasks.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::actors;
using namespace std::chrono_literals;

namespace {

const std::vector<std::string> names{"/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"};
const closure_watch::clock::time_point t0{std::chrono::hours(1)};

}  // namespace

TEST_CASE("closure_watch names the worker, the function and how long a closure ran past the warning") {
  closure_watch w(names, {2000ms, 0ms});
  w.sent(1, 7, "train_step", t0);
  CHECK(w.check(t0 + 1999ms).lines.empty());
  CHECK(w.check(t0 + 2000ms).lines.empty());  // at the bound, not past it
  auto v = w.check(t0 + 2500ms);
  REQUIRE(v.lines.size() == 1);
  CHECK(v.lines[0] == "stall: closure 7 (function \"train_step\") has run on /job:worker/replica:0/task:1 for 2 s");
  CHECK(v.give_up.empty());  // no shutdown bound
  REQUIRE(w.current().size() == 1);
  CHECK(w.current()[0] == v.lines[0]);
}

TEST_CASE("closure_watch repeats a stall at a doubling back-off and clears it when the closure finishes") {
  closure_watch w(names, {1000ms, 0ms});
  w.sent(0, 3, "slow", t0);
  CHECK(w.check(t0 + 1100ms).lines.size() == 1);  // first line; next after 1 s
  CHECK(w.check(t0 + 1600ms).lines.empty());
  auto v = w.check(t0 + 2100ms);
  REQUIRE(v.lines.size() == 1);  // repeated; next after 2 s
  CHECK(v.lines[0].find("for 2 s") != std::string::npos);
  CHECK(w.check(t0 + 3500ms).lines.empty());
  CHECK(w.check(t0 + 4200ms).lines.size() == 1);  // then after 4 s
  CHECK(w.check(t0 + 7000ms).lines.empty());
  CHECK_FALSE(w.finished(0, 3, t0 + 7500ms));
  v = w.check(t0 + 7600ms);
  REQUIRE(v.lines.size() == 1);
  CHECK(v.lines[0] == "stall cleared: closure 3 (function \"slow\") finished on /job:worker/replica:0/task:0 after 7 s");
  CHECK(w.current().empty());
  CHECK(w.check(t0 + 9000ms).lines.empty());  // said once
}

TEST_CASE("closure_watch counts a queued closure from when the worker's previous one finished") {
  // A worker runs its closures one at a time: the second was handed at t0 but began at t0 + 5 s.
  closure_watch w(names, {2000ms, 0ms});
  w.sent(0, 1, "a", t0);
  w.sent(0, 2, "b", t0);
  CHECK(w.check(t0 + 2500ms).lines.size() == 1);  // closure 1
  CHECK_FALSE(w.finished(0, 1, t0 + 5000ms));
  auto v = w.check(t0 + 6000ms);
  REQUIRE(v.lines.size() == 1);
  CHECK(v.lines[0].rfind("stall cleared: closure 1 ", 0) == 0);  // only the clearing: 2 ran 1 s
  v = w.check(t0 + 7500ms);
  REQUIRE(v.lines.size() == 1);
  CHECK(v.lines[0] == "stall: closure 2 (function \"b\") has run on /job:worker/replica:0/task:0 for 2 s");
}

TEST_CASE("closure_watch leaves an unreported closure's finish silent and forgets a lost worker's closures") {
  closure_watch w(names, {1000ms, 0ms});
  w.sent(0, 1, "a", t0);
  CHECK_FALSE(w.finished(0, 1, t0 + 500ms));
  CHECK(w.check(t0 + 600ms).lines.empty());
  w.sent(1, 2, "b", t0);
  w.worker_lost(1);
  CHECK(w.check(t0 + 5000ms).lines.empty());
  CHECK_FALSE(w.finished(1, 2, t0 + 5000ms));  // stale
  CHECK_FALSE(w.finished(0, 99, t0 + 5000ms));  // never handed out
}

TEST_CASE("closure_watch gives a closure up once past the shutdown bound, and its worker is back when it returns") {
  closure_watch w(names, {1000ms, 3000ms});
  w.sent(1, 5, "hang", t0);
  w.sent(1, 6, "next", t0);
  auto v = w.check(t0 + 2000ms);
  CHECK(v.give_up.empty());
  v = w.check(t0 + 3100ms);
  REQUIRE(v.give_up.size() == 1);
  CHECK(v.give_up[0].worker == 1);
  CHECK(v.give_up[0].id == 5);
  CHECK(v.give_up[0].function == "hang");
  CHECK(v.give_up[0].running == 3100ms);
  CHECK(w.check(t0 + 3200ms).give_up.empty());  // once
  w.set_aside(1, 5);
  CHECK(w.aside(1));
  CHECK(w.check(t0 + 9000ms).lines.empty());  // what it held was forgotten
  CHECK_FALSE(w.finished(1, 6, t0 + 9000ms));  // a stale answer does not bring it back
  CHECK(w.aside(1));
  CHECK(w.finished(1, 5, t0 + 10000ms));
  CHECK_FALSE(w.aside(1));
  // Its next closure counts from now.
  w.sent(1, 8, "again", t0 + 10000ms);
  CHECK(w.check(t0 + 10500ms).lines.empty());
}

TEST_CASE("closure_watch watches each worker apart, and a lost worker set aside is no longer waited for") {
  closure_watch w(names, {1000ms, 2000ms});
  w.sent(0, 1, "a", t0);
  w.sent(1, 2, "b", t0 + 1500ms);
  auto v = w.check(t0 + 2100ms);
  REQUIRE(v.give_up.size() == 1);
  CHECK(v.give_up[0].worker == 0);
  REQUIRE(v.lines.size() == 1);
  CHECK(v.lines[0].find("task:0") != std::string::npos);
  w.set_aside(0, 1);
  w.worker_lost(0);
  CHECK_FALSE(w.aside(0));
  CHECK_FALSE(w.finished(0, 1, t0 + 3000ms));
}

TEST_CASE("closure_watch refuses bounds out of range and unknown workers") {
  CHECK_THROWS_AS(closure_watch(names, {0ms, 0ms}), std::invalid_argument);
  CHECK_THROWS_AS(closure_watch(names, {1000ms, -1ms}), std::invalid_argument);
  closure_watch w(names, {1000ms, 0ms});
  CHECK_THROWS_AS(w.set_options({0ms, 0ms}), std::invalid_argument);
  CHECK_THROWS_AS(w.sent(2, 1, "a", t0), std::out_of_range);
  CHECK_THROWS_AS(w.finished(-1, 1, t0), std::out_of_range);
  w.set_options({5000ms, 0ms});
  w.sent(0, 1, "a", t0);
  CHECK(w.check(t0 + 4000ms).lines.empty());  // the new bound
}

}  // namespace TROUPE_TEST_FILE
