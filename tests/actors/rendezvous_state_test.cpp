#include <doctest/doctest.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/actors/rendezvous_state.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::actors;
using namespace std::chrono_literals;

namespace {

std::string task(int r) { return "/job:worker/replica:0/task:" + std::to_string(r); }

// The options of rank `rank` in a cluster of `n` workers with 2 devices each.
rendezvous_options options_for(int n, int rank = 0) {
  rendezvous_options o;
  o.rank = rank;
  for (int t = 0; t < n; ++t) o.tasks.push_back(task(t));
  o.chief_host = "10.0.0.1";
  o.chief_port = 2222;
  o.devices = 2;
  o.data_host = "10.0.0." + std::to_string(rank + 1);
  o.data_port = static_cast<std::uint16_t>(40000 + rank);
  o.token = "shared";
  o.timeout = 1500ms;
  return o;
}

// A well-formed join from rank `rank`, with a nonce the chief handed out.
join_request join_of(rendezvous_state& s, int rank, const std::string& nonce = "") {
  const std::string n = nonce.empty() ? "nonce-" + std::to_string(rank) : nonce;
  s.add_nonce(n);
  auto o = options_for(3, rank);
  return join_request{o.version, rank, n, hmac_sha256_hex("shared", n), o.devices, o.data_host, o.data_port, "", {}};
}

// Joins that fail: the code and the whole message.
void check_refused(const std::optional<rendezvous_error>& e, rendezvous_errc code, const std::string& message) {
  REQUIRE(e.has_value());
  CHECK(e->code == code);
  CHECK(e->message == message);
}

// The table every worker of options_for(n) would get.
std::vector<member> good_table(int n) {
  std::vector<member> t;
  for (int r = 0; r < n; ++r) {
    auto o = options_for(n, r);
    t.push_back(member{r, task(r), o.data_host, o.data_port, o.devices, r == 0 ? "0f9e3dAB" : "",
                       r == 0 ? "00112233445566778899aabbccddeeff" : ""});
  }
  return t;
}

// The error check_peer_table finds in `table` for rank `rank`, or "" when none.
std::string table_error(const std::vector<member>& table, int rank = 1) {
  auto e = check_peer_table(options_for(3, rank), table);
  if (!e) return "";
  CHECK(e->code == rendezvous_errc::bad_peer_table);
  return e->message;
}

std::string options_error(const rendezvous_options& o) {
  try {
    check_options(o);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

const auto t0 = rendezvous_state::clock::time_point{} + 1h;

// The chief's check every `step` from `from` (exclusive) to `to` (inclusive), as its actor makes
// it every interval: every verdict in order.
std::vector<verdict> checks(rendezvous_state& s, rendezvous_state::clock::time_point from,
                            rendezvous_state::clock::time_point to, std::chrono::milliseconds step = 100ms) {
  std::vector<verdict> out;
  for (auto at = from + step; at <= to; at += step) {
    for (auto& v : s.check(at)) out.push_back(std::move(v));
  }
  return out;
}

// A complete cluster of 3 watched from t0 every 100 ms, with every rank's watcher registered.
rendezvous_state watched_cluster(rendezvous_options o = options_for(3)) {
  rendezvous_state s(o);
  REQUIRE_FALSE(s.join(join_of(s, 1)));
  REQUIRE_FALSE(s.join(join_of(s, 2)));
  REQUIRE(s.complete());
  s.start_watch(100ms, t0);
  for (int r = 0; r < 3; ++r) REQUIRE(s.on_beat(r, t0));
  return s;
}

}  // namespace

// --- joining ---

TEST_CASE("rendezvous_state holds the chief at rank 0 from the start and waits for the others") {
  auto o = options_for(3);
  o.collective_id = "00ff";
  rendezvous_state s(o);
  CHECK_FALSE(s.complete());
  CHECK_FALSE(s.failure());
  CHECK(s.missing() == task(1) + ", " + task(2));
  REQUIRE(s.table().size() == 3);
  CHECK(s.table()[0].task == task(0));
  CHECK(s.table()[0].data_port == 40000);
  CHECK(s.table()[0].collective_id == "00ff");
}

TEST_CASE("rendezvous_state of a one-worker cluster is complete at once") {
  rendezvous_state s(options_for(1));
  CHECK(s.complete());
  CHECK(s.missing().empty());
  CHECK_FALSE(s.expire());
}

TEST_CASE("rendezvous_state refuses a cluster without workers") {
  CHECK_THROWS_AS(rendezvous_state(rendezvous_options{}), std::invalid_argument);
}

TEST_CASE("rendezvous_state completes the table once every worker joined, in any order") {
  rendezvous_state s(options_for(3));
  CHECK_FALSE(s.join(join_of(s, 2)));
  CHECK_FALSE(s.complete());
  CHECK(s.missing() == task(1));
  CHECK_FALSE(s.join(join_of(s, 1)));
  CHECK(s.complete());
  CHECK(check_peer_table(options_for(3, 1), s.table()) == std::nullopt);
  CHECK(s.table()[2].rank == 2);
  CHECK(s.table()[2].task == task(2));
  CHECK(s.table()[2].data_host == "10.0.0.3");
  CHECK(s.table()[2].data_port == 40002);
  CHECK(s.table()[2].devices == 2);
  CHECK(s.table()[2].collective_id.empty());
}

TEST_CASE("a join in another protocol version fails the rendezvous, naming both versions") {
  rendezvous_state s(options_for(3));
  auto j = join_of(s, 1);
  j.version = 6;  // the version before heartbeats carried a worker's position
  j.proof = "wrong too";  // the version is checked first
  check_refused(s.join(j), rendezvous_errc::protocol_mismatch,
                "rendezvous failed: " + task(1) + " speaks rendezvous protocol version 6, the chief 7: run the same "
                                                  "troupe build everywhere");
}

TEST_CASE("a join with a wrong token proof is refused alone: the rendezvous goes on") {
  rendezvous_state s(options_for(3));
  auto j = join_of(s, 2);
  j.proof = hmac_sha256_hex("guess", j.nonce);
  check_refused(s.join(j), rendezvous_errc::bad_token, "rendezvous: refused a join claiming to be " + task(2) +
                    ": it failed the cluster token check (a stranger, or a worker with another TROUPE_CLUSTER_TOKEN: "
                    "set the same on every worker)");
  CHECK_FALSE(s.failure());
  CHECK_FALSE(s.join(join_of(s, 1)));
  CHECK_FALSE(s.join(join_of(s, 2)));
  CHECK(s.complete());
}

TEST_CASE("a join with a nonce the chief never handed out fails the token check") {
  rendezvous_state s(options_for(3));
  join_request j{rendezvous_options{}.version, 1, "made-up", hmac_sha256_hex("shared", "made-up"), 2, "10.0.0.2", 40001, "", {}};
  CHECK(s.join(j)->code == rendezvous_errc::bad_token);
}

TEST_CASE("a nonce is good for one join only") {
  rendezvous_state s(options_for(3));
  auto first = join_of(s, 1, "once");
  CHECK_FALSE(s.join(first));
  auto replay = first;
  replay.rank = 2;
  replay.data_port = 40002;
  check_refused(s.join(replay), rendezvous_errc::bad_token, "rendezvous: refused a join claiming to be " + task(2) +
                    ": it failed the cluster token check (a stranger, or a worker with another TROUPE_CLUSTER_TOKEN: "
                    "set the same on every worker)");
  CHECK_FALSE(s.failure());
}

TEST_CASE("a nonce counts only for the peer it was handed to, and only within its lifetime") {
  rendezvous_state s(options_for(3));
  const auto t = rendezvous_state::clock::time_point{} + 1h;
  s.add_nonce("n1", "worker-node", t);
  auto o = options_for(3, 1);
  join_request j{o.version, 1, "n1", hmac_sha256_hex("shared", "n1"), o.devices, o.data_host, o.data_port,
                 "stranger-node", t};
  CHECK(s.join(j)->code == rendezvous_errc::bad_token);  // another peer's nonce
  j.peer = "worker-node";
  j.at = t + rendezvous_limits::nonce_lifetime + 1ms;
  CHECK(s.join(j)->code == rendezvous_errc::bad_token);  // expired (and now used up)
  s.add_nonce("n2", "worker-node", t);
  j.nonce = "n2";
  j.proof = hmac_sha256_hex("shared", "n2");
  j.at = t + 1s;
  CHECK_FALSE(s.join(j));
  CHECK_FALSE(s.failure());
}

TEST_CASE("nonces are bounded: one per peer, at most max_nonces in all, the expired ones dropped") {
  rendezvous_state s(options_for(3));
  const auto t = rendezvous_state::clock::time_point{} + 1h;
  for (int i = 0; i < 200000; ++i) s.add_nonce("flood-" + std::to_string(i), "stranger", t);
  CHECK(s.nonces() == 1);
  for (int i = 0; i < 200000; ++i) s.add_nonce("n-" + std::to_string(i), "peer-" + std::to_string(i), t);
  CHECK(s.nonces() == rendezvous_limits::max_nonces);
  s.add_nonce("late", "late-peer", t + rendezvous_limits::nonce_lifetime + 1ms);
  CHECK(s.nonces() == 1);
  // A real worker's nonce handed out after the flood still works.
  s.add_nonce("real", "worker-node", t + rendezvous_limits::nonce_lifetime + 2ms);
  auto o = options_for(3, 1);
  CHECK_FALSE(s.join(join_request{o.version, 1, "real", hmac_sha256_hex("shared", "real"), o.devices, o.data_host,
                                  o.data_port, "worker-node", t + rendezvous_limits::nonce_lifetime + 3ms}));
}

TEST_CASE("a join claiming a rank outside the cluster, or the chief's, fails the rendezvous") {
  for (int rank : {-1, 3, 1000}) {
    rendezvous_state s(options_for(3));
    auto j = join_of(s, 1);
    j.rank = rank;
    check_refused(s.join(j), rendezvous_errc::not_in_cluster,
                  "rendezvous failed: a worker claiming rank " + std::to_string(rank) +
                      " is not in the cluster (3 workers; a joining worker's rank is in 1..2)");
  }
  rendezvous_state s(options_for(3));
  auto j = join_of(s, 1);
  j.rank = 0;
  check_refused(s.join(j), rendezvous_errc::not_in_cluster,
                "rendezvous failed: " + task(0) +
                    " is not in the cluster (3 workers; a joining worker's rank is in 1..2)");
  rendezvous_state alone(options_for(1));
  alone.add_nonce("n");
  join_request k{rendezvous_options{}.version, 1, "n", hmac_sha256_hex("shared", "n"), 2, "h", 1, "", {}};
  CHECK(alone.join(k)->message.find("(1 workers; no other worker may join)") != std::string::npos);
}

TEST_CASE("two joins claiming one rank fail the rendezvous") {
  rendezvous_state s(options_for(3));
  CHECK_FALSE(s.join(join_of(s, 1, "a")));
  check_refused(s.join(join_of(s, 1, "b")), rendezvous_errc::duplicate_rank,
                "rendezvous failed: " + task(1) + " joined twice: two processes have the same task index");
  CHECK_FALSE(s.complete());
}

TEST_CASE("a join with another device count fails the rendezvous, naming both workers and counts") {
  rendezvous_state s(options_for(3));
  auto j = join_of(s, 2);
  j.devices = 4;
  check_refused(s.join(j), rendezvous_errc::device_mismatch,
                "rendezvous failed: workers have different device counts: " + task(2) + " has 4, " + task(0) +
                    " has 2; every worker needs the same number of local devices");
}

TEST_CASE("a join with a data-plane port or host out of range fails the rendezvous") {
  {
    rendezvous_state s(options_for(3));
    auto j = join_of(s, 1);
    j.data_port = 0;
    check_refused(s.join(j), rendezvous_errc::bad_join,
                  "rendezvous failed: " + task(1) +
                      " sent data-plane port 0 (expected 1..65535): its data listener is not bound");
  }
  for (std::size_t length : {std::size_t{0}, std::size_t{256}}) {
    rendezvous_state s(options_for(3));
    auto j = join_of(s, 1);
    j.data_host = std::string(length, 'h');
    check_refused(s.join(j), rendezvous_errc::bad_join,
                  "rendezvous failed: " + task(1) + " sent a data-plane host of " + std::to_string(length) +
                      " characters (expected 1..255)");
  }
}

TEST_CASE("a join whose data-plane host has a NUL fails the rendezvous, the host shown escaped") {
  rendezvous_state s(options_for(3));
  auto j = join_of(s, 1);
  j.data_host = std::string("10.0.0.2\0evil", 13);
  check_refused(s.join(j), rendezvous_errc::bad_join,
                "rendezvous failed: " + task(1) + " sent the data-plane host '10.0.0.2\\0evil', which has a NUL "
                "character");
}

TEST_CASE("once failed, the rendezvous answers every later join with the first error") {
  rendezvous_state s(options_for(3));
  auto bad = join_of(s, 1);
  bad.devices = 1;
  const auto first = s.join(bad);
  REQUIRE(first);
  const auto later = s.join(join_of(s, 2));
  REQUIRE(later);
  CHECK(later->message == first->message);
  CHECK(s.failure()->message == first->message);
  CHECK_FALSE(s.complete());
  CHECK_FALSE(s.expire());  // the first failure stands
  CHECK(s.failure()->code == rendezvous_errc::device_mismatch);
}

TEST_CASE("the start deadline fails the rendezvous naming every missing task in rank order") {
  rendezvous_state s(options_for(4));
  s.add_nonce("n");
  CHECK_FALSE(s.join(join_request{rendezvous_options{}.version, 2, "n", hmac_sha256_hex("shared", "n"), 2, "h", 1, "", {}}));
  CHECK(s.expire());
  REQUIRE(s.failure());
  CHECK(s.failure()->code == rendezvous_errc::workers_missing);
  CHECK(s.failure()->message == "rendezvous failed: still missing after 1500 ms: " + task(1) + ", " + task(3) +
                                    " (started? reachable? same TF_CONFIG?)");
  CHECK_FALSE(s.expire());  // only once
}

TEST_CASE("the start deadline passing after the table is complete changes nothing") {
  rendezvous_state s(options_for(2));
  CHECK_FALSE(s.join(join_of(s, 1)));
  CHECK_FALSE(s.expire());
  CHECK_FALSE(s.failure());
  CHECK(s.complete());
}

// --- watching ---

TEST_CASE("heartbeats before the watch starts, or from ranks outside the cluster, are ignored") {
  rendezvous_state s(options_for(2));
  CHECK_FALSE(s.join(join_of(s, 1)));
  CHECK_FALSE(s.on_beat(1, t0));
  s.on_bye(1);
  CHECK_FALSE(s.settled(1));
  CHECK_FALSE(s.on_connection_closed(1));
  s.start_watch(100ms, t0);
  CHECK_FALSE(s.on_beat(2, t0));
  CHECK_FALSE(s.on_beat(-1, t0));
  CHECK(s.on_beat(1, t0));        // the first beat registers the watcher
  CHECK_FALSE(s.on_beat(1, t0));  // later ones only refresh
}

TEST_CASE("a worker silent for more than missed_heartbeats intervals is declared gone once, and every watcher told") {
  auto s = watched_cluster();
  CHECK(checks(s, t0, t0 + 600ms).empty());  // 6 intervals exactly: not yet
  s.on_beat(1, t0 + 500ms);
  auto verdicts = s.check(t0 + 601ms);
  REQUIRE(verdicts.size() == 1);
  CHECK(verdicts[0].rank == 2);
  CHECK(verdicts[0].reason == task(2) + " sent no heartbeat for 601 ms (hung, stopped or unreachable)");
  CHECK(verdicts[0].tell == std::vector<int>{0, 1, 2});
  CHECK(s.settled(2));
  auto later = checks(s, t0 + 600ms, t0 + 2000ms);
  REQUIRE(later.size() == 1);  // rank 1 now (at t0 + 1200 ms); rank 2 is not declared twice
  CHECK(later[0].rank == 1);
  CHECK(later[0].reason == task(1) + " sent no heartbeat for 700 ms (hung, stopped or unreachable)");
}

TEST_CASE("the chief is never declared gone by its own heartbeat check") {
  auto s = watched_cluster();
  s.on_beat(1, t0 + 10s);
  s.on_beat(2, t0 + 10s);
  CHECK(s.check(t0 + 10s).empty());
  CHECK_FALSE(s.settled(0));
}

TEST_CASE("the chief blames nobody for a gap in its own checks (its process was stopped or starved)") {
  auto s = watched_cluster();
  CHECK(checks(s, t0, t0 + 300ms).empty());
  // Its next check comes 10 s late: nobody's silence meanwhile counts...
  CHECK(s.check(t0 + 10300ms).empty());
  // ...and every worker has a fresh limit from then: 6 intervals more, then declared gone.
  CHECK(checks(s, t0 + 10300ms, t0 + 10900ms).empty());
  auto verdicts = s.check(t0 + 10901ms);
  REQUIRE(verdicts.size() == 2);
  CHECK(verdicts[0].reason == task(1) + " sent no heartbeat for 601 ms (hung, stopped or unreachable)");
  // A check two intervals late exactly is only a late timer: silence counts across it.
  auto o = options_for(3);
  o.missed_heartbeats = 2;
  auto late = watched_cluster(o);
  CHECK(late.check(t0 + 200ms).empty());
  CHECK(late.check(t0 + 201ms).size() == 2);
}

TEST_CASE("missed_heartbeats sets how many intervals of silence declare a worker gone") {
  auto o = options_for(3);
  o.missed_heartbeats = 2;
  auto s = watched_cluster(o);
  CHECK(s.check(t0 + 200ms).empty());
  CHECK(s.check(t0 + 201ms).size() == 2);
}

TEST_CASE("heartbeats and goodbyes count only from the peer that joined as the rank they name") {
  rendezvous_state s(options_for(3));
  const auto t = rendezvous_state::clock::time_point{} + 1h;
  s.set_chief_peer("chief-node");
  for (int r = 1; r < 3; ++r) {
    auto o = options_for(3, r);
    const std::string n = "nonce-" + std::to_string(r), peer = "node-" + std::to_string(r);
    s.add_nonce(n, peer, t);
    REQUIRE_FALSE(s.join(join_request{o.version, r, n, hmac_sha256_hex("shared", n), o.devices, o.data_host,
                                      o.data_port, peer, t}));
  }
  s.start_watch(100ms, t);
  CHECK(s.is_member(1, "node-1"));
  CHECK_FALSE(s.is_member(1, "stranger"));
  CHECK_FALSE(s.is_member(0, "stranger"));
  // A forged goodbye for rank 1, then rank 1 stops: it is still declared gone.
  s.on_bye(1, "stranger");
  CHECK_FALSE(s.settled(1));
  // Forged heartbeats for rank 2 do not hide its silence.
  CHECK(s.on_beat(1, t + 50ms, "node-1"));
  CHECK_FALSE(s.on_beat(2, t + 650ms, "stranger"));
  CHECK_FALSE(s.on_beat(0, t + 650ms, "stranger"));
  CHECK(checks(s, t, t + 600ms).empty());
  auto verdicts = s.check(t + 700ms);
  REQUIRE(verdicts.size() == 2);
  CHECK(verdicts[0].rank == 1);
  CHECK(verdicts[1].rank == 2);
  CHECK(verdicts[0].tell == std::vector<int>{1});  // only rank 1's real watcher registered
}

TEST_CASE("a worker that said goodbye is never declared gone") {
  auto s = watched_cluster();
  s.on_bye(1);
  CHECK(s.settled(1));
  auto verdicts = checks(s, t0, t0 + 2s);
  REQUIRE(verdicts.size() == 1);
  CHECK(verdicts[0].rank == 2);
  CHECK_FALSE(s.on_connection_closed(1));
}

TEST_CASE("a closed connection declares its worker gone and tells every other watcher") {
  auto s = watched_cluster();
  auto v = s.on_connection_closed(1);
  REQUIRE(v);
  CHECK(v->rank == 1);
  CHECK(v->reason == task(1) + "'s connection to the chief closed (the process ended or its host is unreachable)");
  CHECK(v->tell == std::vector<int>{0, 2});
  CHECK_FALSE(s.on_connection_closed(1));  // once
  // Rank 1's watcher is gone: later verdicts are not sent there.
  auto w = s.on_connection_closed(2);
  REQUIRE(w);
  CHECK(w->tell == std::vector<int>{0});
  CHECK(checks(s, t0, t0 + 2s).empty());  // both settled: no second verdict for either
}

TEST_CASE("a watcher that beats again after its connection closed is registered again") {
  auto s = watched_cluster();
  s.on_bye(1);
  CHECK_FALSE(s.on_connection_closed(1));
  CHECK(s.on_beat(1, t0));
}

// --- the table a worker receives ---

TEST_CASE("check_peer_table accepts the table the chief builds, for the chief and for workers") {
  for (int rank : {0, 1, 2}) CHECK(check_peer_table(options_for(3, rank), good_table(3)) == std::nullopt);
}

TEST_CASE("check_peer_table refuses a table with more or fewer entries than the cluster has workers") {
  auto more = good_table(3);
  more.push_back(more.back());
  CHECK(table_error(more) == "rendezvous failed: the peer table from the chief " + task(0) +
                                 " has 4 entries, this cluster has 3 workers (the same TF_CONFIG on every worker?)");
  auto fewer = good_table(3);
  fewer.pop_back();
  CHECK(table_error(fewer).find(" has 2 entries, this cluster has 3 workers") != std::string::npos);
  CHECK(table_error({}).find(" has 0 entries") != std::string::npos);
}

TEST_CASE("check_peer_table refuses entries out of rank order or naming other tasks") {
  auto swapped = good_table(3);
  std::swap(swapped[1], swapped[2]);
  CHECK(table_error(swapped) == "rendezvous failed: the peer table from the chief " + task(0) +
                                    " entry 1 has rank 2 (expected 1: entries in rank order)");
  auto renamed = good_table(3);
  renamed[2].task = "/job:ps/replica:0/task:0";
  CHECK(table_error(renamed) == "rendezvous failed: the peer table from the chief " + task(0) +
                                    " entry 2 names task '/job:ps/replica:0/task:0', this worker knows rank 2 as " +
                                    task(2) + " (the same TF_CONFIG on every worker?)");
}

TEST_CASE("check_peer_table refuses ports, hosts and device counts out of range") {
  auto port = good_table(3);
  port[2].data_port = 0;
  CHECK(table_error(port) == "rendezvous failed: the peer table from the chief " + task(0) + " entry 2 (" + task(2) +
                                 ") has data-plane port 0 (expected 1..65535)");
  auto empty_host = good_table(3);
  empty_host[0].data_host.clear();
  CHECK(table_error(empty_host).find("entry 0 (" + task(0) + ") has a data-plane host of 0 characters (expected "
                                                             "1..255)") != std::string::npos);
  auto long_host = good_table(3);
  long_host[2].data_host = std::string(300, 'x');
  CHECK(table_error(long_host).find("has a data-plane host of 300 characters (expected 1..255)") != std::string::npos);
  auto devices = good_table(3);
  devices[2].devices = -5;
  CHECK(table_error(devices).find("entry 2 (" + task(2) + ") has -5 devices, this worker 2 (expected the same on "
                                                          "every worker)") != std::string::npos);
}

TEST_CASE("check_peer_table refuses a host with a NUL and echoes a long task name cut short") {
  auto nul = good_table(3);
  nul[2].data_host = std::string("10.0.0.3\0", 9);
  CHECK(table_error(nul) == "rendezvous failed: the peer table from the chief " + task(0) + " entry 2 (" + task(2) +
                                ") has the data-plane host '10.0.0.3\\0', which has a NUL character");
  auto long_task = good_table(3);
  long_task[1].task = std::string(120'000, 't');
  CHECK(table_error(long_task) == "rendezvous failed: the peer table from the chief " + task(0) +
                                      " entry 1 names task '" + std::string(64, 't') +
                                      "...' (120000 bytes), this worker knows rank 1 as " + task(1) +
                                      " (the same TF_CONFIG on every worker?)");
}

TEST_CASE("check_peer_table accepts a collective id only in the chief's entry, hex and bounded") {
  auto elsewhere = good_table(3);
  elsewhere[1].collective_id = "00";
  CHECK(table_error(elsewhere).find("entry 1 (" + task(1) + ") has a collective id (expected one only in the "
                                                            "chief's entry)") != std::string::npos);
  auto not_hex = good_table(3);
  not_hex[0].collective_id = "00|1";
  CHECK(table_error(not_hex).find("entry 0 (" + task(0) + ") has a collective id with '|' at 2 (expected hex "
                                                          "digits only)") != std::string::npos);
  auto too_long = good_table(3);
  too_long[0].collective_id = std::string(1025, 'a');
  CHECK(table_error(too_long).find("has a collective id of 1025 characters (expected at most 1024)") !=
        std::string::npos);
  auto longest = good_table(3);
  longest[0].collective_id = std::string(1024, 'a');
  CHECK(table_error(longest).empty());
}

TEST_CASE("check_peer_table wants the chief's incarnation, 32 hex digits, in its entry only") {
  auto elsewhere = good_table(3);
  elsewhere[2].incarnation = elsewhere[0].incarnation;
  CHECK(table_error(elsewhere).find("entry 2 (" + task(2) + ") has an incarnation (expected one only in the "
                                                            "chief's entry)") != std::string::npos);
  auto none = good_table(3);
  none[0].incarnation.clear();
  CHECK(table_error(none).find("entry 0 (" + task(0) + ") has an incarnation of 0 characters (expected 32 hex "
                                                       "digits)") != std::string::npos);
  auto not_hex = good_table(3);
  not_hex[0].incarnation[5] = 'z';
  CHECK(table_error(not_hex).find("has an incarnation of 32 characters (expected 32 hex digits)") != std::string::npos);
}

TEST_CASE("rendezvous_state gives every start a new incarnation") {
  rendezvous_state a(options_for(3));
  rendezvous_state b(options_for(3));
  CHECK(a.table()[0].incarnation.size() == 32);
  CHECK(a.table()[0].incarnation != b.table()[0].incarnation);
  CHECK(a.table()[1].incarnation.empty());
}

TEST_CASE("check_peer_table refuses a table whose entry for this worker is not what it sent") {
  auto moved = good_table(3);
  moved[1].data_port = 50001;
  CHECK(table_error(moved, 1) == "rendezvous failed: the peer table from the chief " + task(0) +
                                     " gives this worker (" + task(1) +
                                     ") the data plane 10.0.0.2:50001, it sent 10.0.0.2:40001");
  CHECK(table_error(moved, 2).empty());  // another worker cannot tell
  auto rehosted = good_table(3);
  rehosted[2].data_host = "10.9.9.9";
  CHECK(table_error(rehosted, 2).find("gives this worker (" + task(2) + ") the data plane 10.9.9.9:40002, it sent "
                                                                        "10.0.0.3:40002") != std::string::npos);
  CHECK(table_error(good_table(3), 3).find("has no entry for this worker's rank 3 (expected 0..2)") !=
        std::string::npos);
}

// --- a worker's own options ---

TEST_CASE("check_options accepts a worker's options and names each value out of range") {
  CHECK(options_error(options_for(3, 1)).empty());
  auto chief = options_for(3, 0);
  chief.chief_port = 0;  // the chief may listen on any port
  CHECK(options_error(chief).empty());

  CHECK(options_error(rendezvous_options{}) == "rendezvous: no workers");
  auto o = options_for(3, 1);
  o.devices = 0;
  CHECK(options_error(o) == "rendezvous: " + task(1) + ": devices is 0 (expected at least 1)");
  o = options_for(3, 1);
  o.data_port = 0;
  CHECK(options_error(o) == "rendezvous: " + task(1) +
                                ": data_port is 0 (expected 1..65535: the port its data listener is bound to)");
  o = options_for(3, 1);
  o.data_host.clear();
  CHECK(options_error(o) == "rendezvous: " + task(1) + ": data_host has 0 characters (expected 1..255)");
  o = options_for(3, 2);
  o.chief_port = 0;
  CHECK(options_error(o) == "rendezvous: " + task(2) +
                                ": chief_port is 0 (expected 1..65535: the chief's port in TF_CONFIG)");
  o = options_for(3, 1);
  o.timeout = 0ms;
  CHECK(options_error(o) == "rendezvous: " + task(1) + ": timeout is 0 ms (expected at least 1)");
  o = options_for(3, 1);
  o.missed_heartbeats = 0;
  CHECK(options_error(o) == "rendezvous: " + task(1) + ": missed_heartbeats is 0 (expected 1..1000)");
  o = options_for(3, 1);
  o.connect_retry = 0ms;
  CHECK(options_error(o) == "rendezvous: " + task(1) + ": connect_retry is 0 ms (expected at least 1)");
  o = options_for(3, 1);
  o.failure_linger = -1ms;
  CHECK(options_error(o) == "rendezvous: " + task(1) +
                                ": answer_margin and failure_linger are 5000 and -1 ms (expected 0 or more)");
  o = options_for(3, 0);
  o.collective_id = "12g4";
  CHECK(options_error(o) == "rendezvous: " + task(0) + ": collective_id has 'g' at 2 (expected hex digits only)");
  o.collective_id = std::string(1026, 'f');
  CHECK(options_error(o) == "rendezvous: " + task(0) +
                                ": collective_id has 1026 characters (expected at most 1024 hex digits)");
  o = options_for(3, 7);
  o.devices = -1;
  CHECK(options_error(o) == "rendezvous: the worker of rank 7: devices is -1 (expected at least 1)");
}

TEST_CASE("rendezvous_options keep the documented defaults") {
  rendezvous_options o;
  CHECK(o.missed_heartbeats == 6);
  CHECK(o.connect_retry == 50ms);
  CHECK(o.answer_margin == 5000ms);
  CHECK(o.failure_linger == 300ms);
  CHECK(o.timeout == 60000ms);
}

// --- joining a running cluster ---

TEST_CASE("a request to join a running cluster is checked alone: token, version, devices, endpoint, a running watch") {
  auto o = options_for(3);
  rendezvous_state starting(o);
  auto early = join_of(starting, 2, "early");
  check_refused(starting.check_enlist(early, task(2)), rendezvous_errc::bad_join,
                "rendezvous: refused a worker asking to join as '" + task(2) +
                    "': the cluster is not running yet (a worker of its start joins without asking)");
  rendezvous_state s = watched_cluster();
  auto good = join_of(s, 2, "n-good");
  CHECK_FALSE(s.check_enlist(good, task(2)).has_value());
  // Its nonce is spent: the same request again fails the proof, and so does a stranger's.
  check_refused(s.check_enlist(good, task(2)), rendezvous_errc::bad_token,
                "rendezvous: refused a worker asking to join as '" + task(2) +
                    "': it failed the cluster token check (a stranger, or a worker with another "
                    "TROUPE_CLUSTER_TOKEN: set the cluster's)");
  auto stranger = join_of(s, 2, "n-stranger");
  stranger.proof = hmac_sha256_hex("not-the-token", "n-stranger");
  CHECK(s.check_enlist(stranger, task(2))->code == rendezvous_errc::bad_token);
  auto old = join_of(s, 2, "n-version");
  old.version = o.version - 1;
  CHECK(s.check_enlist(old, task(2))->code == rendezvous_errc::protocol_mismatch);
  auto devices = join_of(s, 2, "n-devices");
  devices.devices = 3;
  CHECK(s.check_enlist(devices, task(2))->message.find("it has 3 devices, " + task(0) + " has 2") != std::string::npos);
  auto port = join_of(s, 2, "n-port");
  port.data_port = 0;
  CHECK(s.check_enlist(port, task(2))->message.find("data-plane port 0") != std::string::npos);
  // A refusal changes nothing: the cluster is as it was, and fails nobody.
  CHECK_FALSE(s.failure().has_value());
  CHECK(s.table().size() == 3);
}

TEST_CASE("an admitted joiner is watched under a new id: its beats count from its own peer, its silence is a verdict") {
  rendezvous_state s = watched_cluster();
  // Task 2 was lost; its replacement joins under id 3 (ids are never reused).
  REQUIRE(s.on_connection_closed(2).has_value());
  member m{-1, task(2), "10.0.0.9", 40009, 2, {}, {}};
  const int id = s.add_member(m, "joiner-node", t0 + 200ms);
  CHECK(id == 3);
  CHECK(s.table().size() == 4);
  CHECK(s.table()[3].rank == 3);
  CHECK(s.is_member(3, "joiner-node"));
  CHECK_FALSE(s.on_beat(3, t0 + 250ms, "someone-else"));
  CHECK(s.on_beat(3, t0 + 250ms, "joiner-node"));  // its first: monitor its watcher
  // Checked every interval, ranks 0 and 1 beating: the joiner, silent from 250 ms, is declared
  // gone past missed_heartbeats (6) intervals.
  std::vector<verdict> verdicts;
  for (auto t = t0 + 100ms; t <= t0 + 900ms && verdicts.empty(); t += 100ms) {
    for (int r = 0; r < 2; ++r) s.on_beat(r, t);
    verdicts = s.check(t);
  }
  REQUIRE(verdicts.size() == 1);
  CHECK(verdicts[0].rank == 3);
  CHECK(verdicts[0].reason.rfind(task(2) + " sent no heartbeat for ", 0) == 0);
}

}  // namespace TROUPE_TEST_FILE
