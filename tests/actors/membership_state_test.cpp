// The rules of an elastic cluster's changes of membership, without CAF.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/actors/membership_state.hpp"
#include "troupe/actors/rendezvous.hpp"
#include "troupe/actors/rendezvous_state.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::actors;

namespace {

std::string task(int r) { return "/job:worker/replica:0/task:" + std::to_string(r); }

std::vector<std::string> tasks(int n) {
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) out.push_back(task(r));
  return out;
}

std::string message_of_construction(std::vector<std::string> t, int min, int max) {
  try {
    membership_state s(std::move(t), min, max);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("membership: a lost worker leaves in a change to the next generation, the survivors renumbered in order") {
  membership_state s(tasks(3), 2);
  CHECK(s.current_phase() == membership_state::phase::stable);
  CHECK(s.generation() == 0);
  CHECK_FALSE(s.decide().has_value());  // nothing to decide while every worker lives
  CHECK(s.lose(1, "its connection closed"));
  CHECK(s.current_phase() == membership_state::phase::losing);
  const auto change = s.decide();
  REQUIRE(change.has_value());
  CHECK(change->generation == 1);
  CHECK(change->survivors == std::vector<int>{0, 2});
  CHECK(change->tasks == std::vector<std::string>{task(0), task(2)});
  CHECK(change->left == std::vector<std::string>{task(1)});
  CHECK(change->new_rank(0) == 0);
  CHECK(change->new_rank(1) == -1);
  CHECK(change->new_rank(2) == 1);
  CHECK(s.current_phase() == membership_state::phase::changing);
  CHECK(s.generation() == 0);  // not before every survivor re-formed the ring
  CHECK_FALSE(s.complete(2));  // another generation changes nothing
  CHECK(s.complete(1));
  CHECK(s.current_phase() == membership_state::phase::stable);
  CHECK(s.generation() == 1);
  CHECK(s.changes() == 1);
  CHECK(s.tasks() == std::vector<std::string>{task(0), task(2)});
  CHECK(s.fallback().empty());
  // The new generation's ranks: its rank 1 is task 2, and losing it again is a new change... below min.
  CHECK(s.lose(1, "silent for 6 heartbeats"));
  CHECK(s.current_phase() == membership_state::phase::failed);
  CHECK(s.fallback() ==
        "elastic membership falls back to the restart path: 1 worker(s) would be left, fewer than min_workers (2); "
        "lost: " + task(2) + " (silent for 6 heartbeats)");
}

TEST_CASE("membership: two workers lost before the chief decides leave in one change when min_workers is met") {
  membership_state s(tasks(4), 2);
  CHECK(s.lose(3, "gone"));
  CHECK(s.lose(1, "gone"));
  CHECK_FALSE(s.lose(1, "gone again"));  // counted once
  const auto change = s.decide();
  REQUIRE(change.has_value());
  CHECK(change->survivors == std::vector<int>{0, 2});
  CHECK(change->left == std::vector<std::string>{task(1), task(3)});
  CHECK(s.complete(1));
  CHECK(s.tasks() == std::vector<std::string>{task(0), task(2)});
}

TEST_CASE("membership: two workers lost at once below min_workers fall back, naming both") {
  membership_state s(tasks(4), 3);
  CHECK(s.lose(2, "its connection closed"));
  CHECK(s.current_phase() == membership_state::phase::losing);
  CHECK(s.lose(3, "its connection closed"));
  CHECK(s.current_phase() == membership_state::phase::failed);
  CHECK(s.fallback() ==
        "elastic membership falls back to the restart path: 2 worker(s) would be left, fewer than min_workers (3); "
        "lost: " + task(2) + ", " + task(3) + " (its connection closed)");
  // A fallback is final: nothing more is decided or counted.
  CHECK_FALSE(s.decide().has_value());
  CHECK_FALSE(s.lose(1, "gone"));
  CHECK_FALSE(s.complete(1));
}

TEST_CASE("membership: losing the chief falls back to the restart path, named") {
  membership_state s(tasks(3), 1);
  CHECK(s.lose(0, "silent for 6 heartbeats"));
  CHECK(s.current_phase() == membership_state::phase::failed);
  CHECK(s.fallback() == "elastic membership falls back to the restart path: the chief " + task(0) +
                            " was lost (silent for 6 heartbeats); it holds the cluster's membership");
}

TEST_CASE("membership: a survivor lost while the decided change re-forms the ring falls back, one that left is ignored") {
  membership_state s(tasks(4), 1);
  CHECK(s.lose(3, "gone"));
  REQUIRE(s.decide().has_value());
  CHECK_FALSE(s.lose(3, "its connection closed"));  // the one leaving: already counted
  CHECK(s.current_phase() == membership_state::phase::changing);
  CHECK(s.lose(2, "its connection closed"));
  CHECK(s.current_phase() == membership_state::phase::failed);
  CHECK(s.fallback() == "elastic membership falls back to the restart path: " + task(2) +
                            " was lost while the cluster changed to generation 1 (its connection closed)");
  CHECK_FALSE(s.complete(1));
  CHECK(s.generation() == 0);
}

TEST_CASE("membership: a change that cannot re-form falls back with the cause") {
  membership_state s(tasks(3), 1);
  CHECK(s.lose(2, "gone"));
  REQUIRE(s.decide().has_value());
  s.abort("the survivors hold no common commit");
  CHECK(s.current_phase() == membership_state::phase::failed);
  CHECK(s.fallback() ==
        "elastic membership falls back to the restart path: the change to generation 1 failed: the survivors hold "
        "no common commit");
}

TEST_CASE("membership: ranks outside the table are ignored, and bad bounds are refused naming them") {
  membership_state s(tasks(2), 1, 5);
  CHECK_FALSE(s.lose(-1, "?"));
  CHECK_FALSE(s.lose(2, "?"));
  CHECK(s.current_phase() == membership_state::phase::stable);
  CHECK(s.max_workers() == 5);
  CHECK(membership_state(tasks(3), 2).max_workers() == 3);  // 0: the size at start
  CHECK(message_of_construction({}, 1, 0) == "membership_state: the cluster has no workers");
  CHECK(message_of_construction(tasks(3), 4, 0) == "membership_state: min_workers is 4 (expected 1..3, the cluster's size)");
  CHECK(message_of_construction(tasks(3), 0, 0) == "membership_state: min_workers is 0 (expected 1..3, the cluster's size)");
  CHECK(message_of_construction(tasks(3), 1, 2) ==
        "membership_state: max_workers is 2 but the cluster has 3 workers (expected 0, or 3 and more)");
}

TEST_CASE("membership: the survivors roll back to the newest commit every one of them holds") {
  // Survivors a step apart: the one ahead committed step 12 already, the other still holds 10 and 11.
  CHECK(common_commit({{11, 12}, {10, 11}}) == 11);
  CHECK(common_commit({{10, 11}, {10, 11}, {11, 10}}) == 11);
  CHECK(common_commit({{0}}) == 0);
  CHECK_FALSE(common_commit({{12, 13}, {10, 11}}).has_value());  // too far apart: fall back
  CHECK_FALSE(common_commit({}).has_value());
  CHECK_FALSE(common_commit({{5}, {}}).has_value());
}

TEST_CASE("membership: each generation's ring proves an incarnation of its own, the same on every survivor") {
  const std::string start = "0123456789abcdef0123456789abcdef";
  CHECK(generation_incarnation(start, 0) == start);
  const std::string g1 = generation_incarnation(start, 1);
  CHECK(g1.size() == 32);
  CHECK(g1 == generation_incarnation(start, 1));
  CHECK(g1 == hmac_sha256_hex(start, "troupe ring generation 1").substr(0, 32));
  CHECK(g1 != start);
  CHECK(g1 != generation_incarnation(start, 2));
  CHECK(g1 != generation_incarnation("fedcba9876543210fedcba9876543210", 1));
}

TEST_CASE("membership: only the chief's verdict that a worker is lost starts a change, in rendezvous_state's words") {
  using namespace std::chrono_literals;
  rendezvous_options o;
  o.tasks = tasks(3);
  o.chief_host = "127.0.0.1";
  o.chief_port = 2222;
  o.data_host = "127.0.0.1";
  o.data_port = 40000;
  rendezvous_state rules(o);
  const auto t0 = rendezvous_state::clock::time_point{} + 1h;
  rules.start_watch(100ms, t0);
  for (int r = 0; r < 3; ++r) rules.on_beat(r, t0);
  const auto closed = rules.on_connection_closed(2);
  REQUIRE(closed.has_value());
  CHECK(is_loss_verdict(task(2), closed->reason));
  CHECK_FALSE(is_loss_verdict(task(1), closed->reason));  // names another worker
  std::vector<verdict> silent;
  for (int i = 1; i <= 10 && silent.empty(); ++i) {
    rules.on_beat(0, t0 + i * 100ms);
    silent = rules.check(t0 + i * 100ms);
  }
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].rank == 1);
  CHECK(is_loss_verdict(task(1), silent[0].reason));
  // A fault a worker reported, and the stall shutdown, are no loss.
  CHECK_FALSE(is_loss_verdict(task(1), task(1) + " (rank 1) found the workers out of step: ..."));
  CHECK_FALSE(is_loss_verdict(task(1), "the chief ended the cluster: a worker waited longer than the stall shutdown"));
  CHECK_FALSE(is_loss_verdict("", "'s connection to the chief closed"));
}

TEST_CASE("membership: a second loss after a completed change shrinks again while min_workers holds, then falls back") {
  membership_state s(tasks(4), 2);
  REQUIRE(s.lose(3, "its connection closed"));
  auto first = s.decide();
  REQUIRE(first.has_value());
  REQUIRE(s.complete(first->generation));
  CHECK(s.tasks() == std::vector<std::string>{task(0), task(1), task(2)});
  // Ranks are the new generation's: task 2 is rank 2 of 3.
  REQUIRE(s.lose(2, "its connection closed"));
  auto second = s.decide();
  REQUIRE(second.has_value());
  CHECK(second->generation == 2);
  CHECK(second->left == std::vector<std::string>{task(2)});
  REQUIRE(s.complete(2));
  CHECK(s.changes() == 2);
  CHECK(s.tasks() == std::vector<std::string>{task(0), task(1)});
  // A third loss leaves 1, fewer than min_workers.
  REQUIRE(s.lose(1, "its connection closed"));
  CHECK(s.current_phase() == membership_state::phase::failed);
  CHECK(s.fallback().find("1 worker(s) would be left, fewer than min_workers (2); lost: " + task(1)) != std::string::npos);
}

TEST_CASE("membership: a joiner is admitted at a boundary after every member, refused beyond max_workers or twice") {
  membership_state s(tasks(3), 2, 3);
  CHECK(s.check_join(task(3)).value_or("").find("max_workers (3)") != std::string::npos);
  REQUIRE(s.lose(2, "its connection closed"));
  CHECK(s.check_join(task(2)).value_or("").find("changing") != std::string::npos);
  REQUIRE(s.complete(s.decide()->generation));
  // A replacement takes the lost worker's task again; a member's task is refused.
  CHECK_FALSE(s.check_join(task(2)).has_value());
  CHECK(s.check_join(task(1)).value_or("") == task(1) + " is a member already");
  CHECK_FALSE(s.admit({}).has_value());
  CHECK_FALSE(s.admit({task(2), task(2)}).has_value());
  CHECK_FALSE(s.admit({task(2), task(3)}).has_value());  // 4 > max_workers
  auto change = s.admit({task(2)});
  REQUIRE(change.has_value());
  CHECK(change->generation == 2);
  CHECK(change->survivors == std::vector<int>{0, 1});
  CHECK(change->tasks == std::vector<std::string>{task(0), task(1), task(2)});
  CHECK(change->joined == std::vector<std::string>{task(2)});
  CHECK(change->left.empty());
  CHECK(s.current_phase() == membership_state::phase::changing);
  CHECK_FALSE(s.admit({task(3)}).has_value());  // one change at a time
  REQUIRE(s.complete(2));
  CHECK(s.tasks().size() == 3);
  CHECK(s.changes() == 2);
}

TEST_CASE("membership: workers that asked to leave go at a boundary, the chief and those below min_workers refused") {
  membership_state s(tasks(4), 2);
  std::vector<std::string> refused;
  CHECK_FALSE(s.leave({}, refused).has_value());
  CHECK(refused.empty());
  // The chief may not leave; rank 3 and rank 1 may (min 2), named twice counts once.
  auto change = s.leave({3, 0, 1, 3}, refused);
  REQUIRE(change.has_value());
  CHECK(change->generation == 1);
  CHECK(change->survivors == std::vector<int>{0, 2});
  CHECK(change->left == std::vector<std::string>{task(1), task(3)});
  CHECK(change->joined.empty());
  CHECK(change->new_rank(2) == 1);
  REQUIRE(refused.size() == 1);
  CHECK(refused[0] == task(0) + " is the chief, which holds the cluster's membership");
  CHECK(s.current_phase() == membership_state::phase::changing);
  // Nobody else leaves while the change re-forms.
  std::vector<std::string> busy;
  CHECK_FALSE(s.leave({1}, busy).has_value());
  CHECK(busy == std::vector<std::string>{"the cluster is changing its membership"});
  REQUIRE(s.complete(1));
  CHECK(s.tasks() == std::vector<std::string>{task(0), task(2)});
  CHECK(s.changes() == 1);
  // At min_workers: rank 1 (task 2) is refused, and rank 7 is not in the table.
  refused.clear();
  CHECK_FALSE(s.leave({1, 7}, refused).has_value());
  REQUIRE(refused.size() == 2);
  CHECK(refused[0] == task(2) + " would leave 1 worker(s), fewer than min_workers (2)");
  CHECK(refused[1] == "rank 7 is not in the cluster of 2 workers");
  CHECK(s.current_phase() == membership_state::phase::stable);
}

TEST_CASE("membership: of several that ask to leave at min_workers, the lower ranks go first") {
  membership_state s(tasks(4), 3);
  std::vector<std::string> refused;
  auto change = s.leave({3, 2}, refused);
  REQUIRE(change.has_value());
  CHECK(change->left == std::vector<std::string>{task(2)});
  CHECK(change->survivors == std::vector<int>{0, 1, 3});
  REQUIRE(refused.size() == 1);
  CHECK(refused[0] == task(3) + " would leave 2 worker(s), fewer than min_workers (3)");
}

}  // namespace TROUPE_TEST_FILE
