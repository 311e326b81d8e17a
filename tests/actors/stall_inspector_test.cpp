#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "troupe/actors/stall_inspector.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::actors;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

worker_position waiting(std::uint64_t step, std::int64_t collective, std::int64_t ms) {
  worker_position p;
  p.phase = worker_phase::collective;
  p.step = step;
  p.collective = collective;
  p.op = position_op::all_reduce;
  p.dtype = 0;  // float32
  p.bytes = 1 << 20;
  p.phase_ms = ms;
  return p;
}

worker_position computing(std::uint64_t step, std::int64_t ms) {
  worker_position p;
  p.phase = worker_phase::compute;
  p.step = step;
  p.phase_ms = ms;
  return p;
}

stall_options warn_after(std::chrono::milliseconds warning, std::chrono::milliseconds shutdown = 0ms) {
  stall_options o;
  o.warning = warning;
  o.shutdown = shutdown;
  o.late_after = 1000ms;
  return o;
}

}  // namespace

TEST_CASE("the stall line names the collective, the workers waiting and where the others are") {
  const auto t0 = clock_type::now();
  stall_inspector s(4, warn_after(60s));
  s.position(0, waiting(812, 3, 61000), t0);
  s.position(1, computing(811, 62600), t0 - 400ms);
  s.position(2, waiting(812, 3, 60500), t0);
  s.position(3, waiting(812, 3, 60200), t0);
  const stall_verdict v = s.check(t0);
  CHECK(v.stalled);
  CHECK(v.print);
  CHECK_FALSE(v.shutdown);
  CHECK(v.line ==
        "stall: step 812 all_reduce #3 (float32, 1.0 MiB): workers 0, 2, 3 waiting 61 s; worker 1 is in step 811 "
        "compute since 63 s (last heartbeat 0.4 s ago)");
  CHECK(s.current() == v.line);
}

TEST_CASE("no line before the warning bound, and one as soon as the wait passes it") {
  const auto t0 = clock_type::now();
  stall_inspector s(2, warn_after(2s));
  s.position(0, waiting(5, 0, 1500), t0);
  s.position(1, computing(5, 1500), t0);
  CHECK_FALSE(s.check(t0).stalled);
  CHECK_FALSE(s.check(t0 + 500ms).stalled);  // 2.0 s: not longer than the bound
  const stall_verdict v = s.check(t0 + 600ms);
  CHECK(v.print);
  CHECK(v.line.find("worker 0 waiting 2 s; worker 1 is in step 5 compute since 2 s (last heartbeat 0.6 s ago)") !=
        std::string::npos);
}

TEST_CASE("the line repeats at a back-off, then says when the stall is over") {
  const auto t0 = clock_type::now();
  stall_inspector s(2, warn_after(2s));
  s.position(0, waiting(5, 1, 3000), t0);
  s.position(1, computing(5, 3000), t0);
  CHECK(s.check(t0).print);
  CHECK_FALSE(s.check(t0 + 1s).print);
  CHECK(s.check(t0 + 2s).print);   // the warning bound after the first
  CHECK_FALSE(s.check(t0 + 5s).print);
  CHECK(s.check(t0 + 6s).print);   // twice that after the second
  // Worker 1 came back and both moved on.
  s.position(0, computing(6, 10), t0 + 7s);
  s.position(1, computing(6, 10), t0 + 7s);
  const stall_verdict v = s.check(t0 + 7s);
  CHECK_FALSE(v.stalled);
  CHECK(v.cleared);
  CHECK(v.line == "stall cleared: step 5 all_reduce #1 completed; every worker moved on");
  CHECK(s.current().empty());
  CHECK_FALSE(s.check(t0 + 8s).cleared);  // said once
}

TEST_CASE("a worker whose heartbeats stopped is named with its last heartbeat's age") {
  const auto t0 = clock_type::now();
  stall_inspector s(3, warn_after(2s));
  s.position(0, waiting(9, 0, 2500), t0);
  s.position(1, computing(9, 100), t0 - 2400ms);  // stopped 2.4 s ago
  s.position(2, waiting(9, 0, 2400), t0);
  const stall_verdict v = s.check(t0);
  CHECK(v.line == "stall: step 9 all_reduce #0 (float32, 1.0 MiB): workers 0, 2 waiting 2 s; worker 1 is silent: "
                  "its last heartbeat, 2.4 s ago, had it in step 9 compute");
}

TEST_CASE("when every worker waits in the collective, the ring link that moves nothing is named") {
  const auto t0 = clock_type::now();
  stall_inspector s(2, warn_after(2s));
  worker_position a = waiting(4, 0, 5000);
  a.ring_peer = 1;
  a.ring_idle_ms = 4900;
  worker_position b = waiting(4, 0, 5000);
  b.ring_peer = 0;
  b.ring_idle_ms = 1000;
  s.position(0, a, t0);
  s.position(1, b, t0);
  const stall_verdict v = s.check(t0);
  CHECK(v.line == "stall: step 4 all_reduce #0 (float32, 1.0 MiB): workers 0, 1 waiting 5 s; every worker waits in "
                  "it: the ring link from worker 1 to worker 0 moved no byte for 4 s");
}

TEST_CASE("a ring link whose sender sent bytes its receiver never got is named, whoever idled longest") {
  const auto t0 = clock_type::now();
  stall_inspector s(3, warn_after(2s));
  // Worker 1 sent 5000 bytes to worker 2, which has 3000 of them; the ring has moved nothing since.
  worker_position p0 = waiting(4, 0, 5000), p1 = waiting(4, 0, 5000), p2 = waiting(4, 0, 5000);
  p0.ring_peer = 2, p0.ring_idle_ms = 4900, p0.ring_sent = 7000, p0.ring_received = 7000;
  p1.ring_peer = 0, p1.ring_idle_ms = 4000, p1.ring_sent = 5000, p1.ring_received = 7000;
  p2.ring_peer = 1, p2.ring_idle_ms = 4500, p2.ring_sent = 7000, p2.ring_received = 3000;
  s.position(0, p0, t0);
  s.position(1, p1, t0);
  s.position(2, p2, t0);
  CHECK(s.check(t0).line == "stall: step 4 all_reduce #0 (float32, 1.0 MiB): workers 0, 1, 2 waiting 5 s; every worker "
                            "waits in it: the ring link from worker 1 to worker 2 lost 2000 bytes (sent, never "
                            "received) and moved no byte for 4 s");
}

TEST_CASE("an elastic cluster's stall line leaves out a dropped worker and names a joined one, the ring through both") {
  const auto t0 = clock_type::now();
  stall_inspector s(3, warn_after(2s));
  s.position(2, computing(3, 9000), t0 - 5s);  // its last position before it was lost
  s.drop(2);
  s.add_worker();  // the replacement: worker 3
  // The ring 0 -> 1 -> 3 -> 0: worker 1 sent 5000 bytes to worker 3, which has 3000 of them.
  worker_position p0 = waiting(9, 0, 5000), p1 = waiting(9, 0, 5000), p3 = waiting(9, 0, 5000);
  p0.ring_idle_ms = 4000, p0.ring_sent = 7000, p0.ring_received = 7000;
  p1.ring_idle_ms = 4000, p1.ring_sent = 5000, p1.ring_received = 7000;
  p3.ring_idle_ms = 4500, p3.ring_sent = 7000, p3.ring_received = 3000;
  s.position(0, p0, t0);
  s.position(1, p1, t0);
  s.position(3, p3, t0);
  CHECK(s.check(t0).line == "stall: step 9 all_reduce #0 (float32, 1.0 MiB): workers 0, 1, 3 waiting 5 s; every worker "
                            "waits in it: the ring link from worker 1 to worker 3 (ring rank 2) lost 2000 bytes (sent, "
                            "never received) and moved no byte for 4 s");
  // Without the joiner's position the line names it, and never the dropped worker.
  stall_inspector t(3, warn_after(2s));
  t.drop(2);
  t.add_worker();
  t.position(0, waiting(9, 0, 5000), t0);
  t.position(1, waiting(9, 0, 5000), t0);
  CHECK(t.check(t0).line == "stall: step 9 all_reduce #0 (float32, 1.0 MiB): workers 0, 1 waiting 5 s; worker 3 sent "
                            "no position yet");
}

TEST_CASE("after a change of members the idle ring link names the workers by id, beside their ring ranks") {
  const auto t0 = clock_type::now();
  stall_inspector s(3, warn_after(2s));
  s.drop(1);
  s.add_worker();  // the replacement: worker 3
  // The ring 0 -> 2 -> 3 -> 0 of ranks 0, 1, 2: worker 3 (rank 2) waits on rank 1, worker 2, longest.
  worker_position p0 = waiting(9, 0, 5000), p2 = waiting(9, 0, 5000), p3 = waiting(9, 0, 5000);
  p0.ring_peer = 2, p0.ring_idle_ms = 1000;
  p2.ring_peer = 0, p2.ring_idle_ms = 2000;
  p3.ring_peer = 1, p3.ring_idle_ms = 4200;
  s.position(0, p0, t0);
  s.position(2, p2, t0);
  s.position(3, p3, t0);
  CHECK(s.check(t0).line == "stall: step 9 all_reduce #0 (float32, 1.0 MiB): workers 0, 2, 3 waiting 5 s; every worker "
                            "waits in it: the ring link from worker 2 (ring rank 1) to worker 3 (ring rank 2) moved "
                            "no byte for 4 s");
  // Worker 0 waiting longest on rank 2: the joiner, named by its id.
  p0.ring_idle_ms = 4900;
  s.position(0, p0, t0);
  CHECK(s.check(t0).line == "stall: step 9 all_reduce #0 (float32, 1.0 MiB): workers 0, 2, 3 waiting 5 s; every worker "
                            "waits in it: the ring link from worker 3 (ring rank 2) to worker 0 moved no byte for 4 s");
}

TEST_CASE("a silent worker's old position in a collective is not taken for the stalled collective") {
  const auto t0 = clock_type::now();
  stall_inspector s(2, warn_after(2s));
  s.position(0, waiting(1357, 1, 1500), t0 - 1s);   // beats: waiting for 2.5 s now
  s.position(1, waiting(1161, 0, 10), t0 - 3s);     // silent for 3 s, last seen in an older collective
  CHECK(s.check(t0).line == "stall: step 1357 all_reduce #1 (float32, 1.0 MiB): worker 0 waiting 2 s; worker 1 is "
                            "silent: its last heartbeat, 3.0 s ago, had it waiting in step 1161 all_reduce #0");
}

TEST_CASE("past the shutdown bound the verdict ends the cluster, once") {
  const auto t0 = clock_type::now();
  stall_inspector s(2, warn_after(2s, 5s));
  s.position(0, waiting(2, 0, 3000), t0);
  s.position(1, computing(2, 3000), t0);
  CHECK_FALSE(s.check(t0).shutdown);
  const stall_verdict v = s.check(t0 + 2100ms);
  CHECK(v.shutdown);
  CHECK(v.line.rfind("stall: step 2 all_reduce #0", 0) == 0);
  CHECK_FALSE(s.check(t0 + 3s).shutdown);
}

TEST_CASE("a worker in another collective, between steps or without a position is said so") {
  const auto t0 = clock_type::now();
  stall_inspector s(4, warn_after(1s));
  s.position(0, waiting(7, 2, 3000), t0);
  s.position(1, waiting(7, 1, 2900), t0);
  worker_position input;
  input.phase = worker_phase::input;
  input.step = 6;
  input.phase_ms = 2000;
  s.position(2, input, t0);
  const stall_verdict v = s.check(t0);
  CHECK(v.line == "stall: step 7 all_reduce #2 (float32, 1.0 MiB): worker 0 waiting 3 s; worker 1 is waiting in "
                  "step 7 all_reduce #1 since 2 s (last heartbeat 0.0 s ago); worker 2 is in input after step 6 since "
                  "2 s (last heartbeat 0.0 s ago); worker 3 sent no position yet");
}

TEST_CASE("a position from the network is checked field by field") {
  CHECK_FALSE(check_worker_position(waiting(1, 0, 10), 2));
  auto p = waiting(1, 0, 10);
  p.dtype = 6;
  CHECK(*check_worker_position(p, 2) == "dtype 6 (expected -1..5)");
  p = waiting(1, 0, 10);
  p.ring_peer = 2;
  CHECK(*check_worker_position(p, 2) == "ring_peer 2 (expected -1..1)");
  p = waiting(1, 0, 10);
  p.phase_ms = -5;
  CHECK(check_worker_position(p, 2)->rfind("phase_ms -5", 0) == 0);
  p = waiting(1, 0, 10);
  p.collective = -2;
  CHECK(check_worker_position(p, 2)->rfind("collective -2", 0) == 0);
  p = waiting(1, 0, 10);
  p.bytes = std::uint64_t{1} << 60;
  CHECK(check_worker_position(p, 2)->rfind("bytes ", 0) == 0);
  p = waiting(1, 0, 10);
  p.phase = static_cast<worker_phase>(9);
  CHECK(check_worker_position(p, 2)->rfind("phase 9", 0) == 0);
}

TEST_CASE("the position board follows the steps and collectives, and the ring's progress") {
  position_board board;
  const auto now = clock_type::now();
  CHECK(board.read(now).phase == worker_phase::none);
  board.begin_step(3);
  auto p = board.read(clock_type::now());
  CHECK(p.phase == worker_phase::compute);
  CHECK(p.step == 3);
  CHECK(p.collective == -1);
  board.set_ring_probe([] { return ring_progress{1, clock_type::now() - 10s, 640, 512}; });
  board.begin_collective(3, 2, position_op::broadcast, 1, 64);
  std::this_thread::sleep_for(20ms);
  p = board.read(clock_type::now());
  CHECK(p.phase == worker_phase::collective);
  CHECK(p.collective == 2);
  CHECK(p.op == position_op::broadcast);
  CHECK(p.dtype == 1);
  CHECK(p.bytes == 64);
  CHECK(p.phase_ms >= 20);
  CHECK(p.ring_peer == 1);
  CHECK(p.ring_idle_ms >= 20);  // progress before the collective counts from its start
  CHECK(p.ring_idle_ms < 5000);
  CHECK(p.ring_sent == 640);
  CHECK(p.ring_received == 512);
  board.end_collective();
  CHECK(board.read(clock_type::now()).phase == worker_phase::compute);
  board.end_step();
  p = board.read(clock_type::now());
  CHECK(p.phase == worker_phase::input);
  CHECK(p.ring_peer == -1);
}

TEST_CASE("sizes read as a person would") {
  CHECK(human_bytes(400) == "400 B");
  CHECK(human_bytes(4096) == "4.0 KiB");
  CHECK(human_bytes(1 << 20) == "1.0 MiB");
  CHECK(human_bytes(std::uint64_t{5} << 29) == "2.5 GiB");
}

}  // namespace TROUPE_TEST_FILE
