#include "troupe/actors/cluster_health.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using troupe::actors::cluster_event_kind;
using troupe::actors::cluster_health;
using troupe::actors::worker_state;
using namespace std::chrono_literals;

namespace {

cluster_health::clock::time_point at(std::chrono::milliseconds t) { return cluster_health::clock::time_point{} + t; }

void start(cluster_health& h) {
  h.start({"/job:worker/task:0", "/job:worker/task:1"}, 100ms, 2, "0123456789abcdef0123456789abcdef", at(0ms));
}

}  // namespace

TEST_CASE("cluster health: before the watch begins, beats are ignored and nothing is watched") {
  cluster_health h;
  h.beat(0, at(5ms));
  const auto s = h.snapshot(at(10s));
  CHECK_FALSE(s.watching);
  CHECK(s.workers.empty());
  CHECK(s.events.empty());
}

TEST_CASE("cluster health: a worker silent for more than 2 intervals is late, and back when it beats") {
  cluster_health h;
  start(h);
  h.beat(0, at(100ms));
  h.beat(1, at(100ms));
  auto s = h.snapshot(at(300ms));  // 200 ms silent: exactly 2 intervals, still alive
  CHECK(s.workers[1].state == worker_state::alive);
  CHECK(s.workers[1].heard);
  CHECK(s.workers[1].last_beat == at(100ms));
  CHECK(s.events.empty());
  h.beat(0, at(350ms));
  s = h.snapshot(at(301ms + 100ms));  // worker 1: 301 ms silent
  CHECK(s.workers[0].state == worker_state::alive);
  REQUIRE(s.workers[1].state == worker_state::late);
  REQUIRE(s.events.size() == 1);
  CHECK(s.events[0].kind == cluster_event_kind::worker_late);
  CHECK(s.events[0].rank == 1);
  CHECK(s.events[0].text.find("/job:worker/task:1 sent no heartbeat for 301 ms") == 0);
  // Late once: a later look adds nothing.
  h.beat(0, at(850ms));
  CHECK(h.snapshot(at(900ms)).events.size() == 1);
  h.beat(1, at(950ms));
  s = h.snapshot(at(960ms));
  CHECK(s.workers[1].state == worker_state::alive);
  REQUIRE(s.events.size() == 2);
  CHECK(s.events[0].kind == cluster_event_kind::worker_back);  // newest first
  CHECK(s.events[0].text == "/job:worker/task:1 beats again (it was late)");
  CHECK(s.events[1].kind == cluster_event_kind::worker_late);
  CHECK(s.events[0].sequence == 2);
  CHECK(s.events_total == 2);
}

TEST_CASE("cluster health: lost, left, faults, refusals and collective errors are recorded with their details") {
  cluster_health h;
  start(h);
  h.lost(1, "/job:worker/task:1 sent no heartbeat for 700 ms (hung, stopped or unreachable)", at(700ms));
  h.fault(0, "rank 0 found the workers out of step", at(710ms));
  h.refused("127.0.0.1:40312", "its TLS handshake failed", at(720ms));
  h.collective_error("all_reduce: peer /job:worker/task:1 closed the connection", at(730ms));
  h.left(0);
  h.beat(7, at(740ms));   // outside the cluster: ignored
  h.beat(-1, at(740ms));
  const auto s = h.snapshot(at(740ms));
  CHECK(s.workers[0].state == worker_state::left);
  CHECK(s.workers[1].state == worker_state::lost);  // not also late: lost stays lost
  REQUIRE(s.events.size() == 4);
  CHECK(s.events[0].kind == cluster_event_kind::collective_error);
  CHECK(s.events[0].rank == -1);
  CHECK(s.events[1].kind == cluster_event_kind::connection_refused);
  CHECK(s.events[1].address == "127.0.0.1:40312");
  CHECK(s.events[1].text == "its TLS handshake failed");
  CHECK(s.events[2].kind == cluster_event_kind::fault_reported);
  CHECK(s.events[2].rank == 0);
  CHECK(s.events[3].kind == cluster_event_kind::worker_lost);
  CHECK(s.events[3].rank == 1);
  CHECK(s.incarnation == "0123456789abcdef0123456789abcdef");
  CHECK(s.restart_count == 0);
  h.set_restart_count(2);
  CHECK(h.snapshot(at(740ms)).restart_count == 2);
  CHECK(std::string(troupe::actors::to_string(s.events[1].kind)) == "connection_refused");
  CHECK(std::string(troupe::actors::to_string(worker_state::lost)) == "lost");
}

TEST_CASE("cluster health: an elastic cluster's change of membership is an event with who left, the step and the pause") {
  cluster_health h;
  start(h);
  h.lost(1, "/job:worker/task:1's connection to the chief closed", at(700ms));
  h.beat(0, at(850ms));  // the chief goes on beating
  const std::string what = "/job:worker/task:1 left at step 12; 2 workers continue as generation 1 (paused 640 ms)";
  h.membership_changed(what, at(900ms));
  const auto s = h.snapshot(at(900ms));
  REQUIRE(s.events.size() == 2);
  CHECK(s.events[0].kind == cluster_event_kind::membership_changed);
  CHECK(s.events[1].kind == cluster_event_kind::worker_lost);
  CHECK(s.events[0].rank == -1);
  CHECK(s.events[0].text == what);
  CHECK(std::string(troupe::actors::to_string(s.events[0].kind)) == "membership_changed");
}

TEST_CASE("cluster health: an elastic cluster's joiner is watched under its new id, and each change is kept with its ring") {
  cluster_health h;
  h.start({"/job:worker/task:0", "/job:worker/task:1", "/job:worker/task:2"}, 100ms, 2,
          "0123456789abcdef0123456789abcdef", at(0ms));
  h.lost(2, "/job:worker/task:2's connection to the chief closed", at(300ms));
  troupe::actors::membership_record left;
  left.left = {"/job:worker/task:2"};
  left.step = 40;
  left.paused_ms = 700;
  left.workers = 2;
  left.generation = 1;
  left.ring = {0, 1};
  h.membership_changed(left, "/job:worker/task:2 left; 2 workers continue from step 40", at(1000ms));
  h.beat(3, at(1100ms));  // not a member yet: ignored
  h.add_worker(3, "/job:worker/task:2", at(1200ms));
  h.add_worker(1, "/job:worker/task:9", at(1200ms));  // an id already known: ignored
  h.beat(3, at(1250ms));
  troupe::actors::membership_record joined;
  joined.joined = {"/job:worker/task:2"};
  joined.step = 52;
  joined.paused_ms = 900;
  joined.workers = 3;
  joined.generation = 2;
  joined.state_bytes = 4096;
  joined.ring = {0, 1, 3};
  h.membership_changed(joined, "/job:worker/task:2 joined; 3 workers continue from step 52", at(1300ms));
  h.beat(0, at(1300ms));
  h.beat(1, at(1300ms));
  const auto s = h.snapshot(at(1300ms));
  REQUIRE(s.workers.size() == 4);
  CHECK(s.workers[1].task == "/job:worker/task:1");
  CHECK(s.workers[2].state == worker_state::lost);
  CHECK(s.workers[3].rank == 3);
  CHECK(s.workers[3].task == "/job:worker/task:2");
  CHECK(s.workers[3].state == worker_state::alive);
  CHECK(s.workers[3].heard);
  CHECK(s.workers[3].last_beat == at(1250ms));
  CHECK(s.ring == std::vector<int>{0, 1, 3});
  REQUIRE(s.changes.size() == 2);
  CHECK(s.changes[0].left == std::vector<std::string>{"/job:worker/task:2"});
  CHECK(s.changes[0].ring == std::vector<int>{0, 1});
  CHECK(s.changes[1].joined == std::vector<std::string>{"/job:worker/task:2"});
  CHECK(s.changes[1].step == 52);
  CHECK(s.changes[1].paused_ms == 900);
  CHECK(s.changes[1].state_bytes == 4096);
  REQUIRE(s.events.size() == 4);  // newest first
  CHECK(s.events[0].kind == cluster_event_kind::membership_changed);
  CHECK(s.events[1].kind == cluster_event_kind::worker_joined);
  CHECK(s.events[1].rank == 3);
  CHECK(s.events[1].text == "/job:worker/task:2 joined as worker 3");
  CHECK(std::string(troupe::actors::to_string(s.events[1].kind)) == "worker_joined");
  CHECK(s.events[2].kind == cluster_event_kind::membership_changed);
  CHECK(s.events[3].kind == cluster_event_kind::worker_lost);
}

TEST_CASE("cluster health: a lost worker that beats again is back") {
  cluster_health h;
  start(h);
  h.lost(1, "gone", at(700ms));
  h.beat(0, at(800ms));
  h.beat(1, at(800ms));
  const auto s = h.snapshot(at(800ms));
  CHECK(s.workers[1].state == worker_state::alive);
  REQUIRE(s.events.size() == 2);
  CHECK(s.events[0].text == "/job:worker/task:1 beats again (it was lost)");
}

TEST_CASE("cluster health: memory stays bounded: the last N events, each text cut") {
  cluster_health h(8);
  start(h);
  for (int i = 0; i < 1000; ++i) {
    h.refused("10.0.0.1:" + std::to_string(i), std::string(10000, 'x'), at(std::chrono::milliseconds(i)));
  }
  h.beat(0, at(1000ms));
  h.beat(1, at(1000ms));
  const auto s = h.snapshot(at(1000ms));
  REQUIRE(s.events.size() == 8);
  CHECK(s.events_total == 1000);
  CHECK(s.events[0].address == "10.0.0.1:999");
  CHECK(s.events[7].address == "10.0.0.1:992");
  CHECK(s.events[0].sequence == 1000);
  CHECK(s.events[0].text.size() == cluster_health::max_text_bytes + 3);
}

TEST_CASE("cluster health: a worker's report is recorded, its lines kept until new ones come, a bad one changing nothing") {
  cluster_health h;
  troupe::actors::worker_report r;
  r.cpu_percent = 50;
  r.rss_bytes = 1 << 20;
  CHECK_FALSE(h.report(1, r));  // before the watch: ignored
  CHECK(h.snapshot(at(0ms)).workers.empty());
  start(h);
  CHECK_FALSE(h.snapshot(at(0ms)).workers[1].reported);
  r.lines_total = 2;
  r.lines = {"paused after step 4", "resumed after step 4"};
  CHECK_FALSE(h.report(1, r));
  auto s = h.snapshot(at(10ms));
  CHECK(s.workers[1].reported);
  CHECK(s.workers[1].report.cpu_percent == 50);
  CHECK(s.workers[1].report.rss_bytes == 1 << 20);
  CHECK(s.workers[1].report.lines_total == 2);
  CHECK(s.workers[1].report.lines.size() == 2);
  CHECK_FALSE(s.workers[0].reported);
  // A later beat without lines updates the usage and keeps the lines.
  troupe::actors::worker_report later;
  later.cpu_percent = 75;
  later.rss_bytes = 2 << 20;
  later.lines_total = 2;
  CHECK_FALSE(h.report(1, later));
  s = h.snapshot(at(20ms));
  CHECK(s.workers[1].report.cpu_percent == 75);
  CHECK(s.workers[1].report.lines == std::vector<std::string>{"paused after step 4", "resumed after step 4"});
  // A report that breaks a bound is refused whole, with the reason.
  troupe::actors::worker_report bad = later;
  bad.cpu_percent = 1;
  bad.lines_total = 3;
  bad.lines = {"ok", "\xFF"};
  const auto why = h.report(1, bad);
  REQUIRE(why);
  CHECK(why->find("line 1 ") == 0);
  s = h.snapshot(at(30ms));
  CHECK(s.workers[1].report.cpu_percent == 75);
  CHECK(s.workers[1].report.lines_total == 2);
  CHECK(h.report(7, later) == std::nullopt);  // a rank outside the cluster: ignored
}

TEST_CASE("cluster health: every event carries the step the chief was at when it was recorded") {
  cluster_health h;
  start(h);
  h.fault(1, "before the first step", at(1ms));
  h.set_step(41);
  h.lost(1, "/job:worker/task:1's connection to the chief closed", at(2ms));
  h.set_step(42);
  const auto s = h.snapshot(at(3ms));
  REQUIRE(s.events.size() == 2);
  CHECK(s.events[0].kind == cluster_event_kind::worker_lost);
  CHECK(s.events[0].step == 41);
  CHECK(s.events[1].step == -1);
}

}  // namespace TROUPE_TEST_FILE
