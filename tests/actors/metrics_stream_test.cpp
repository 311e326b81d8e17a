// The metrics stream: its bounded history, its JSON, and the actor's pushes to subscribers.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "caf/all.hpp"
#include "troupe/actors/metrics_stream.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using troupe::actors::metrics_history;
using troupe::actors::metrics_stream;
using troupe::actors::step_event;

namespace {

step_event event(std::int64_t step) {
  step_event e;
  e.step = step;
  e.loss = 1.0 / static_cast<double>(step);
  e.replica_loss = {0.5, 0.25};
  e.workers.resize(2);
  e.workers[1].worker = 1;
  e.workers[1].all_reduce_bytes = 4096;
  return e;
}

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("metrics history keeps at most its capacity and spans the whole run at a coarser stride") {
  metrics_history h(8);
  for (std::int64_t s = 1; s <= 1000; ++s) h.add(event(s));
  CHECK(h.events().size() <= 8);
  CHECK(h.events().size() >= 4);
  CHECK(h.events().front().step == 1);
  CHECK(h.events().back().step > 1000 - static_cast<std::int64_t>(h.stride()));
  // The kept steps are evenly spaced by the stride.
  for (std::size_t i = 1; i < h.events().size(); ++i) {
    CHECK(h.events()[i].step - h.events()[i - 1].step == static_cast<std::int64_t>(h.stride()));
  }
  // A full history halves: 1000 steps end with stride 256 (steps 1, 257, 513, 769 kept).
  CHECK(h.stride() == 256);
  CHECK(h.events().size() == 4);
}

TEST_CASE("metrics history below capacity keeps every step") {
  metrics_history h(100);
  for (std::int64_t s = 1; s <= 50; ++s) h.add(event(s));
  CHECK(h.events().size() == 50);
  CHECK(h.stride() == 1);
}

TEST_CASE("a step event's JSON carries every field, and null for a non-finite loss") {
  step_event e = event(7);
  e.loss = std::nan("");
  const std::string json = troupe::actors::to_json(e);
  CHECK(json.find("\"step\":7,") != std::string::npos);
  CHECK(json.find("\"loss\":null") != std::string::npos);
  CHECK(json.find("\"replica_loss\":[0.5,0.25]") != std::string::npos);
  CHECK(json.find("\"all_reduce_bytes\":4096") != std::string::npos);
  CHECK(count(json, "\"worker\":") == 2);
  CHECK(count(json, "{") == count(json, "}"));
}

TEST_CASE("a step event's JSON names its compiled metrics, and has none without them") {
  step_event e = event(3);
  CHECK(troupe::actors::to_json(e).find("\"metrics\"") == std::string::npos);
  e.metric_names = std::make_shared<const std::vector<std::string>>(std::vector<std::string>{"accuracy", "top_k"});
  e.metrics = {0.75, std::nan("")};
  const std::string json = troupe::actors::to_json(e);
  CHECK(json.find("\"metrics\":{\"accuracy\":0.75,\"top_k\":null}") != std::string::npos);
}

TEST_CASE("the metrics stream pushes new steps to a subscriber, and stops after unsubscribe") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  metrics_stream stream(sys, 64, std::chrono::milliseconds(20));
  std::mutex m;
  std::string received;
  std::atomic<int> pushes{0};
  const int id = stream.subscribe([&](const std::string& json) {
    std::lock_guard<std::mutex> lock(m);
    received += json;
    ++pushes;
  });
  const auto start = std::chrono::steady_clock::now();
  stream.publish({event(1), event(2)});
  stream.publish({event(3)});
  while (pushes == 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(pushes > 0);  // pushed by the stream's own timer: nobody asked for it
  {
    std::lock_guard<std::mutex> lock(m);
    CHECK(received.front() == '[');
    CHECK(count(received, "\"step\":") >= 1);
  }
  // The history has all three.
  const std::string history = stream.history_json(std::chrono::seconds(5));
  CHECK(count(history, "{\"step\":") == 3);
  stream.unsubscribe(id);
  const int before = pushes;
  stream.publish({event(4)});
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(pushes == before);
}

TEST_CASE("the step ring hands events over in order, keeps its slots' storage, and drops when full") {
  troupe::actors::step_ring ring(5, 2, 2);  // rounded up to 8 slots
  CHECK(ring.capacity() == 8);
  std::vector<const double*> storage;
  std::int64_t next = 1;
  // Fill, drain part way, fill again: the indices wrap around the ring.
  for (int round = 0; round < 3; ++round) {
    while (ring.push(event(next))) ++next;
    CHECK(ring.size() == 8);
    CHECK(ring.dropped() == static_cast<std::uint64_t>(round + 1));
    std::vector<std::int64_t> steps;
    ring.drain([&](const step_event& e) {
      steps.push_back(e.step);
      CHECK(e.replica_loss.size() == 2);
      CHECK(e.workers.size() == 2);
      CHECK(e.workers[1].all_reduce_bytes == 4096);
      storage.push_back(e.replica_loss.data());
    });
    REQUIRE(steps.size() == 8);
    for (std::size_t i = 1; i < steps.size(); ++i) CHECK(steps[i] == steps[i - 1] + 1);
    CHECK(steps.back() == next - 1);
    CHECK(ring.size() == 0);
  }
  // An event of the ring's sizes is copied into the slot's own storage: the same 8 buffers
  // over and over, no allocation per step.
  std::sort(storage.begin(), storage.end());
  CHECK(std::unique(storage.begin(), storage.end()) - storage.begin() == 8);
}

TEST_CASE("the step ring carries every event from a producer thread to a consumer thread") {
  troupe::actors::step_ring ring(64, 2, 2);
  constexpr std::int64_t steps = 20000;
  std::atomic<bool> done{false};
  std::thread producer([&] {
    for (std::int64_t s = 1; s <= steps; ++s) {
      while (!ring.push(event(s))) std::this_thread::yield();  // this test waits; a trainer drops
    }
    done = true;
  });
  std::int64_t expected = 1;
  bool in_order = true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((!done || ring.size() > 0) && std::chrono::steady_clock::now() < deadline) {
    ring.drain([&](const step_event& e) {
      in_order = in_order && e.step == expected && e.loss == 1.0 / static_cast<double>(expected);
      ++expected;
    });
  }
  producer.join();
  CHECK(in_order);
  CHECK(expected == steps + 1);
}

TEST_CASE("the metrics stream drains pushed steps on its own timer, and flush_now pushes at once") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  // A push interval far beyond the test's waits: only flush_now can push within them.
  metrics_stream stream(sys, 64, std::chrono::seconds(60), 2, 2);
  std::mutex m;
  std::string received;
  std::atomic<int> pushes{0};
  stream.subscribe([&](const std::string& json) {
    std::lock_guard<std::mutex> lock(m);
    received += json;
    ++pushes;
  });
  for (std::int64_t s = 1; s <= 5; ++s) CHECK(stream.push(event(s)));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(pushes == 0);  // nothing is sent per step
  stream.flush_now();
  const auto start = std::chrono::steady_clock::now();
  while (pushes == 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(pushes == 1);
  {
    std::lock_guard<std::mutex> lock(m);
    CHECK(count(received, "{\"step\":") == 5);
  }
  CHECK(stream.dropped() == 0);
  CHECK(count(stream.history_json(std::chrono::seconds(5)), "{\"step\":") == 5);
}

TEST_CASE("the metrics stream pushes ring steps every push interval without being asked") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  metrics_stream stream(sys, 64, std::chrono::milliseconds(20), 2, 2);
  std::atomic<int> pushes{0};
  stream.subscribe([&](const std::string&) { ++pushes; });
  const auto start = std::chrono::steady_clock::now();
  CHECK(stream.push(event(1)));
  while (pushes == 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(pushes == 1);
  CHECK(count(stream.history_json(std::chrono::seconds(5)), "{\"step\":") == 1);
}

TEST_CASE("the metrics stream turns steps into JSON only while its subscriber has someone to push to") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  metrics_stream stream(sys, 64, std::chrono::seconds(60), 2, 2);
  std::atomic<bool> listening{false};
  std::mutex m;
  std::string received;
  std::atomic<int> pushes{0};
  stream.subscribe(
      [&](const std::string& json) {
        std::lock_guard<std::mutex> lock(m);
        received += json;
        ++pushes;
      },
      [&] { return listening.load(); });
  const auto wait_for_history = [&](std::size_t steps) {
    // history_json answers after the stream handled everything sent before it.
    return count(stream.history_json(std::chrono::seconds(5)), "{\"step\":") == steps;
  };
  for (std::int64_t s = 1; s <= 3; ++s) CHECK(stream.push(event(s)));
  stream.flush_now();
  CHECK(wait_for_history(3));  // the history keeps every step either way
  CHECK(pushes == 0);          // but nobody listened: no JSON, no push
  listening = true;
  CHECK(stream.push(event(4)));
  stream.flush_now();
  const auto start = std::chrono::steady_clock::now();
  while (pushes == 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(pushes == 1);
  std::lock_guard<std::mutex> lock(m);
  CHECK(count(received, "{\"step\":") == 1);  // only the step since someone listens
  CHECK(received.find("\"step\":4,") != std::string::npos);
}

}  // namespace TROUPE_TEST_FILE
