// A stranger that speaks troupe's control messages over plain CAF/BASP, for run_cluster.sh: it
// reaches a chief that runs without a token (loopback, insecure) and forges what a member sends.
// Usage: mw_attacker forge HOST PORT RANK SECONDS
//          every 50 ms for SECONDS: a goodbye for RANK, then a heartbeat for RANK naming itself
//        mw_attacker nonce-flood HOST PORT COUNT
//          COUNT nonce requests, without ever joining
// Prints "attacker: connected" once it reached the chief, "attacker: done <n>" at the end.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "caf/all.hpp"
#include "caf/io/all.hpp"

namespace {

using nonce_atom = caf::atom_constant<caf::atom("nonce")>;
using beat_atom = caf::atom_constant<caf::atom("beat")>;
using bye_atom = caf::atom_constant<caf::atom("bye")>;

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
      self->send(chief, beat_atom::value, rank, caf::actor_cast<caf::actor>(self));
      ++n;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } else if (mode == "nonce-flood") {
    const long count = std::atol(argv[4]);
    for (n = 0; n < count; ++n) caf::anon_send(chief, nonce_atom::value);
    // One answered request at the end: the chief has handled the whole flood by then.
    self->request(chief, std::chrono::seconds(30), nonce_atom::value)
        .receive([](const std::string&) {}, [](caf::error&) {});
  } else {
    std::cerr << "attacker: unknown mode " << mode << "\n";
    return 2;
  }
  std::cout << "attacker: done " << n << std::endl;
  return 0;
}
