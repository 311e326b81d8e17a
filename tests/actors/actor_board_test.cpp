#include "troupe/actors/actor_board.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using troupe::actors::actor_board;
using namespace std::chrono_literals;

namespace {

actor_board::clock::time_point at(std::chrono::milliseconds t) { return actor_board::clock::time_point{} + t; }

}  // namespace

TEST_CASE("actor board: spawned actors are rows in spawn order with their type and task, reply age from the last reply") {
  actor_board b;
  b.spawned(1, "trial", "/job:worker/replica:0/task:0", at(0ms));
  b.spawned(2, "trial", "/job:worker/replica:0/task:1", at(10ms));
  b.replied(2, at(100ms));
  b.replied(99, at(100ms));  // never spawned: ignored
  auto v = b.snapshot(at(250ms));
  REQUIRE(v.rows.size() == 2);
  CHECK(v.rows[0].id == 1);
  CHECK(v.rows[0].type == "trial");
  CHECK(v.rows[0].task == "/job:worker/replica:0/task:0");
  CHECK(v.rows[0].last_reply_age_ms == -1);
  CHECK(v.rows[0].age_ms == doctest::Approx(250));
  CHECK(v.rows[1].task == "/job:worker/replica:0/task:1");
  CHECK(v.rows[1].last_reply_age_ms == doctest::Approx(150));
  CHECK_FALSE(v.rows[1].down);
  CHECK(v.spawned == 2);
  CHECK(v.down == 0);
  CHECK(v.restarts == 0);
}

TEST_CASE("actor board: a down actor keeps its row with the cause, counted once") {
  actor_board b;
  b.spawned(1, "trial", "/job:worker/replica:0/task:1", at(0ms));
  b.went_down(1, "the connection to /job:worker/replica:0/task:1 closed", at(5ms));
  b.went_down(1, "again", at(6ms));
  auto v = b.snapshot(at(10ms));
  REQUIRE(v.rows.size() == 1);
  CHECK(v.rows[0].down);
  CHECK(v.rows[0].cause == "the connection to /job:worker/replica:0/task:1 closed");
  CHECK(v.down == 1);
}

TEST_CASE("actor board: an actor its spawner stopped keeps its row marked stopped, counted apart from those lost") {
  actor_board b;
  b.spawned(1, "trial", "/job:worker/replica:0/task:0", at(0ms));
  b.spawned(2, "trial", "/job:worker/replica:0/task:1", at(0ms));
  b.describe(1, "trial 0", 4, {{"accuracy", 0.5}}, at(1ms));
  b.went_down(1, "stopped by its spawner", at(5ms), true);
  b.went_down(1, "the connection closed", at(6ms));  // counted once, as what it was first
  b.went_down(2, "the connection to /job:worker/replica:0/task:1 closed", at(7ms));
  auto v = b.snapshot(at(10ms));
  REQUIRE(v.rows.size() == 2);
  CHECK(v.rows[0].down);
  CHECK(v.rows[0].stopped);
  CHECK(v.rows[0].cause == "stopped by its spawner");
  CHECK(v.rows[0].step == 4);  // its numbers stay those it had
  CHECK(v.rows[1].down);
  CHECK_FALSE(v.rows[1].stopped);
  CHECK(v.stopped == 1);
  CHECK(v.down == 1);
  // Its label taken by a new actor: the row runs again, no longer stopped.
  b.spawned(3, "trial", "/job:worker/replica:0/task:0", at(20ms));
  b.describe(3, "trial 0", 5, {{"accuracy", 0.6}}, at(21ms));
  v = b.snapshot(at(30ms));
  REQUIRE(v.rows.size() == 2);
  CHECK(v.rows[0].id == 3);
  CHECK_FALSE(v.rows[0].down);
  CHECK_FALSE(v.rows[0].stopped);
}

TEST_CASE("actor board: a new actor given a down actor's label takes its row, its place and its history, as a restart") {
  actor_board b;
  b.spawned(1, "trial", "/job:worker/replica:0/task:0", at(0ms));
  b.spawned(2, "trial", "/job:worker/replica:0/task:1", at(0ms));
  b.describe(1, "trial 0", 10, {{"accuracy", 0.5}, {"lr", 0.1}}, at(1ms));
  b.describe(2, "trial 1", 10, {{"accuracy", 0.6}, {"lr", 0.2}}, at(1ms));
  b.went_down(2, "host died", at(2ms));
  b.spawned(3, "trial", "/job:worker/replica:0/task:0", at(3ms));
  b.describe(3, "trial 1", 20, {{"accuracy", 0.7}, {"lr", 0.2}}, at(4ms));
  b.describe(3, "trial 1", 20, {{"accuracy", 0.75}, {"lr", 0.2}}, at(5ms));  // the same step: replaced
  auto v = b.snapshot(at(10ms));
  REQUIRE(v.rows.size() == 2);
  CHECK(v.rows[0].label == "trial 0");
  CHECK(v.rows[1].label == "trial 1");
  CHECK(v.rows[1].id == 3);
  CHECK_FALSE(v.rows[1].down);
  CHECK(v.rows[1].task == "/job:worker/replica:0/task:0");
  CHECK(v.rows[1].restarts == 1);
  CHECK(v.rows[1].step == 20);
  REQUIRE(v.rows[1].values.size() == 2);
  CHECK(v.rows[1].values[0].first == "accuracy");
  CHECK(v.rows[1].values[0].second == 0.75);
  CHECK(v.restarts == 1);
  CHECK(v.spawned == 3);
  CHECK(v.down == 1);
  REQUIRE(v.history.size() == 2);
  CHECK(v.history[1].first == "trial 1");
  REQUIRE(v.history[1].second.size() == 2);
  CHECK(v.history[1].second[0].step == 10);
  CHECK(v.history[1].second[0].values[0].second == 0.6);
  CHECK(v.history[1].second[1].step == 20);
  CHECK(v.history[1].second[1].values[0].second == 0.75);
}

TEST_CASE("actor board: a restart reported for an actor moves it to its new id, counts it and clears its down state") {
  actor_board b;
  b.spawned(1, "counter", "/job:worker/replica:0/task:1", at(0ms));
  b.describe(1, "trial 0", 5, {{"accuracy", 0.5}}, at(1ms));
  b.replied(1, at(1ms));
  b.went_down(1, "host died", at(2ms));
  b.restarted(1, 4, "/job:worker/replica:0/task:0", at(3ms));
  b.restarted(7, 8, "/job:worker/replica:0/task:0", at(3ms));  // unknown: ignored
  b.describe(4, "trial 0", 6, {{"accuracy", 0.6}}, at(4ms));    // its own label: no second restart
  auto v = b.snapshot(at(5ms));
  REQUIRE(v.rows.size() == 1);
  CHECK(v.rows[0].id == 4);
  CHECK(v.rows[0].label == "trial 0");
  CHECK(v.rows[0].values[0].second == 0.6);
  CHECK_FALSE(v.rows[0].down);
  CHECK(v.rows[0].task == "/job:worker/replica:0/task:0");
  CHECK(v.rows[0].restarts == 1);
  CHECK(v.rows[0].last_reply_age_ms == -1);
  CHECK(v.rows[0].age_ms == doctest::Approx(2));
  CHECK(v.restarts == 1);
}

TEST_CASE("actor board: memory is bounded: rows, numbers per actor and points per label") {
  actor_board b;
  b.spawned(0, "trial", "local", at(0ms));
  b.went_down(0, "stopped", at(0ms));
  for (std::uint64_t i = 1; i <= actor_board::max_rows; ++i) b.spawned(i, "trial", "local", at(0ms));
  auto v = b.snapshot(at(1ms));
  REQUIRE(v.rows.size() == actor_board::max_rows);
  CHECK(v.rows[0].id == 1);  // the down one went first
  std::vector<std::pair<std::string, double>> many;
  for (int i = 0; i < 40; ++i) many.emplace_back("v" + std::to_string(i), i);
  for (std::int64_t s = 0; s < 1000; ++s) b.describe(1, "trial 1", s, many, at(2ms));
  v = b.snapshot(at(3ms));
  CHECK(v.rows[0].values.size() == actor_board::max_values);
  REQUIRE(v.history.size() == 1);
  CHECK(v.history[0].second.size() == actor_board::max_history);
  CHECK(v.history[0].second.back().step == 999);
}

}  // namespace TROUPE_TEST_FILE
