#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "troupe/transport/tcp_ring.hpp"

using namespace troupe::transport;
using namespace std::chrono_literals;

namespace {

// `n` ranks as threads on loopback, each with its own listener; body(rank, ring) runs on each.
std::vector<std::string> run_ring(int n, const std::function<void(int, tcp_ring&)>& body,
                                  std::chrono::milliseconds timeout = 10s) {
  std::vector<std::unique_ptr<listener>> listeners;
  std::vector<endpoint> peers;
  for (int r = 0; r < n; ++r) {
    listeners.push_back(std::make_unique<listener>("127.0.0.1", 0));
    peers.push_back({"127.0.0.1", listeners.back()->port()});
  }
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        tcp_ring ring(r, n, *listeners[static_cast<std::size_t>(r)], peers, timeout);
        body(r, ring);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

template <class T>
void check_sum(int n, std::int64_t count, reduce_kind op, scalar_type type) {
  std::vector<std::vector<T>> results(static_cast<std::size_t>(n));
  auto errors = run_ring(n, [&](int r, tcp_ring& ring) {
    std::vector<T> v(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i) v[static_cast<std::size_t>(i)] = static_cast<T>((r + 1) * (i % 5 + 1));
    for (int round = 0; round < 3; ++round) {
      std::vector<T> w = v;
      ring.all_reduce(w.data(), count, type, op);
      results[static_cast<std::size_t>(r)] = w;
    }
  });
  for (const auto& e : errors) CHECK(e == "");
  const T ids = static_cast<T>(n * (n + 1) / 2);
  for (int r = 0; r < n; ++r) {
    const auto& w = results[static_cast<std::size_t>(r)];
    REQUIRE(w.size() == static_cast<std::size_t>(count));
    bool ok = true;
    for (std::int64_t i = 0; i < count && ok; ++i) {
      T expected = static_cast<T>(ids * static_cast<T>(i % 5 + 1));
      if (op == reduce_kind::mean) expected = expected / static_cast<T>(n);
      ok = w[static_cast<std::size_t>(i)] == expected;
    }
    CHECK(ok);
    CHECK(std::memcmp(w.data(), results[0].data(), w.size() * sizeof(T)) == 0);
  }
}

}  // namespace

TEST_CASE("ring all-reduce sums every dtype across 1, 2, 3 and 4 ranks on loopback") {
  for (int n : {1, 2, 3, 4}) {
    for (std::int64_t count : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{100003}}) {
      CAPTURE(n);
      CAPTURE(count);
      check_sum<float>(n, count, reduce_kind::sum, scalar_type::f32);
      check_sum<double>(n, count, reduce_kind::mean, scalar_type::f64);
      check_sum<std::int32_t>(n, count, reduce_kind::sum, scalar_type::i32);
      check_sum<std::int64_t>(n, count, reduce_kind::mean, scalar_type::i64);
    }
  }
}

TEST_CASE("ring all-reduce of random floats is identical on every rank and every run") {
  for (int n : {2, 3}) {
    std::vector<std::vector<float>> first(static_cast<std::size_t>(n)), second(static_cast<std::size_t>(n));
    for (auto* out : {&first, &second}) {
      auto errors = run_ring(n, [&](int r, tcp_ring& ring) {
        std::mt19937 gen(static_cast<unsigned>(r));
        std::uniform_real_distribution<float> dist(-1, 1);
        std::vector<float> v(50001);
        for (auto& x : v) x = dist(gen);
        ring.all_reduce(v.data(), static_cast<std::int64_t>(v.size()), scalar_type::f32, reduce_kind::mean);
        (*out)[static_cast<std::size_t>(r)] = v;
      });
      for (const auto& e : errors) CHECK(e == "");
    }
    for (int r = 0; r < n; ++r) {
      CHECK(first[static_cast<std::size_t>(r)] == first[0]);
      CHECK(second[static_cast<std::size_t>(r)] == first[0]);
    }
  }
}

TEST_CASE("a peer that leaves mid-collective is named, no hang") {
  auto errors = run_ring(3, [](int r, tcp_ring& ring) {
    std::vector<float> v(1000, 1.0f);
    ring.all_reduce(v.data(), 1000, scalar_type::f32, reduce_kind::sum);
    if (r == 1) return;  // rank 1 leaves: its sockets close
    ring.all_reduce(v.data(), 1000, scalar_type::f32, reduce_kind::sum);
  }, 5s);
  CHECK(errors[1] == "");
  // Rank 2 receives from rank 1; rank 0 sends to it (or waits for rank 2, which failed).
  CHECK(errors[2].find("rank 1 (127.0.0.1:") != std::string::npos);
  CHECK(errors[2].find("closed its connection") != std::string::npos);
  CHECK(errors[0] != "");
}

TEST_CASE("a peer that never starts is a timeout naming it") {
  listener mine("127.0.0.1", 0);
  listener absent("127.0.0.1", 0);  // listens, but nobody runs rank 1: its connect never comes
  std::vector<endpoint> peers{{"127.0.0.1", mine.port()}, {"127.0.0.1", absent.port()}};
  const auto start = std::chrono::steady_clock::now();
  try {
    tcp_ring ring(0, 2, mine, peers, 300ms);
    FAIL("the ring should not have formed");
  } catch (const peer_error& e) {
    CHECK(e.peer() == 1);
    CHECK(std::string(e.what()).find("timed out waiting for rank 1 (127.0.0.1:") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - start < 5s);
}

TEST_CASE("random bytes from a stranger are rejected with an error naming the expected peer") {
  listener mine("127.0.0.1", 0);
  listener other("127.0.0.1", 0);
  std::vector<endpoint> peers{{"127.0.0.1", mine.port()}, {"127.0.0.1", other.port()}};
  std::thread stranger([&] {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(mine.port());
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    for (int i = 0; i < 100 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0; ++i) {
      std::this_thread::sleep_for(10ms);
    }
    std::mt19937 gen(7);
    std::vector<unsigned char> junk(4096);
    for (auto& b : junk) b = static_cast<unsigned char>(gen());
    (void)!send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    std::this_thread::sleep_for(200ms);
    close(fd);
  });
  try {
    tcp_ring ring(0, 2, mine, peers, 2s);
    FAIL("the ring should not have formed");
  } catch (const peer_error& e) {
    const std::string what = e.what();
    CHECK(what.find("rank 1 (127.0.0.1:") != std::string::npos);
    CHECK((what.find("malformed") != std::string::npos || what.find("oversized") != std::string::npos ||
           what.find("protocol") != std::string::npos));
  }
  stranger.join();
}
