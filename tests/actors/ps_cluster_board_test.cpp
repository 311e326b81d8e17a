#include "troupe/actors/ps_cluster_board.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using troupe::actors::ps_cluster_board;
using troupe::actors::ps_event_kind;
using troupe::actors::ps_task_counters;
using troupe::actors::ps_worker_state;
using namespace std::chrono_literals;

namespace {

ps_cluster_board::clock::time_point at(std::chrono::milliseconds t) { return ps_cluster_board::clock::time_point{} + t; }

ps_cluster_board two_by_two() {
  return ps_cluster_board({"/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"},
                          {"/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"});
}

}  // namespace

TEST_CASE("ps cluster board: workers connect, run and idle as the queue says, closures per second over the window") {
  ps_cluster_board b = two_by_two();
  auto v = b.snapshot(at(0ms));
  REQUIRE(v.workers.size() == 2);
  CHECK(v.workers[0].state == ps_worker_state::connecting);
  CHECK(v.workers[0].last_result_age_ms == -1);
  b.worker_up(0, at(0ms));
  b.worker_up(1, at(0ms));
  for (int i = 0; i < 6; ++i) b.scheduled(at(0ms));
  b.set_queue(2, {3, 1});
  v = b.snapshot(at(0ms));
  CHECK(v.workers[0].state == ps_worker_state::running);
  CHECK(v.workers[0].in_flight == 3);
  CHECK(v.in_flight == 4);
  CHECK(v.queued == 2);
  CHECK(v.scheduled == 6);
  CHECK(v.events.empty());  // reaching a worker the first time is no event
  // Worker 0 finishes 10 closures a second for 2 s, worker 1 none.
  for (int i = 1; i <= 20; ++i) b.closure_done(0, "", at(std::chrono::milliseconds(100 * i)));
  b.set_queue(0, {0, 1});
  v = b.snapshot(at(2000ms));
  CHECK(v.workers[0].done == 20);
  CHECK(v.workers[0].state == ps_worker_state::idle);
  CHECK(v.workers[1].state == ps_worker_state::running);
  CHECK(v.workers[0].closures_per_s == doctest::Approx(10.0));
  CHECK(v.workers[1].closures_per_s == 0.0);
  CHECK(v.closures_per_s == doctest::Approx(10.0));
  CHECK(v.workers[0].last_result_age_ms == doctest::Approx(0.0));
  // Nothing more for 10 s: the window holds no completion, the rate falls to 0.
  v = b.snapshot(at(12000ms));
  CHECK(v.workers[0].closures_per_s == 0.0);
  CHECK(v.closures_per_s == 0.0);
  CHECK(v.workers[0].last_result_age_ms == doctest::Approx(10000.0));
}

TEST_CASE("ps cluster board: each worker's samples per second over the window, from the samples fit counted") {
  ps_cluster_board b = two_by_two();
  b.worker_up(0, at(0ms));
  b.worker_up(1, at(0ms));
  // For 2 s, worker 0 returns 64 examples every 100 ms, worker 1 192 every 300 ms.
  for (int i = 1; i <= 20; ++i) b.samples_done(0, 64, at(std::chrono::milliseconds(100 * i)));
  for (int i = 1; i <= 6; ++i) b.samples_done(1, 192, at(std::chrono::milliseconds(300 * i)));
  b.samples_done(7, 100, at(1000ms));  // no such worker: ignored
  auto v = b.snapshot(at(2000ms));
  CHECK(v.workers[0].samples == 1280);
  CHECK(v.workers[1].samples == 1152);
  CHECK(v.workers[0].samples_per_s == doctest::Approx(640.0));
  CHECK(v.workers[1].samples_per_s == doctest::Approx(576.0));
  CHECK(v.workers[0].done == 0);  // the closures are the dispatcher's count, apart
  // Nothing more for 10 s: the window is empty, the rate falls to 0 and the count stays.
  v = b.snapshot(at(12000ms));
  CHECK(v.workers[0].samples_per_s == 0.0);
  CHECK(v.workers[0].samples == 1280);
}

TEST_CASE("ps cluster board: a lost worker, its retried closures, its return and cancelled closures are events, newest first, with the step") {
  ps_cluster_board b = two_by_two();
  b.worker_up(0, at(0ms));
  b.worker_up(1, at(0ms));
  b.set_step(40);
  b.worker_lost(1, "its connection closed", 3, at(1s));
  auto v = b.snapshot(at(1s));
  CHECK(v.workers[1].state == ps_worker_state::lost);
  CHECK(v.workers[1].times_lost == 1);
  CHECK(v.workers_lost == 1);
  CHECK(v.retried == 3);
  REQUIRE(v.events.size() == 2);
  CHECK(v.events[0].kind == ps_event_kind::closures_retried);
  CHECK(v.events[0].count == 3);
  CHECK(v.events[0].worker == 1);
  CHECK(v.events[0].step == 40);
  CHECK(v.events[1].kind == ps_event_kind::worker_lost);
  CHECK(v.events[1].text.find("its connection closed") != std::string::npos);
  CHECK(v.events[1].text.find("/job:worker/replica:0/task:1") != std::string::npos);
  // Lost with nothing in flight: no retried event.
  b.worker_lost(0, "silent", 0, at(2s));
  CHECK(b.snapshot(at(2s)).events.size() == 3);
  b.set_step(41);
  b.worker_up(1, at(3s));
  b.closure_done(1, "function \"f\" failed: boom", at(3s));
  b.closures_cancelled(5, at(3s));
  b.closures_cancelled(0, at(3s));  // nothing cancelled: no event
  v = b.snapshot(at(3s));
  CHECK(v.workers[1].state == ps_worker_state::idle);
  CHECK(v.failed == 1);
  CHECK(v.workers[1].failed == 1);
  CHECK(v.cancelled == 5);
  REQUIRE(v.events.size() == 6);
  CHECK(v.events[0].kind == ps_event_kind::closures_cancelled);
  CHECK(v.events[0].count == 5);
  CHECK(v.events[1].kind == ps_event_kind::closure_failed);
  CHECK(v.events[1].text == "function \"f\" failed: boom");
  CHECK(v.events[2].kind == ps_event_kind::worker_back);
  CHECK(v.events[2].step == 41);
  CHECK(v.events_total == 6);
  CHECK(v.events[0].sequence == 6);
}

TEST_CASE("ps cluster board: a worker set aside past the stall bound is a stall event, and back when it returns") {
  ps_cluster_board b = two_by_two();
  b.worker_up(0, at(0ms));
  b.worker_set_aside(0, "stall: closure 7 has run for 61 s", 2, at(61s));
  auto v = b.snapshot(at(61s));
  CHECK(v.workers[0].state == ps_worker_state::set_aside);
  REQUIRE(v.events.size() == 2);
  CHECK(v.events[1].kind == ps_event_kind::stall);
  CHECK(v.events[0].kind == ps_event_kind::closures_retried);
  CHECK(v.retried == 2);
  b.worker_up(0, at(62s));
  CHECK(b.snapshot(at(62s)).events[0].kind == ps_event_kind::worker_back);
}

TEST_CASE("ps cluster board: a ps task's counters give its update and byte rates, and a lost one is an event once") {
  ps_cluster_board b = two_by_two();
  auto v = b.snapshot(at(0ms));
  CHECK_FALSE(v.ps[1].reported);
  CHECK(v.ps[1].report_age_ms == -1);
  ps_task_counters c;
  c.shards = 3;
  c.bytes_held = 4096;
  b.ps_report(1, c, at(0ms));
  c.updates = 200;
  c.bytes_in = 100000;
  c.bytes_out = 50000;
  b.ps_report(1, c, at(1000ms));
  c.updates = 400;
  c.bytes_in = 200000;
  c.bytes_out = 100000;
  b.ps_report(1, c, at(2000ms));
  v = b.snapshot(at(2500ms));
  CHECK(v.ps[1].reported);
  CHECK(v.ps[1].counters.shards == 3);
  CHECK(v.ps[1].counters.bytes_held == 4096);
  CHECK(v.ps[1].updates_per_s == doctest::Approx(200.0));
  CHECK(v.ps[1].bytes_in_per_s == doctest::Approx(100000.0));
  CHECK(v.ps[1].bytes_out_per_s == doctest::Approx(50000.0));
  CHECK(v.ps[1].report_age_ms == doctest::Approx(500.0));
  CHECK_FALSE(v.ps[0].reported);
  b.ps_lost(0, "it missed 5 heartbeats", at(3s));
  b.ps_lost(0, "its connection closed", at(3s));
  v = b.snapshot(at(3s));
  CHECK(v.ps[0].lost);
  REQUIRE(v.events.size() == 1);
  CHECK(v.events[0].kind == ps_event_kind::ps_lost);
  CHECK(v.events[0].ps == 0);
  b.ps_report(7, c, at(3s));  // no such ps task: ignored
  b.worker_up(-1, at(3s));
  CHECK(b.snapshot(at(3s)).events.size() == 1);
  // Reached again (restarted alone): up, and an event once.
  b.ps_back(0, at(4s));
  b.ps_back(0, at(4s));
  v = b.snapshot(at(4s));
  CHECK_FALSE(v.ps[0].lost);
  REQUIRE(v.events.size() == 2);
  CHECK(v.events[0].kind == ps_event_kind::ps_back);
  CHECK(v.events[0].ps == 0);
  CHECK(std::string(troupe::actors::to_string(v.events[0].kind)) == "ps_back");
}

TEST_CASE("ps cluster board: a ps task's counters that start again from 0 (restarted) are counted as new updates") {
  ps_cluster_board b = two_by_two();
  ps_task_counters c;
  c.updates = 10000;
  b.ps_report(0, c, at(0ms));
  c.updates = 10200;
  b.ps_report(0, c, at(1000ms));
  c.updates = 50;  // restarted: its count begins again
  b.ps_report(0, c, at(2000ms));
  c.updates = 250;
  b.ps_report(0, c, at(3000ms));
  c.updates = 450;
  b.ps_report(0, c, at(4000ms));
  // 200 + 50 + 200 + 200 updates over the last 4 s: neither a fall to 0 nor a jump.
  CHECK(b.snapshot(at(4000ms)).ps[0].updates_per_s == doctest::Approx(650.0 / 4.0));
}

TEST_CASE("ps cluster board: the events are a ring of the newest, each text cut") {
  ps_cluster_board b({"w"}, {"p"}, 4);
  for (int i = 0; i < 10; ++i) b.stall(std::string(2000, 'x') + std::to_string(i), at(std::chrono::seconds(i)));
  const auto v = b.snapshot(at(10s));
  REQUIRE(v.events.size() == 4);
  CHECK(v.events_total == 10);
  CHECK(v.events[0].sequence == 10);
  CHECK(v.events[3].sequence == 7);
  CHECK(v.events[0].text.size() == ps_cluster_board::max_text_bytes);
}

}  // namespace TROUPE_TEST_FILE
