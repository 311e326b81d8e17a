// Strangers and impostors on a ring port: refused both ways, and the ring still forms with its peers.
#include "tcp_ring_harness.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace tcp_ring_test;

namespace {

// A stranger's connection to `port` on loopback that sends `bytes` (maybe none) and stays open.
int stranger_sends(std::uint16_t port, const std::vector<unsigned char>& bytes) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  if (!bytes.empty()) (void)!send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  return fd;
}

// Ranks 0 and 1 on loopback threads with `options_of(rank)`; `before` runs once both listen and
// before either forms its ring. Each sums its rank + 1 over the ring and checks 3.
std::vector<std::string> pair_after(const std::function<tcp_ring_options(int)>& options_of,
                                    const std::function<void(const std::vector<endpoint>&)>& before) {
  std::vector<std::unique_ptr<listener>> listeners;
  std::vector<endpoint> peers;
  for (int r = 0; r < 2; ++r) {
    listeners.push_back(std::make_unique<listener>("127.0.0.1", 0));
    peers.push_back({"127.0.0.1", listeners.back()->port()});
  }
  before(peers);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        tcp_ring ring(r, 2, *listeners[static_cast<std::size_t>(r)], peers, options_of(r));
        float v = static_cast<float>(r + 1);
        ring.all_reduce(&v, 1, scalar_type::f32, reduce_kind::sum);
        if (v != 3.0f) errors[static_cast<std::size_t>(r)] = "sum " + std::to_string(v);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

tcp_ring_options authed(const std::string& token, const std::string& incarnation,
                        std::chrono::milliseconds timeout = 10s) {
  tcp_ring_options o;
  o.timeout = timeout;
  o.auth = {token, incarnation};
  return o;
}

}  // namespace

TEST_CASE("strangers on a ring port are refused and the ring forms with the real peer") {
  std::vector<int> strangers;
  auto errors = pair_after([](int) { return authed("secret", "inc-1"); },
                           [&](const std::vector<endpoint>& peers) {
                             std::mt19937 gen(7);
                             std::vector<unsigned char> junk(4096);
                             for (auto& b : junk) b = static_cast<unsigned char>(gen());
                             for (const auto& p : peers) {
                               strangers.push_back(stranger_sends(p.port, junk));  // random bytes
                               strangers.push_back(stranger_sends(p.port, {}));    // silence
                               // a segment table declaring 4 GiB
                               strangers.push_back(stranger_sends(p.port, {0, 0, 0, 0, 255, 255, 255, 255}));
                             }
                           });
  for (int fd : strangers) close(fd);
  CHECK(errors[0].empty());
  CHECK(errors[1].empty());
}

TEST_CASE("a ring peer with another token or another incarnation is refused both ways and never joins") {
  for (const bool other_token : {true, false}) {
    CAPTURE(other_token);
    const auto start = std::chrono::steady_clock::now();
    auto errors = pair_after(
        [&](int r) {
          return r == 0 ? authed("secret", "inc-1", 1s)
                        : authed(other_token ? "guess" : "secret", other_token ? "inc-1" : "inc-2", 1s);
        },
        [](const std::vector<endpoint>&) {});
    // Each names the other as the peer that did not prove itself (what failed is in the log: the
    // last attempt may have met the other side already giving up).
    CHECK(errors[0].find("rank 1 (127.0.0.1:") != std::string::npos);
    CHECK(errors[1].find("rank 0 (127.0.0.1:") != std::string::npos);
    for (const auto& e : errors) {
      CAPTURE(e);
      CHECK(e.find("prove itself") != std::string::npos);
    }
    CHECK(std::chrono::steady_clock::now() - start < 8s);
  }
}

TEST_CASE("a ring forms with an empty token when both sides share the incarnation") {
  auto errors = pair_after([](int) { return authed("", "inc-1"); }, [](const std::vector<endpoint>&) {});
  CHECK(errors[0].empty());
  CHECK(errors[1].empty());
}

namespace {

// A TCP relay on loopback to `to`: it forwards both ways, and on its first connection holds the
// connecting side's second write (the final proof of the ring's handshake) for `hold`, calling
// `while_held` at once. Later connections are forwarded as they come.
class holding_relay {
 public:
  holding_relay(std::uint16_t to, std::chrono::milliseconds hold, std::function<void()> while_held)
      : own_("127.0.0.1", 0), to_(to), hold_(hold), while_held_(std::move(while_held)) {
    thread_ = std::thread([this] { run(); });
  }
  ~holding_relay() {
    stop_ = true;
    thread_.join();
  }
  std::uint16_t port() const { return own_.port(); }

 private:
  void run() {
    std::vector<std::thread> pairs;
    bool first = true;
    while (!stop_) {
      pollfd p{own_.fd(), POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const int client = accept(own_.fd(), nullptr, nullptr);
      if (client < 0) continue;
      const int server = stranger_sends(to_, {});
      pairs.emplace_back([this, client, server, hold = first] { forward(client, server, hold); });
      first = false;
    }
    for (auto& t : pairs) t.join();
  }

  void forward(int client, int server, bool hold) {
    int client_writes = 0;
    char buf[65536];
    while (!stop_) {
      pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (poll(fds, 2, 50) <= 0) continue;
      bool done = false;
      for (int i = 0; i < 2 && !done; ++i) {
        if (fds[i].revents == 0) continue;
        const ssize_t r = recv(fds[i].fd, buf, sizeof buf, 0);
        if (r <= 0) {
          done = true;
          break;
        }
        if (i == 0 && hold && ++client_writes == 2) {
          while_held_();
          std::this_thread::sleep_for(hold_);
        }
        (void)!send(fds[1 - i].fd, buf, static_cast<std::size_t>(r), MSG_NOSIGNAL);
      }
      if (done) break;
    }
    close(client);
    close(server);
  }

  listener own_;
  std::uint16_t to_;
  std::chrono::milliseconds hold_;
  std::function<void()> while_held_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

TEST_CASE("a ring peer pushed out by strangers while its final proof travels connects again and the ring forms") {
  // Rank 0's final proof is held on its way to rank 1 while 40 silent strangers connect to rank 1:
  // more than rank 1 lets prove themselves at once, so it pushes rank 0's connection out. Rank 0
  // waits for rank 1's acknowledgement, sees the close instead, and connects again.
  std::vector<std::unique_ptr<listener>> listeners;
  for (int r = 0; r < 2; ++r) listeners.push_back(std::make_unique<listener>("127.0.0.1", 0));
  std::vector<int> strangers;
  holding_relay relay(listeners[1]->port(), 300ms, [&] {
    for (int i = 0; i < 40; ++i) strangers.push_back(stranger_sends(listeners[1]->port(), {}));
  });
  std::vector<std::string> errors(2);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        // Rank 0 reaches rank 1 through the relay; rank 1 reaches rank 0 directly.
        std::vector<endpoint> peers{{"127.0.0.1", listeners[0]->port()},
                                    {"127.0.0.1", r == 0 ? relay.port() : listeners[1]->port()}};
        tcp_ring ring(r, 2, *listeners[static_cast<std::size_t>(r)], peers, authed("secret", "inc-1", 5s));
        float v = static_cast<float>(r + 1);
        ring.all_reduce(&v, 1, scalar_type::f32, reduce_kind::sum);
        if (v != 3.0f) errors[static_cast<std::size_t>(r)] = "sum " + std::to_string(v);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int fd : strangers) close(fd);
  CHECK(strangers.size() == 40);  // the hold happened
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  CHECK(std::chrono::steady_clock::now() - start < 4s);  // well before the 5 s start timeout
}

}  // namespace TROUPE_TEST_FILE
