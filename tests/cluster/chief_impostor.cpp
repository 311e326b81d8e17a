// An impostor chief for run_cluster.sh: a process that holds the cluster token (TROUPE_CLUSTER_TOKEN)
// and so passes the control plane's mutual TLS, reaches a ps task's agent while the real chief
// trains, says hello as /job:chief/replica:0/task:0 and sends a checkpoint save; then it leaves.
// Before the chief's role was bound to one process, its hello made it the ps task's chief and its
// leaving ended the ps task under the real training.
// Usage: chief_impostor HOST PORT CHECKPOINT_DIR [HOLD_S]
//   HOLD_S: stays connected that many seconds before it leaves, beating as a chief does where its
//   hello was taken (a holder that came first).
// Prints "impostor: connected", then "impostor: refused: <error>" or "impostor: ACCEPTED: <what>"
// for each message, and "impostor: refused N of M" at the end. Exit status: 0 when every message
// was refused, 1 when one was accepted, 2 when the task could not be reached.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#include "../../actors/src/control_gate.hpp"
#include "../../actors/src/control_tls.hpp"
#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "caf/openssl/manager.hpp"
#include "troupe/base/parse_number.hpp"

namespace {

using hello_atom = caf::atom_constant<caf::atom("hello")>;
using ckptsave_atom = caf::atom_constant<caf::atom("ckptsave")>;
using beat_atom = caf::atom_constant<caf::atom("beat")>;

caf::behavior idle(caf::event_based_actor*) {
  return {[](const std::string&) {}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::cerr << "usage: chief_impostor HOST PORT CHECKPOINT_DIR [HOLD_S]\n";
    return 2;
  }
  const std::string host = argv[1], dir = argv[3];
  const auto port = troupe::base::parse_port(argv[2]);
  if (!port) {
    std::cerr << "chief_impostor: PORT '" << argv[2] << "' is not a port (expected 1..65535)\n";
    return 2;
  }
  const auto hold_s = argc == 5 ? troupe::base::parse_uint(argv[4]) : std::optional<unsigned long long>(0);
  if (!hold_s || *hold_s > 600) {
    std::cerr << "chief_impostor: HOLD_S '" << argv[4] << "' is not a number of seconds (expected 0..600)\n";
    return 2;
  }
  const char* token = std::getenv("TROUPE_CLUSTER_TOKEN");
  if (token == nullptr || *token == '\0') {
    std::cerr << "chief_impostor: set TROUPE_CLUSTER_TOKEN (the impostor holds the cluster's token)\n";
    return 2;
  }
  caf::actor_system_config cfg;
  cfg.load<caf::io::middleman>();
  cfg.load<caf::openssl::manager>();
  caf::actor_system sys{cfg};
  troupe::actors::control_credentials credentials(token);
  credentials.install(sys);
  troupe::actors::control_gate gate(sys, true, troupe::actors::gate_limits::for_tasks());
  auto agent = gate.remote_actor(host, *port, std::chrono::seconds(10));
  if (!agent) {
    std::cout << "impostor: unreachable: " << sys.render(agent.error()) << std::endl;
    return 2;
  }
  std::cout << "impostor: connected" << std::endl;
  caf::scoped_actor self{sys};
  auto watch = sys.spawn(idle);
  int sent = 0, refused = 0;
  const auto refused_with = [&](caf::error& e) {
    ++refused;
    std::cout << "impostor: refused: " << sys.render(e).substr(0, 300) << std::endl;
  };
  ++sent;
  caf::actor pulse;
  self->request(*agent, std::chrono::seconds(20), hello_atom::value, std::string("/job:chief/replica:0/task:0"), watch)
      .receive(
          [&](const std::string&, const caf::actor& p) {
            pulse = p;
            std::cout << "impostor: ACCEPTED: a hello as the chief" << std::endl;
          },
          refused_with);
  ++sent;
  self->request(*agent, std::chrono::seconds(20), ckptsave_atom::value, dir, std::string("shard-0-of-1.ckpt"),
                std::int64_t{7})
      .receive([&](std::uint64_t, std::uint64_t) { std::cout << "impostor: ACCEPTED: a checkpoint save" << std::endl; },
               refused_with);
  std::cout << "impostor: refused " << refused << " of " << sent << std::endl;
  if (*hold_s > 0) {
    std::cout << "impostor: holding for " << *hold_s << " s" << std::endl;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(*hold_s);
    while (std::chrono::steady_clock::now() < until) {
      if (pulse) self->send(pulse, beat_atom::value, std::int64_t{500}, std::int32_t{6});  // the defaults
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  caf::anon_send_exit(watch, caf::exit_reason::user_shutdown);
  return refused == sent ? 0 : 1;
}
