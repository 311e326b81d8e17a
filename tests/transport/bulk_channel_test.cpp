// The ps tasks' data connections over loopback: the proof, bit-exact bytes at odd sizes, strangers
// refused while the listener goes on, and peers that truncate, lie about sizes or stall.
#include "troupe/transport/bulk_channel.hpp"

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

namespace tt = troupe::transport;
using namespace std::chrono_literals;

namespace {

const tt::ring_auth good{"the cluster token", "the ps task's secret"};

// A store of byte strings by key: an update replaces the bytes (any size), a read answers them.
struct byte_store {
  std::mutex mutex;
  std::map<std::string, std::vector<char>> values;

  void serve(tt::bulk_stream& s) {
    std::vector<char> in;
    while (auto r = s.receive_request()) {
      if (r->kind == tt::bulk_request::update) {
        in.resize(static_cast<std::size_t>(r->bytes));
        s.receive(in.data(), in.size());
        std::lock_guard<std::mutex> lock(mutex);
        values[r->key] = in;
        s.send_reply(nullptr, 0);
      } else {
        std::lock_guard<std::mutex> lock(mutex);
        auto it = values.find(r->key);
        if (it == values.end()) {
          s.send_error("no shard '" + r->key + "'");
        } else {
          s.send_reply(it->second.data(), it->second.size());
        }
      }
    }
  }
};

// A raw TCP connection to the listener, as a stranger makes it.
int raw_connect(std::uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Waits (bounded) until the listener has closed `fd`: a read sees the end or a reset.
bool closed_by_peer(int fd) {
  char b[4096];
  for (;;) {
    const ssize_t r = recv(fd, b, sizeof b, 0);
    if (r == 0 || (r < 0 && errno == ECONNRESET)) return true;
    if (r < 0) return false;  // the 5 s bound passed
  }
}

void wait_refused(const tt::bulk_listener& l, std::uint64_t n) {
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (l.refused() < n && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
}

std::vector<char> pattern(std::size_t n, unsigned seed) {
  std::vector<char> v(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& c : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    c = static_cast<char>(x);
  }
  return v;
}

tt::endpoint at(const tt::bulk_listener& l) { return tt::endpoint{"127.0.0.1", l.port()}; }

}  // namespace

TEST_CASE("a data connection carries updates and reads of odd sizes bit-exact, pipelined in order") {
  byte_store store;
  tt::bulk_listener l("127.0.0.1", 0, good, 5000ms, "test ps", [&](tt::bulk_stream& s) { store.serve(s); });
  auto c = tt::bulk_stream::connect(at(l), good, 5000ms, "ps task 0");
  const std::vector<std::size_t> sizes = {0, 1, 3, 4095, 4097, 65535, 65537, (1u << 20) + 3, (16u << 20) - 4};
  // Every update leaves before the first answer is read, as a worker's batch does.
  std::vector<std::vector<char>> values;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    values.push_back(pattern(sizes[i], static_cast<unsigned>(i)));
    tt::bulk_request r;
    r.kind = tt::bulk_request::update;
    r.key = "k" + std::to_string(i);
    r.bytes = sizes[i];
    c->send_request(r, values.back().data());
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) c->receive_reply(0);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    tt::bulk_request r;
    r.kind = tt::bulk_request::read;
    r.key = "k" + std::to_string(i);
    r.bytes = sizes[i];
    c->send_request(r, nullptr);
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::vector<char> got(sizes[i] + 1, 'x');
    c->receive_reply(sizes[i]);
    c->receive(got.data(), sizes[i]);
    CHECK(std::memcmp(got.data(), values[i].data(), sizes[i]) == 0);
    CHECK(got[sizes[i]] == 'x');  // nothing written past the bytes asked for
  }
  // An error the listener sends keeps the connection in step.
  tt::bulk_request missing;
  missing.key = "nope";
  missing.bytes = 8;
  c->send_request(missing, nullptr);
  try {
    c->receive_reply(8);
    FAIL("no error for a missing shard");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "ps task 0: no shard 'nope'");
  }
  tt::bulk_request again;
  again.key = "k3";
  again.bytes = sizes[3];
  c->send_request(again, nullptr);
  std::vector<char> got(sizes[3]);
  c->receive_reply(sizes[3]);
  c->receive(got.data(), got.size());
  CHECK(got == values[3]);
  CHECK(l.refused() == 0);
}

TEST_CASE("strangers on a data port are refused without allocating what they claim, and it goes on serving") {
  byte_store store;
  store.values["k"] = pattern(100, 7);
  tt::bulk_listener l("127.0.0.1", 0, good, 400ms, "test ps", [&](tt::bulk_stream& s) { store.serve(s); });

  // Another cluster token, and the right token without the ps task's secret: the proof fails.
  for (const auto& bad : {tt::ring_auth{"another token", good.incarnation}, tt::ring_auth{good.token, "guessed"}}) {
    try {
      tt::bulk_stream::connect(at(l), bad, 3000ms, "ps task 0");
      FAIL("a connection without the proof was accepted");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()).find("the data port of ps task 0 at 127.0.0.1:") == 0);
      CHECK(std::string(e.what()).find("refused this task") != std::string::npos);
    }
  }
  wait_refused(l, 2);
  CHECK(l.refused() == 2);

  // Bytes that are no hello.
  int fd = raw_connect(l.port());
  const std::string junk(70000, 'A');
  (void)!send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
  CHECK(closed_by_peer(fd));
  close(fd);
  // A hello whose segment table claims 16 GiB: refused from the table alone.
  fd = raw_connect(l.port());
  const std::uint32_t table[2] = {0, 0x7fffffffu};
  (void)!send(fd, table, sizeof table, MSG_NOSIGNAL);
  CHECK(closed_by_peer(fd));
  close(fd);
  // A connection that says nothing: refused once its time to prove itself (400 ms here) is over.
  fd = raw_connect(l.port());
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(closed_by_peer(fd));
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  close(fd);
  wait_refused(l, 5);
  CHECK(l.refused() == 5);

  // The ps task goes on: a client with the proof reads its bytes.
  auto c = tt::bulk_stream::connect(at(l), good, 3000ms, "ps task 0");
  tt::bulk_request r;
  r.key = "k";
  r.bytes = 100;
  c->send_request(r, nullptr);
  std::vector<char> got(100);
  c->receive_reply(100);
  c->receive(got.data(), got.size());
  CHECK(got == pattern(100, 7));
}

TEST_CASE("beyond its bound a data port pushes out the oldest connection still proving itself") {
  byte_store store;
  tt::bulk_listener l("127.0.0.1", 0, good, 3000ms, "test ps", [&](tt::bulk_stream& s) { store.serve(s); }, 2);
  int a = raw_connect(l.port());
  int b = raw_connect(l.port());
  std::this_thread::sleep_for(100ms);
  int c = raw_connect(l.port());
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(closed_by_peer(a));  // the oldest, at once, not after the 3 s proof bound
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  wait_refused(l, 1);
  CHECK(l.refused() == 1);
  close(a);
  close(b);
  close(c);
}

TEST_CASE("64 idle strangers on a data port neither keep a worker out nor push out a proven one") {
  byte_store store;
  store.values["k"] = pattern(100, 7);
  tt::bulk_listener l("127.0.0.1", 0, good, 5000ms, "test ps", [&](tt::bulk_stream& s) { store.serve(s); });
  auto read_k = [&](tt::bulk_stream& c) {
    tt::bulk_request r;
    r.key = "k";
    r.bytes = 100;
    c.send_request(r, nullptr);
    std::vector<char> got(100);
    c.receive_reply(100);
    c.receive(got.data(), got.size());
    return got == pattern(100, 7);
  };
  auto proven = tt::bulk_stream::connect(at(l), good, 3000ms, "ps task 0");
  std::vector<int> strangers;
  for (int i = 0; i < 80; ++i) strangers.push_back(raw_connect(l.port()));
  std::this_thread::sleep_for(100ms);
  // A worker connecting now gets in (the oldest strangers make room), within the bound.
  const auto t0 = std::chrono::steady_clock::now();
  auto late = tt::bulk_stream::connect(at(l), good, 3000ms, "ps task 0");
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  CHECK(read_k(*late));
  // The connection proven before the flood still serves.
  CHECK(read_k(*proven));
  for (int fd : strangers) close(fd);
}

TEST_CASE("a reply of the wrong size, a truncated reply and a stalled peer are errors naming the peer") {
  std::atomic<int> mode{0};
  tt::bulk_listener l(
      "127.0.0.1", 0, good, 3000ms, "test ps",
      [&](tt::bulk_stream& s) {
        while (auto r = s.receive_request()) {
          const auto bytes = pattern(1000, 1);
          if (mode == 0) {
            s.send_reply(bytes.data(), 999);  // not what the shard's layout says
          } else if (mode == 1) {
            // Says 1000 bytes, sends 10 of them (the rest of the header's promise), then closes.
            s.send_reply(bytes.data(), 10);
            return;
          } else {
            std::this_thread::sleep_for(1500ms);  // stalls past the client's bound
            return;
          }
        }
      });
  tt::bulk_request r;
  r.key = "k";
  r.bytes = 1000;
  {
    auto c = tt::bulk_stream::connect(at(l), good, 3000ms, "ps task 0");
    c->send_request(r, nullptr);
    try {
      c->receive_reply(1000);
      FAIL("a reply of 999 bytes was taken for 1000");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) ==
            "ps task 0 answered with 999 bytes, expected 1000 (the shard's registered shape and dtype)");
    }
  }
  {
    mode = 1;
    auto c = tt::bulk_stream::connect(at(l), good, 3000ms, "ps task 0");
    c->send_request(r, nullptr);
    c->receive_reply(10);
    std::vector<char> got(1000);
    c->receive(got.data(), 10);
    try {
      c->receive(got.data(), 990);  // what a worker would expect had the header said 1000
      FAIL("a truncated frame was taken");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()).find("ps task 0 closed its data connection after 0 of 990 bytes") == 0);
    }
  }
  {
    mode = 2;
    auto c = tt::bulk_stream::connect(at(l), good, 300ms, "ps task 0");
    c->send_request(r, nullptr);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c->receive_reply(1000);
      FAIL("a stalled peer was waited for");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()).find("ps task 0 sent nothing for 300 ms") == 0);
    }
    CHECK(std::chrono::steady_clock::now() - t0 < 1200ms);
  }
}

namespace {

// A relay on loopback to `to` that flips one byte in the first large piece (a shard's bytes, not
// the proof's hellos) the listener sends back.
class flipping_relay {
 public:
  explicit flipping_relay(std::uint16_t to) : to_(to) {
    thread_ = std::thread([this] { run(); });
  }
  ~flipping_relay() {
    stop_ = true;
    thread_.join();
  }
  std::uint16_t port() const { return own_.port(); }
  bool flipped() const { return flipped_; }

 private:
  void run() {
    int client = -1;
    while (!stop_ && client < 0) {
      pollfd p{own_.fd(), POLLIN, 0};
      if (poll(&p, 1, 50) > 0) client = accept(own_.fd(), nullptr, nullptr);
    }
    if (client < 0) return;
    const int server = raw_connect(to_);
    std::vector<char> buf(1 << 20);
    while (!stop_) {
      pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (poll(fds, 2, 50) <= 0) continue;
      bool done = false;
      for (int i = 0; i < 2 && !done; ++i) {
        if (fds[i].revents == 0) continue;
        const ssize_t r = recv(fds[i].fd, buf.data(), buf.size(), 0);
        if (r <= 0) {
          done = true;
          break;
        }
        if (i == 1 && r >= 1000 && !flipped_) {
          buf[static_cast<std::size_t>(r) / 2] ^= 0x01;
          flipped_ = true;
        }
        (void)!send(fds[1 - i].fd, buf.data(), static_cast<std::size_t>(r), MSG_NOSIGNAL);
      }
      if (done) break;
    }
    close(client);
    close(server);
  }

  tt::listener own_{"127.0.0.1", 0};
  std::uint16_t to_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> flipped_{false};
  std::thread thread_;
};

}  // namespace

TEST_CASE("with a cluster token, a shard's bytes altered on the way fail their integrity check naming the peer") {
  byte_store store;
  store.values["k"] = pattern(100000, 3);
  tt::bulk_listener l("127.0.0.1", 0, good, 3000ms, "test ps", [&](tt::bulk_stream& s) { store.serve(s); });
  flipping_relay relay(l.port());
  auto c = tt::bulk_stream::connect(tt::endpoint{"127.0.0.1", relay.port()}, good, 3000ms, "ps task 0");
  tt::bulk_request r;
  r.key = "k";
  r.bytes = 100000;
  c->send_request(r, nullptr);
  std::vector<char> got(100000);
  try {
    c->receive_reply(100000);
    c->receive(got.data(), got.size());
    FAIL("an altered reply was taken");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "a message from ps task 0 failed its integrity check (its tag does not match: the "
                                   "bytes were altered, replayed or reordered on the way)");
  }
  CHECK(relay.flipped());
  // A direct connection reads them whole.
  auto d = tt::bulk_stream::connect(at(l), good, 3000ms, "ps task 0");
  d->send_request(r, nullptr);
  d->receive_reply(100000);
  d->receive(got.data(), got.size());
  CHECK(got == pattern(100000, 3));
}

TEST_CASE("messages of a caller's own framing cross bit-exact with their tags, and a flipped byte fails") {
  // The listener echoes each message: a 16-byte header with the body's size at byte 8, the body.
  auto echo = [](tt::bulk_stream& s) {
    std::vector<char> body;
    for (;;) {
      if (!s.wait_message(-1)) continue;
      unsigned char h[16];
      if (!s.receive_header(h, sizeof h)) return;
      std::uint64_t n = 0;
      std::memcpy(&n, h + 8, sizeof n);
      REQUIRE(n <= (std::uint64_t{1} << 20));
      s.expect_body(n);
      body.resize(static_cast<std::size_t>(n));
      s.receive(body.data(), body.size());
      iovec iov[2] = {{h, sizeof h}, {body.data(), body.size()}};
      s.send_message(iov, 2);
    }
  };
  tt::bulk_listener l("127.0.0.1", 0, good, 3000ms, "test actors", echo);
  const auto round_trip = [](tt::bulk_stream& c, const std::vector<char>& body) {
    unsigned char h[16] = {1, 2, 3};
    const std::uint64_t n = body.size();
    std::memcpy(h + 8, &n, sizeof n);
    iovec iov[2] = {{h, sizeof h}, {const_cast<char*>(body.data()), body.size()}};
    c.send_message(iov, 2);
    REQUIRE(c.wait_message(3000));
    unsigned char g[16];
    REQUIRE(c.receive_header(g, sizeof g));
    CHECK(std::memcmp(g, h, sizeof h) == 0);
    c.expect_body(n);
    std::vector<char> got(body.size());
    c.receive(got.data(), got.size());
    return got;
  };
  auto c = tt::bulk_stream::connect(at(l), good, 3000ms, "actor host");
  CHECK_FALSE(c->wait_message(10));  // nothing came
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20}) {
    CAPTURE(n);
    CHECK(round_trip(*c, pattern(n, static_cast<unsigned>(n))) == pattern(n, static_cast<unsigned>(n)));
  }
  flipping_relay relay(l.port());
  auto d = tt::bulk_stream::connect(tt::endpoint{"127.0.0.1", relay.port()}, good, 3000ms, "actor host");
  try {
    round_trip(*d, pattern(100000, 5));
    FAIL("an altered message was taken");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "a message from actor host failed its integrity check (its tag does not match: "
                                   "the bytes were altered, replayed or reordered on the way)");
  }
  CHECK(relay.flipped());
  // A stranger without the proof is refused before a message is read.
  const int fd = raw_connect(l.port());
  const std::string junk(64, 'x');
  (void)!send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
  CHECK(closed_by_peer(fd));
  close(fd);
  wait_refused(l, 1);
  CHECK(l.refused() >= 1);
}

TEST_CASE("with tags hashed beside, large updates and reads are bit-exact, and a flipped byte still fails") {
  const auto beside = tt::tag_hashing::beside;
  byte_store store;
  tt::bulk_listener l("127.0.0.1", 0, good, 5000ms, "test ps", [&](tt::bulk_stream& s) { store.serve(s); }, 64, beside);
  auto c = tt::bulk_stream::connect(at(l), good, 5000ms, "ps task 0", beside);
  // Below the hand-over size, at it, across the 128 KiB reading pieces, and large.
  const std::vector<std::size_t> sizes = {65535, 65536, 131072, 131073, (1u << 20) + 3, (16u << 20) - 4};
  std::vector<std::vector<char>> values;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    values.push_back(pattern(sizes[i], static_cast<unsigned>(i) + 7));
    tt::bulk_request r;
    r.kind = tt::bulk_request::update;
    r.key = "k" + std::to_string(i);
    r.bytes = sizes[i];
    c->send_request(r, values.back().data());
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) c->receive_reply(0);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    tt::bulk_request r;
    r.key = "k" + std::to_string(i);
    r.bytes = sizes[i];
    c->send_request(r, nullptr);
    std::vector<char> got(sizes[i]);
    c->receive_reply(sizes[i]);
    // The largest in two parts: the first is hashed before receive() returns, the message's tag
    // is checked after the second.
    const std::size_t first = i + 1 == sizes.size() ? sizes[i] / 3 : sizes[i];
    c->receive(got.data(), first);
    if (first < sizes[i]) c->receive(got.data() + first, sizes[i] - first);
    CHECK_MESSAGE(got == values[i], sizes[i]);
  }
  // Through a relay that flips one byte of a reply of 1 MiB: refused, naming the peer.
  store.values["big"] = pattern(1u << 20, 11);
  flipping_relay relay(l.port());
  auto d = tt::bulk_stream::connect(tt::endpoint{"127.0.0.1", relay.port()}, good, 3000ms, "ps task 0", beside);
  tt::bulk_request r;
  r.key = "big";
  r.bytes = 1u << 20;
  d->send_request(r, nullptr);
  std::vector<char> got(1u << 20);
  try {
    d->receive_reply(1u << 20);
    d->receive(got.data(), got.size());
    FAIL("an altered reply was taken");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "a message from ps task 0 failed its integrity check (its tag does not match: the "
                                   "bytes were altered, replayed or reordered on the way)");
  }
  CHECK(relay.flipped());
}

}  // namespace TROUPE_TEST_FILE
