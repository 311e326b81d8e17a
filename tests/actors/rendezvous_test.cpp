#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../common/free_port.hpp"
#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "caf/openssl/manager.hpp"
#include "troupe/actors/cluster_health.hpp"
#include "troupe/actors/rendezvous.hpp"
#include "troupe/actors/worker_report.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::actors;
using troupe::testing::free_port;
using namespace std::chrono_literals;

namespace {

struct node {
  node() {
    cfg.load<caf::io::middleman>();
    cfg.load<caf::openssl::manager>();  // a cluster token runs the control plane over TLS
    add_rendezvous_types(cfg);
    system = std::make_unique<caf::actor_system>(cfg);
  }
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> system;
};

// Runs the rendezvous of `options.size()` workers, each in its own actor system (as in separate
// processes), and returns what each got: its table size, or the error.
std::vector<std::string> run(std::vector<rendezvous_options> options) {
  std::vector<std::string> results(options.size());
  std::vector<std::unique_ptr<node>> nodes;
  for (std::size_t i = 0; i < options.size(); ++i) nodes.push_back(std::make_unique<node>());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < options.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        auto table = rendezvous(*nodes[i]->system, options[i]);
        results[i] = "table of " + std::to_string(table.size());
      } catch (const std::exception& e) {
        results[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

// Runs the rendezvous like run(), worker i starting after delays[i], and returns the tables
// (empty for a worker that failed; its error goes to `errors`).
std::vector<std::vector<member>> run_tables(const std::vector<rendezvous_options>& options,
                                            const std::vector<std::chrono::milliseconds>& delays,
                                            std::vector<std::string>& errors) {
  std::vector<std::vector<member>> tables(options.size());
  errors.assign(options.size(), "");
  std::vector<std::unique_ptr<node>> nodes;
  for (std::size_t i = 0; i < options.size(); ++i) nodes.push_back(std::make_unique<node>());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < options.size(); ++i) {
    threads.emplace_back([&, i] {
      std::this_thread::sleep_for(delays[i]);
      try {
        tables[i] = rendezvous(*nodes[i]->system, options[i]);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return tables;
}

// A loopback TCP relay that records every byte each way: what a worker talking to the chief
// through it puts on the wire. It listens on port() and forwards each connection to `target`.
class wire_tap {
 public:
  explicit wire_tap(std::uint16_t target) : target_(target) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = loopback(0);
    REQUIRE(bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(listen(listener_, 8) == 0);
    socklen_t len = sizeof addr;
    getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { relay(); });
  }
  ~wire_tap() {
    stop_ = true;
    thread_.join();
    close(listener_);
  }
  wire_tap(const wire_tap&) = delete;
  wire_tap& operator=(const wire_tap&) = delete;

  std::uint16_t port() const { return port_; }
  /// Everything the connecting side sent, and everything it received.
  std::string sent() {
    std::lock_guard<std::mutex> lock(mutex_);
    return sent_;
  }
  std::string received() {
    std::lock_guard<std::mutex> lock(mutex_);
    return received_;
  }

 private:
  static sockaddr_in loopback(std::uint16_t port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    return addr;
  }

  // One thread polls the listener and every open pair: {client, server} sockets.
  void relay() {
    std::vector<std::pair<int, int>> pairs;
    while (!stop_) {
      std::vector<pollfd> fds{{listener_, POLLIN, 0}};
      for (const auto& p : pairs) {
        fds.push_back({p.first, POLLIN, 0});
        fds.push_back({p.second, POLLIN, 0});
      }
      if (poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int client = accept(listener_, nullptr, nullptr);
        const int server = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in addr = loopback(target_);
        if (client >= 0 && connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
          pairs.emplace_back(client, server);
        } else {
          if (client >= 0) close(client);
          close(server);
        }
        continue;  // fds no longer matches pairs
      }
      std::vector<std::pair<int, int>> open;
      for (std::size_t i = 0; i < pairs.size(); ++i) {
        const bool ok = pump(fds[1 + 2 * i], pairs[i].second, true) && pump(fds[2 + 2 * i], pairs[i].first, false);
        if (ok) {
          open.push_back(pairs[i]);
        } else {
          close(pairs[i].first);
          close(pairs[i].second);
        }
      }
      pairs = open;
    }
    for (const auto& p : pairs) {
      close(p.first);
      close(p.second);
    }
  }

  // Moves what `from` has to `to`, recording it; false when the connection ended.
  bool pump(const pollfd& from, int to, bool from_client) {
    if ((from.revents & (POLLIN | POLLHUP | POLLERR)) == 0) return true;
    char bytes[65536];
    const ssize_t got = read(from.fd, bytes, sizeof bytes);
    if (got <= 0) return false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      (from_client ? sent_ : received_).append(bytes, static_cast<std::size_t>(got));
    }
    for (ssize_t done = 0; done < got;) {
      const ssize_t n = write(to, bytes + done, static_cast<std::size_t>(got - done));
      if (n <= 0) return false;
      done += n;
    }
    return true;
  }

  std::uint16_t target_;
  std::uint16_t port_ = 0;
  int listener_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mutex_;
  std::string sent_, received_;
};

// Every run of exactly 32 lowercase hex digits in `bytes`: the candidates for a 16-byte nonce.
std::vector<std::string> hex32_runs(const std::string& bytes) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < bytes.size()) {
    std::size_t j = i;
    while (j < bytes.size() && (std::isdigit(static_cast<unsigned char>(bytes[j])) || (bytes[j] >= 'a' && bytes[j] <= 'f'))) ++j;
    if (j - i == 32) out.push_back(bytes.substr(i, 32));
    i = j + 1;
  }
  return out;
}

std::vector<rendezvous_options> cluster(int n) {
  const std::uint16_t port = free_port();
  std::vector<rendezvous_options> out;
  for (int r = 0; r < n; ++r) {
    rendezvous_options o;
    o.rank = r;
    for (int t = 0; t < n; ++t) o.tasks.push_back("/job:worker/replica:0/task:" + std::to_string(t));
    o.chief_host = "127.0.0.1";
    o.chief_port = port;
    o.data_host = "127.0.0.1";
    o.data_port = static_cast<std::uint16_t>(40000 + r);
    o.token = "shared";
    o.timeout = 5000ms;
    out.push_back(o);
  }
  return out;
}

}  // namespace

TEST_CASE("rendezvous gives every worker the peer table in rank order") {
  auto options = cluster(3);
  options[1].devices = options[2].devices = options[0].devices = 2;
  options[0].data_host = "chief.test";
  options[1].data_host = "first-worker.test";
  options[2].data_host = "second-worker.test";
  // Task 2 joins well before task 1: the table still lists them by rank.
  std::vector<std::string> errors;
  auto tables = run_tables(options, {0ms, 600ms, 0ms}, errors);
  for (std::size_t w = 0; w < tables.size(); ++w) {
    CAPTURE(w);
    CHECK(errors[w] == "");
    REQUIRE(tables[w].size() == 3);
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r);
      const member& m = tables[w][static_cast<std::size_t>(r)];
      CHECK(m.rank == r);
      CHECK(m.task == "/job:worker/replica:0/task:" + std::to_string(r));
      CHECK(m.data_host == options[static_cast<std::size_t>(r)].data_host);
      CHECK(m.data_port == 40000 + r);
      CHECK(m.devices == 2);
      CHECK(m.collective_id.empty());
    }
  }
}

TEST_CASE("the cluster token never travels: a joining worker sends the HMAC proof of the chief's nonce, not the token") {
  auto options = cluster(2);
  const std::string token = "troupe-test-token-7f3a9c1e";
  for (auto& o : options) o.token = token;
  options[1].data_host = "worker-data-plane.test";
  wire_tap tap(options[0].chief_port);
  options[1].chief_port = tap.port();  // the worker reaches the chief through the tap
  std::vector<std::string> errors;
  auto tables = run_tables(options, {0ms, 0ms}, errors);
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  REQUIRE(tables[1].size() == 2);
  const std::string sent = tap.sent();
  const std::string received = tap.received();
  // With a token the control plane is mutual TLS: the tap saw neither the token nor the join's
  // fields (the worker's data-plane host) in clear.
  CHECK(sent.find("worker-data-plane.test") == std::string::npos);
  CHECK(sent.find(token) == std::string::npos);
  CHECK(received.find(token) == std::string::npos);
  CHECK(hex32_runs(received).empty());  // nor the chief's nonce
  CHECK(sent.size() > 100);  // but it did carry the handshake and the join
}

TEST_CASE("every worker receives the chief's collective id (the ncclUniqueId) with the peer table") {
  auto options = cluster(3);
  const std::string id(256, 'a');
  options[0].collective_id = id.substr(0, 250) + "0f9e3d";
  std::vector<std::unique_ptr<node>> nodes;
  for (std::size_t i = 0; i < options.size(); ++i) nodes.push_back(std::make_unique<node>());
  std::vector<std::vector<member>> tables(options.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < options.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        tables[i] = rendezvous(*nodes[i]->system, options[i]);
      } catch (const std::exception&) {
        tables[i].clear();  // the size check below reports it
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& table : tables) {
    REQUIRE(table.size() == 3);
    CHECK(table[0].collective_id == options[0].collective_id);
    CHECK(table[1].collective_id.empty());
    CHECK(table[2].data_port == 40002);
  }
}

TEST_CASE("a worker that speaks another protocol version fails every worker, named") {
  auto options = cluster(2);
  options[1].version = options[0].version + 1;
  auto results = run(options);
  const std::string expected = "/job:worker/replica:0/task:1 speaks rendezvous protocol version " +
                               std::to_string(options[0].version + 1) + ", the chief " +
                               std::to_string(options[0].version);
  for (const auto& r : results) CHECK(r.find(expected) != std::string::npos);
}

TEST_CASE("a worker with another cluster token never reaches the chief: it is missing, and names the token - the proof is HMAC-SHA256 (RFC 4231)") {
  auto options = cluster(2);
  options[1].token = "guess";
  for (auto& o : options) o.timeout = 800ms;
  auto results = run(options);
  CHECK(results[0].find("still missing after 800 ms: /job:worker/replica:0/task:1") != std::string::npos);
  CHECK(results[1].find("could not reach the chief") != std::string::npos);
  CHECK(results[1].find("TROUPE_CLUSTER_TOKEN") != std::string::npos);
  CHECK(hmac_sha256_hex("shared", "nonce") != hmac_sha256_hex("guess", "nonce"));
  // RFC 4231 test case 2.
  CHECK(hmac_sha256_hex("Jefe", "what do ya want for nothing?") ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST_CASE("two processes claiming one task index are refused") {
  auto options = cluster(3);
  options[2].rank = 1;
  auto results = run(options);
  CHECK(results[0].find("joined twice") != std::string::npos);
}

TEST_CASE("a worker that never arrives is named when the start timeout ends") {
  auto options = cluster(3);
  options.pop_back();  // task 2 never starts
  for (auto& o : options) o.timeout = 800ms;
  auto results = run(options);
  for (const auto& r : results) CHECK(r.find("still missing after 800 ms: /job:worker/replica:0/task:2") != std::string::npos);
}

TEST_CASE("the chief's cluster health hears every worker's heartbeats, a fault report and a goodbye") {
  auto options = cluster(2);
  auto health = std::make_shared<cluster_health>();
  options[0].health = health;
  node chief, worker;
  std::vector<std::unique_ptr<cluster_watch>> watches(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      try {
        rendezvous(*(i == 0 ? chief : worker).system, options[static_cast<std::size_t>(i)], 50ms,
                   [](int, const std::string&) {}, watches[static_cast<std::size_t>(i)]);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(i)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(errors[0] == "");
  REQUIRE(errors[1] == "");
  // Both workers beat every 50 ms: the chief hears each, and neither is late.
  auto heard_both = [&] {
    const auto s = health->snapshot(cluster_health::clock::now());
    return s.watching && s.workers.size() == 2 && s.workers[0].heard && s.workers[1].heard;
  };
  for (int i = 0; i < 200 && !heard_both(); ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(heard_both());
  auto s = health->snapshot(cluster_health::clock::now());
  CHECK(s.interval == 50ms);
  CHECK(s.incarnation.size() == 32);
  CHECK(s.workers[1].task == "/job:worker/replica:0/task:1");
  CHECK(s.workers[1].state == worker_state::alive);
  // A fault report from worker 1 reaches the chief's record with its text.
  watches[1]->report_fault("rank 1 found the workers out of step", 2000ms);
  s = health->snapshot(cluster_health::clock::now());
  REQUIRE_FALSE(s.events.empty());
  CHECK(s.events[0].kind == cluster_event_kind::fault_reported);
  CHECK(s.events[0].rank == 1);
  CHECK(s.events[0].text == "rank 1 found the workers out of step");
  // Worker 1 leaves cleanly: left, never lost.
  watches[1].reset();
  for (int i = 0; i < 200 && health->snapshot(cluster_health::clock::now()).workers[1].state != worker_state::left; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  std::this_thread::sleep_for(200ms);  // past the chief's next checks
  s = health->snapshot(cluster_health::clock::now());
  CHECK(s.workers[1].state == worker_state::left);
  for (const auto& e : s.events) CHECK(e.kind != cluster_event_kind::worker_lost);
  watches[0].reset();
}

TEST_CASE("a chief or a worker whose program ends is not taken for a lost one, even when its process ends at once") {
  // The watch ends as its program does, and its actor system (its connections) right after, as a
  // process's exit takes them: the other side, maybe still finishing a collective with the rest,
  // hears first that it left on purpose (the worker's goodbye; the chief's word to every watcher,
  // answered) and reports no loss.
  for (int round = 0; round < 6; ++round) {
    const int ending = round % 2;  // the chief, then a worker
    auto options = cluster(2);
    std::vector<std::unique_ptr<node>> nodes;
    nodes.push_back(std::make_unique<node>());
    nodes.push_back(std::make_unique<node>());
    std::vector<std::unique_ptr<cluster_watch>> watches(2);
    std::vector<std::string> errors(2);
    std::atomic<int> reported{0};
    std::string reason;
    std::mutex mutex;
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        try {
          rendezvous(*nodes[static_cast<std::size_t>(i)]->system, options[static_cast<std::size_t>(i)], 50ms,
                     [&](int rank, const std::string& why) {
                       std::lock_guard<std::mutex> lock(mutex);
                       if (reason.empty()) reason = "rank " + std::to_string(rank) + ": " + why;
                       ++reported;
                     },
                     watches[static_cast<std::size_t>(i)]);
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(i)] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    REQUIRE(errors[0] == "");
    REQUIRE(errors[1] == "");
    std::this_thread::sleep_for(100ms);  // a few beats both ways
    watches[static_cast<std::size_t>(ending)].reset();
    nodes[static_cast<std::size_t>(ending)].reset();
    std::this_thread::sleep_for(400ms);  // past the other's bound on a silent peer (50 ms x 4)
    {
      std::lock_guard<std::mutex> lock(mutex);
      INFO("round " << round << " (" << (ending == 0 ? "the chief" : "a worker") << " ends): " << reason);
      CHECK(reported.load() == 0);
    }
    watches[static_cast<std::size_t>(1 - ending)].reset();
  }
}

TEST_CASE("every heartbeat carries its worker's CPU, memory and new log lines to the chief's cluster health") {
  auto options = cluster(2);
  auto health = std::make_shared<cluster_health>();
  options[0].health = health;
  auto tail = std::make_shared<log_tail>();
  options[1].log = tail;
  tail->add("paused after step 7");
  node chief, worker;
  std::vector<std::unique_ptr<cluster_watch>> watches(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      try {
        rendezvous(*(i == 0 ? chief : worker).system, options[static_cast<std::size_t>(i)], 50ms,
                   [](int, const std::string&) {}, watches[static_cast<std::size_t>(i)]);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(i)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(errors[0] == "");
  REQUIRE(errors[1] == "");
  auto worker1 = [&] { return health->snapshot(cluster_health::clock::now()).workers.at(1); };
  auto wait = [&](auto done) {
    for (int i = 0; i < 300 && !done(); ++i) std::this_thread::sleep_for(10ms);
    return done();
  };
  REQUIRE(wait([&] { return health->snapshot(cluster_health::clock::now()).watching && worker1().reported; }));
  // The line said before the first beat arrives, though that beat came before the watch began.
  CHECK(worker1().report.lines == std::vector<std::string>{"paused after step 7"});
  CHECK(worker1().report.rss_bytes > 1 << 20);  // a process holds more than a MiB
  // From the second sample on (200 ms apart at least), the CPU is known.
  REQUIRE(wait([&] { return worker1().report.cpu_percent >= 0; }));
  // A line said later comes with a later beat, the earlier ones kept beside it.
  tail->add("resumed after step 7");
  REQUIRE(wait([&] { return worker1().report.lines_total == 2; }));
  CHECK(worker1().report.lines == std::vector<std::string>{"paused after step 7", "resumed after step 7"});
  watches[1].reset();
  watches[0].reset();
}

TEST_CASE("the chief refuses a member's heartbeat report that breaks a bound, logs it, and keeps the last good one") {
  // Worker 1 is played by hand, speaking the protocol as a member's process does, so that it can
  // send what no troupe worker sends. Without a token: plain BASP on loopback.
  using nonce_atom = caf::atom_constant<caf::atom("nonce")>;
  using join_atom = caf::atom_constant<caf::atom("join")>;
  using beat_atom = caf::atom_constant<caf::atom("beat")>;
  auto options = cluster(2);
  for (auto& o : options) o.token.clear();
  auto health = std::make_shared<cluster_health>();
  options[0].health = health;
  node chief, worker;
  std::unique_ptr<cluster_watch> watch;
  std::string error;
  std::thread chief_thread([&] {
    try {
      rendezvous(*chief.system, options[0], 50ms, [](int, const std::string&) {}, watch);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  caf::scoped_actor self{*worker.system};
  caf::actor agent;
  for (int i = 0; i < 200 && !agent; ++i) {
    if (auto a = worker.system->middleman().remote_actor(options[0].chief_host, options[0].chief_port)) {
      agent = *a;
    } else {
      std::this_thread::sleep_for(20ms);
    }
  }
  REQUIRE(agent);
  std::string nonce;
  self->request(agent, 5s, nonce_atom::value).receive([&](std::string& n) { nonce = n; }, [](caf::error&) {});
  REQUIRE_FALSE(nonce.empty());
  std::size_t table = 0;
  self->request(agent, 10s, join_atom::value, options[1].version, std::int32_t{1}, nonce, hmac_sha256_hex("", nonce),
                std::int32_t{1}, options[1].data_host, options[1].data_port)
      .receive([&](std::vector<member>& t) { table = t.size(); }, [](caf::error&) {});
  chief_thread.join();
  REQUIRE(error == "");
  REQUIRE(table == 2);
  const auto watcher = caf::actor_cast<caf::actor>(self);
  // The position beside the beat: phase, step, collective, op, dtype, bytes, phase ms, ring peer,
  // ring idle ms, ring sent, ring received (the fields of worker_position, flat).
  using position = std::tuple<std::int32_t, std::uint64_t, std::int64_t, std::int32_t, std::int32_t, std::uint64_t,
                              std::int64_t, std::int32_t, std::int64_t, std::uint64_t, std::uint64_t>;
  auto beat = [&](double cpu, std::int64_t rss, std::uint64_t total, std::vector<std::string> lines,
                  position p = position{2, 3, -1, 0, -1, 0, 10, -1, -1, 0, 0}) {
    self->send(agent, beat_atom::value, std::int32_t{1}, watcher, cpu, rss, total, std::move(lines), std::get<0>(p),
               std::get<1>(p), std::get<2>(p), std::get<3>(p), std::get<4>(p), std::get<5>(p), std::get<6>(p),
               std::get<7>(p), std::get<8>(p), std::get<9>(p), std::get<10>(p));
  };
  auto worker1 = [&] { return health->snapshot(cluster_health::clock::now()).workers.at(1); };
  auto wait = [&](auto done) {
    for (int i = 0; i < 300 && !done(); ++i) std::this_thread::sleep_for(10ms);
    return done();
  };
  REQUIRE(wait([&] { return health->snapshot(cluster_health::clock::now()).watching; }));
  beat(12.5, 64 << 20, 1, {"epoch 1 done"});
  REQUIRE(wait([&] { return worker1().reported; }));
  CHECK(worker1().report.cpu_percent == 12.5);
  CHECK(worker1().report.lines == std::vector<std::string>{"epoch 1 done"});
  // Each bad report carries a line that would show if it were taken; a good beat after it (the
  // messages of one sender arrive in order) says when the chief has handled it. (A NaN or an
  // infinity cannot be sent: CAF 0.17 packs doubles by hand, and loops forever on an infinity.)
  const std::vector<std::pair<std::string, worker_report>> bad = {
      {"a negative CPU", worker_report{-0.5, 1, 2, {"taken"}}},
      {"a CPU beyond any machine", worker_report{1e12, 1, 2, {"taken"}}},
      {"memory below -1", worker_report{1, -7, 2, {"taken"}}},
      {"six lines", worker_report{1, 1, 9, std::vector<std::string>(6, "taken")}},
      {"more lines than the total", worker_report{1, 1, 1, {"taken", "taken"}}},
      {"a line of 257 bytes", worker_report{1, 1, 2, {std::string(257, 't')}}},
      {"a line that is not UTF-8", worker_report{1, 1, 2, {"taken \xFF"}}},
      {"a line with a newline", worker_report{1, 1, 2, {"taken\n<b>"}}},
  };
  double marker = 1;
  for (const auto& [what, report] : bad) {
    CAPTURE(what);
    beat(report.cpu_percent, report.rss_bytes, report.lines_total, report.lines);
    marker += 1;
    beat(marker, 64 << 20, 1, {});
    REQUIRE(wait([&] { return worker1().report.cpu_percent == marker; }));
    CHECK(worker1().report.lines == std::vector<std::string>{"epoch 1 done"});
    CHECK(worker1().report.lines_total == 1);
    CHECK(worker1().state == worker_state::alive);  // the beat itself still counts
  }
  // The refusals are in the chief's record, each naming what broke the bound (at powers of two of
  // the agent's refusals: at least the 1st, 2nd and 4th of these 7).
  const auto s = health->snapshot(cluster_health::clock::now());
  int refused = 0;
  for (const auto& e : s.events) {
    if (e.kind == cluster_event_kind::connection_refused &&
        e.text.find("refused the report beside a heartbeat of rank 1") != std::string::npos) {
      CHECK(e.text.find(" (expected ") != std::string::npos);
      ++refused;
    }
  }
  CHECK(refused >= 3);
  // A position beyond its bounds is refused alone and logged: the beat and its report still count.
  const std::vector<std::pair<std::string, position>> bad_positions = {
      {"a phase beyond collective", position{9, 3, -1, 0, -1, 0, 10, -1, -1, 0, 0}},
      {"an op beyond all_gather", position{3, 3, 0, 7, 0, 16, 10, -1, -1, 0, 0}},
      {"a dtype code beyond bfloat16", position{3, 3, 0, 1, 6, 16, 10, -1, -1, 0, 0}},
      {"a ring peer outside the cluster", position{3, 3, 0, 1, 0, 16, 10, 2, 5, 0, 0}},
      {"a negative wait", position{3, 3, 0, 1, 0, 16, -10, -1, -1, 0, 0}},
  };
  for (int round = 0; round < 2; ++round) {
    for (const auto& [what, p] : bad_positions) {
      CAPTURE(what);
      marker += 1;
      beat(marker, 64 << 20, 1, {}, p);
      REQUIRE(wait([&] { return worker1().report.cpu_percent == marker; }));
      CHECK(worker1().state == worker_state::alive);
    }
  }
  // Logged at powers of two of all the agent's refusals (the 16th is one of these), once the
  // middleman named the sender's address.
  auto refused_positions = [&] {
    int n = 0;
    for (const auto& e : health->snapshot(cluster_health::clock::now()).events) {
      if (e.kind == cluster_event_kind::connection_refused &&
          e.text.find("refused the position beside a heartbeat of rank 1 from ") != std::string::npos &&
          e.text.find(" (expected ") != std::string::npos) {
        ++n;
      }
    }
    return n;
  };
  CHECK(wait([&] { return refused_positions() >= 1; }));
  watch.reset();
}

}  // namespace TROUPE_TEST_FILE
