#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../common/free_port.hpp"
#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "troupe/actors/rendezvous.hpp"

using namespace troupe::actors;
using troupe::testing::free_port;
using namespace std::chrono_literals;

namespace {

struct node {
  node() {
    cfg.load<caf::io::middleman>();
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
  auto results = run(cluster(3));
  for (const auto& r : results) CHECK(r == "table of 3");
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

TEST_CASE("a worker without the cluster token fails every worker, and the token never travels") {
  auto options = cluster(2);
  options[1].token = "guess";
  auto results = run(options);
  for (const auto& r : results) CHECK(r.find("task:1 failed the cluster token check") != std::string::npos);
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
