// A stranger that speaks troupe's control messages over plain CAF/BASP, for run_cluster.sh: it
// reaches a chief that runs without a token (loopback, insecure) and forges what a member sends.
// Usage: mw_attacker forge HOST PORT RANK SECONDS
//          every 50 ms for SECONDS: a goodbye for RANK, then a heartbeat for RANK naming itself
//        mw_attacker fault HOST PORT RANK SECONDS
//          every 50 ms for SECONDS: a fault report for RANK (workers out of step), as a member
//          that found one sends it
//        mw_attacker nonce-flood HOST PORT COUNT
//          COUNT nonce requests, without ever joining
//        mw_attacker bad-join HOST PORT RANK
//          asks for a nonce and joins as RANK with a proof made from another token; prints the
//          chief's answer ("attacker: refused <message>" or "attacker: accepted")
// Prints "attacker: connected" once it reached the chief, "attacker: done <n>" at the end.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "troupe/actors/rendezvous.hpp"  // the protocol version it speaks
#include "caf/all.hpp"
#include "caf/io/all.hpp"

namespace {

using nonce_atom = caf::atom_constant<caf::atom("nonce")>;
using beat_atom = caf::atom_constant<caf::atom("beat")>;
using bye_atom = caf::atom_constant<caf::atom("bye")>;
using join_atom = caf::atom_constant<caf::atom("join")>;
using fault_atom = caf::atom_constant<caf::atom("fault")>;

caf::actor reach(caf::actor_system& sys, const std::string& host, std::uint16_t port) {
  for (int i = 0; i < 3000; ++i) {
    if (auto a = sys.middleman().remote_actor(host, port)) return *a;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::cerr << "attacker: never reached " << host << ":" << port << std::endl;
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::cerr << "usage: mw_attacker forge HOST PORT RANK SECONDS | nonce-flood HOST PORT COUNT\n";
    return 2;
  }
  const std::string mode = argv[1], host = argv[2];
  const auto port = static_cast<std::uint16_t>(std::atoi(argv[3]));
  caf::actor_system_config cfg;
  cfg.load<caf::io::middleman>();
  caf::actor_system sys{cfg};
  caf::actor chief = reach(sys, host, port);
  std::cout << "attacker: connected" << std::endl;
  caf::scoped_actor self{sys};
  long n = 0;
  if (mode == "forge") {
    const auto rank = static_cast<std::int32_t>(std::atoi(argv[4]));
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(argc > 5 ? std::atoi(argv[5]) : 10);
    while (std::chrono::steady_clock::now() < until) {
      self->send(chief, bye_atom::value, rank);
      // A beat as a member's heartbeat sends it, with the report and the position beside it (a
      // position that would name rank 0 as stalled in a collective for an hour).
      self->send(chief, beat_atom::value, rank, caf::actor_cast<caf::actor>(self), 12.5, std::int64_t{1} << 20,
                 std::uint64_t{1}, std::vector<std::string>{"forged line"}, std::int32_t{3}, std::uint64_t{1},
                 std::int64_t{0}, std::int32_t{1}, std::int32_t{0}, std::uint64_t{16}, std::int64_t{3600000},
                 std::int32_t{-1}, std::int64_t{-1}, std::uint64_t{0}, std::uint64_t{0});
      ++n;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } else if (mode == "fault") {
    const auto rank = static_cast<std::int32_t>(std::atoi(argv[4]));
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(argc > 5 ? std::atoi(argv[5]) : 10);
    while (std::chrono::steady_clock::now() < until) {
      self->send(chief, fault_atom::value, rank,
                 std::string("forged: rank 1 is at step 9, collective 9, rank 0 at step 1, collective 0"));
      ++n;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } else if (mode == "nonce-flood") {
    const long count = std::atol(argv[4]);
    for (n = 0; n < count; ++n) caf::anon_send(chief, nonce_atom::value);
    // One answered request at the end: the chief has handled the whole flood by then.
    self->request(chief, std::chrono::seconds(30), nonce_atom::value)
        .receive([](const std::string&) {}, [](caf::error&) {});
  } else if (mode == "bad-join") {
    std::string nonce;
    self->request(chief, std::chrono::seconds(10), nonce_atom::value)
        .receive([&](const std::string& n) { nonce = n; }, [](caf::error&) {});
    // 64 hex digits, as an HMAC-SHA256 proof looks, but not made from the cluster's token.
    const std::string proof(64, 'a');
    self->request(chief, std::chrono::seconds(10), join_atom::value, troupe::actors::rendezvous_options{}.version,
                  static_cast<std::int32_t>(std::atoi(argv[4])), nonce, proof, std::int32_t{1},
                  std::string("127.0.0.1"), std::uint16_t{9})
        .receive([&](const caf::message&) { std::cout << "attacker: accepted" << std::endl; },
                 [&](caf::error& e) { std::cout << "attacker: refused " << sys.render(e) << std::endl; });
    n = 1;
  } else {
    std::cerr << "attacker: unknown mode " << mode << "\n";
    return 2;
  }
  std::cout << "attacker: done " << n << std::endl;
  return 0;
}
