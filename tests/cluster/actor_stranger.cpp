// A stranger without the cluster token against a task that hosts actors, for run_actors.sh's flood
// scenario. For SECONDS it alternates:
//   - plain CAF/BASP: reaches for the task's agent as a spawner would (no TLS) and, should that
//     ever succeed, sends it actor spawns and pings;
//   - raw TCP: connects and writes random bytes, or a BASP-like header declaring a 4 GiB payload
//     followed by an "aspawn"-ish frame, then reads until the task closes the connection.
// Prints "stranger: basp=<tries> raw=<connections> closed=<closed by the task> accepted=<n>" at the
// end (accepted counts spawns or pings the task answered: 0 expected) and exits 0; 2 on bad usage.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "troupe/base/parse_number.hpp"

namespace {

using aspawn_atom = caf::atom_constant<caf::atom("aspawn")>;
using aping_atom = caf::atom_constant<caf::atom("aping")>;

// One raw connection: `bytes` written, then read until the peer closes (true) or 3 s pass.
bool raw_try(std::uint16_t port, const std::string& bytes) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{3, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  bool closed = false;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    (void)!send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    char buf[4096];
    for (;;) {
      const ssize_t r = recv(fd, buf, sizeof buf, 0);
      if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
        closed = true;
        break;
      }
      if (r < 0) break;  // 3 s of silence: the task neither answered nor closed
    }
  }
  close(fd);
  return closed;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: actor_stranger PORT SECONDS\n";
    return 2;
  }
  const auto port = troupe::base::parse_port(argv[1]);
  const auto seconds = troupe::base::parse_int(argv[2]);
  if (!port || !seconds || *seconds < 1 || *seconds > 600) {
    std::cerr << "actor_stranger: expected a port and 1..600 seconds\n";
    return 2;
  }
  caf::actor_system_config cfg;
  cfg.load<caf::io::middleman>();
  caf::actor_system sys{cfg};
  std::mt19937_64 rng(std::random_device{}());
  long basp = 0, raw = 0, closed = 0, accepted = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(*seconds);
  std::cout << "stranger: flooding" << std::endl;
  while (std::chrono::steady_clock::now() < until) {
    // Plain BASP, as a spawner without the token. remote_actor has no bound of its own: the
    // attempt runs on a thread of its own and is given up after 3 s.
    ++basp;
    auto reached = std::async(std::launch::async, [&] { return sys.middleman().remote_actor("127.0.0.1", *port); });
    if (reached.wait_for(std::chrono::seconds(3)) == std::future_status::ready) {
      if (auto agent = reached.get()) {
        caf::scoped_actor self{sys};
        self->request(*agent, std::chrono::seconds(2), aspawn_atom::value, std::string("/job:chief/replica:0/task:0"),
                      caf::actor_cast<caf::actor>(self), std::string("accumulator"), std::string())
            .receive([&](caf::actor&, std::string&) { ++accepted; }, [&](caf::error&) {});
        self->request(*agent, std::chrono::seconds(2), aping_atom::value)
            .receive([&](bool) { ++accepted; }, [&](caf::error&) {});
      }
    } else {
      reached.wait();  // the task closes it: remote_actor returns
    }
    // Random bytes, and a header that declares 4 GiB followed by spawn-like text.
    std::string junk(static_cast<std::size_t>(rng() % 4096 + 1), '\0');
    for (auto& c : junk) c = static_cast<char>(rng());
    ++raw;
    closed += raw_try(*port, junk) ? 1 : 0;
    std::string header(64, '\0');
    header[0] = 1;  // a "direct message"-like operation
    for (int i = 8; i < 12; ++i) header[static_cast<std::size_t>(i)] = '\xff';  // a payload of 4 GiB
    header += "aspawn/job:chief/replica:0/task:0accumulator";
    ++raw;
    closed += raw_try(*port, header) ? 1 : 0;
  }
  std::cout << "stranger: basp=" << basp << " raw=" << raw << " closed=" << closed << " accepted=" << accepted
            << std::endl;
  return 0;
}
