#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "../../actors/src/control_gate.hpp"
#include "../../actors/src/control_tls.hpp"
#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "caf/openssl/manager.hpp"
#include "troupe/actors/cluster_health.hpp"
#include "troupe/actors/rendezvous.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::actors;
using namespace std::chrono_literals;

namespace {

struct node {
  node() {
    cfg.load<caf::io::middleman>();
    cfg.load<caf::openssl::manager>();
    add_rendezvous_types(cfg);
    system = std::make_unique<caf::actor_system>(cfg);
  }
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> system;
};

caf::behavior echo(caf::event_based_actor*) {
  return {[](const std::string& s) { return s + "!"; }};
}

// A raw connection to 127.0.0.1:port that gives up reading after 300 ms.
int dial(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  timeval tv{0, 300 * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// A BASP header (client handshake) declaring `payload` bytes, big-endian as BASP writes it.
std::vector<unsigned char> basp_header(std::uint32_t payload) {
  std::vector<unsigned char> h(32, 0);
  h[0] = 1;
  h[4] = static_cast<unsigned char>(payload >> 24);
  h[5] = static_cast<unsigned char>(payload >> 16);
  h[6] = static_cast<unsigned char>(payload >> 8);
  h[7] = static_cast<unsigned char>(payload);
  return h;
}

// True when the peer closed the connection within `wait` (reading whatever it sent first).
bool closed_within(int fd, std::chrono::milliseconds wait) {
  const auto until = std::chrono::steady_clock::now() + wait;
  char buf[4096];
  while (std::chrono::steady_clock::now() < until) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("the control gate closes a connection whose header declares more than its bound, and keeps one within it") {
  node chief;
  gate_limits limits;
  limits.max_payload_bytes = 4096;
  control_gate gate(*chief.system, false, limits);
  auto agent = chief.system->spawn(echo);
  auto port = gate.publish(agent, 0, "127.0.0.1");
  REQUIRE(port);

  const int big = dial(*port);
  const auto header = basp_header(0xFFFFFFFFu);
  REQUIRE(::send(big, header.data(), header.size(), 0) == static_cast<ssize_t>(header.size()));
  CHECK(closed_within(big, 5000ms));
  CHECK(gate.refused() == 1);
  ::close(big);

  const int small = dial(*port);
  const auto fits = basp_header(100);
  REQUIRE(::send(small, fits.data(), fits.size(), 0) == static_cast<ssize_t>(fits.size()));
  CHECK_FALSE(closed_within(small, 600ms));  // CAF waits for the 100 bytes
  CHECK(gate.refused() == 1);
  ::close(small);
  caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
}

TEST_CASE("the control gate holds at most max_connections unproven connections and refuses one more") {
  node chief;
  gate_limits limits;
  limits.max_connections = 3;
  control_gate gate(*chief.system, false, limits);
  auto agent = chief.system->spawn(echo);
  auto port = gate.publish(agent, 0, "127.0.0.1");
  REQUIRE(port);
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) held.push_back(dial(*port));
  std::this_thread::sleep_for(200ms);  // all three accepted
  const int extra = dial(*port);
  CHECK(closed_within(extra, 5000ms));
  CHECK(gate.refused() == 1);
  for (int fd : held) CHECK_FALSE(closed_within(fd, 100ms));
  for (int fd : held) ::close(fd);
  ::close(extra);
  caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
}

TEST_CASE("two nodes talk through their control gates, and an unpublished port listens no more") {
  node chief, worker;
  control_gate chief_gate(*chief.system, false, gate_limits::for_cluster(2));
  control_gate worker_gate(*worker.system, false, gate_limits::for_cluster(2));
  auto agent = chief.system->spawn(echo);
  auto port = chief_gate.publish(agent, 0, "127.0.0.1");
  REQUIRE(port);
  auto remote = worker_gate.remote_actor("127.0.0.1", *port, 5000ms);
  REQUIRE(remote);
  caf::scoped_actor self{*worker.system};
  std::string answer;
  self->request(*remote, 5s, std::string("hello")).receive([&](const std::string& s) { answer = s; },
                                                           [&](caf::error&) {});
  CHECK(answer == "hello!");
  CHECK(chief_gate.refused() == 0);
  CHECK(worker_gate.refused() == 0);
  // Unpublished, the port listens no more.
  chief_gate.unpublish(agent, *port);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(*port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0);
  ::close(fd);
  caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
}

TEST_CASE("over TLS, a stranger's failed handshake is refused with its address and leaves a member's connection open") {
  node chief, worker, stranger;
  control_credentials ours("the cluster's token"), theirs("another token");
  ours.install(*chief.system);
  ours.install(*worker.system);
  theirs.install(*stranger.system);
  auto health = std::make_shared<cluster_health>();
  control_gate chief_gate(*chief.system, true, gate_limits::for_cluster(2), health);
  control_gate worker_gate(*worker.system, true, gate_limits::for_cluster(2));
  control_gate stranger_gate(*stranger.system, true, gate_limits::for_cluster(2));
  auto agent = chief.system->spawn(echo);
  auto port = chief_gate.publish(agent, 0, "127.0.0.1");
  REQUIRE(port);
  auto remote = worker_gate.remote_actor("127.0.0.1", *port, 5000ms);
  REQUIRE(remote);
  caf::scoped_actor self{*worker.system};
  auto ask = [&](const std::string& what) {
    std::string answer;
    self->request(*remote, 5s, what).receive([&](const std::string& s) { answer = s; }, [&](caf::error&) {});
    return answer;
  };
  CHECK(ask("before") == "before!");
  CHECK_FALSE(stranger_gate.remote_actor("127.0.0.1", *port, 2000ms));
  for (int i = 0; i < 50 && chief_gate.refused() == 0; ++i) std::this_thread::sleep_for(20ms);
  CHECK(chief_gate.refused() >= 1);
  // The member's connection, served by the same thread that refused the stranger, still works.
  for (int i = 0; i < 5; ++i) {
    CHECK(ask("after " + std::to_string(i)) == "after " + std::to_string(i) + "!");
    std::this_thread::sleep_for(50ms);
  }
  const auto s = health->snapshot(cluster_health::clock::now());
  REQUIRE_FALSE(s.events.empty());
  CHECK(s.events.back().kind == cluster_event_kind::connection_refused);
  CHECK(s.events.back().address.rfind("127.0.0.1:", 0) == 0);
  CHECK(s.events.back().text.find("TLS handshake") != std::string::npos);
  caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
}

TEST_CASE("over TLS, a silent connection is closed at its handshake deadline") {
  node chief;
  control_credentials ours("the cluster's token");
  ours.install(*chief.system);
  gate_limits limits;
  limits.handshake_timeout = 500ms;
  control_gate gate(*chief.system, true, limits);
  auto agent = chief.system->spawn(echo);
  auto port = gate.publish(agent, 0, "127.0.0.1");
  REQUIRE(port);
  const int silent = dial(*port);
  CHECK(closed_within(silent, 3000ms));
  for (int i = 0; i < 50 && gate.refused() == 0; ++i) std::this_thread::sleep_for(20ms);
  CHECK(gate.refused() == 1);
  ::close(silent);
  caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
}

TEST_CASE("over TLS, a connection still in its handshake never holds the actor system's stop") {
  // The deadline here is far beyond the test's bound: the gate closes the session as it goes.
  control_credentials ours("the cluster's token");
  auto chief = std::make_unique<node>();
  ours.install(*chief->system);
  gate_limits limits;
  limits.handshake_timeout = 60s;
  auto gate = std::make_unique<control_gate>(*chief->system, true, limits);
  auto agent = chief->system->spawn(echo);
  auto port = gate->publish(agent, 0, "127.0.0.1");
  REQUIRE(port);
  const int held = dial(*port);
  std::this_thread::sleep_for(200ms);  // accepted, its handshake under way
  caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
  agent = caf::actor{};
  // The stop runs here (CAF's actor system is stopped on the thread that made it); a watchdog
  // closes the connection after 5 s, so that a stop that waits for it ends too, late.
  std::atomic<bool> stopped{false};
  std::thread watchdog([&] {
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (!stopped && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
    ::shutdown(held, SHUT_RDWR);
  });
  const auto start = std::chrono::steady_clock::now();
  gate.reset();
  chief.reset();
  const auto took = std::chrono::steady_clock::now() - start;
  stopped = true;
  watchdog.join();
  ::close(held);
  CHECK(took < 3s);
}

TEST_CASE("over TLS, silent strangers beyond max_connections push out the oldest and never keep a member out") {
  node chief, worker;
  control_credentials ours("the cluster's token");
  ours.install(*chief.system);
  ours.install(*worker.system);
  gate_limits limits;
  limits.max_connections = 3;
  control_gate chief_gate(*chief.system, true, limits);
  control_gate worker_gate(*worker.system, true, gate_limits::for_cluster(2));
  auto agent = chief.system->spawn(echo);
  auto port = chief_gate.publish(agent, 0, "127.0.0.1");
  REQUIRE(port);
  std::vector<int> strangers;
  for (int i = 0; i < 6; ++i) strangers.push_back(dial(*port));
  std::this_thread::sleep_for(200ms);  // all accepted; the first three pushed out
  CHECK(closed_within(strangers[0], 1000ms));
  auto remote = worker_gate.remote_actor("127.0.0.1", *port, 5000ms);
  REQUIRE(remote);
  caf::scoped_actor self{*worker.system};
  std::string answer;
  self->request(*remote, 5s, std::string("hello")).receive([&](const std::string& s) { answer = s; },
                                                           [&](caf::error&) {});
  CHECK(answer == "hello!");
  CHECK(worker_gate.refused() == 0);
  for (int fd : strangers) ::close(fd);
  caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
}

}  // namespace TROUPE_TEST_FILE
