#pragma once
// What the tcp_ring tests share: a ring of n ranks as threads on loopback, and the patterns and
// outcomes its collectives are checked with.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <algorithm>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "../common/free_port.hpp"
#include "troupe/transport/tcp_ring.hpp"

using namespace troupe::transport;
using namespace std::chrono_literals;

namespace tcp_ring_test {

// `n` ranks as threads on loopback, each with its own listener and `options` (whose timeout bounds
// setup and collectives); body(rank, ring) runs on each.
inline std::vector<std::string> run_ring_with(int n, const tcp_ring_options& options,
                                       const std::function<void(int, tcp_ring&)>& body) {
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
        tcp_ring ring(r, n, *listeners[static_cast<std::size_t>(r)], peers, options);
        body(r, ring);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// The same with the default options but `timeout`.
inline std::vector<std::string> run_ring(int n, const std::function<void(int, tcp_ring&)>& body,
                                  std::chrono::milliseconds timeout = 10s) {
  tcp_ring_options options;
  options.timeout = timeout;
  return run_ring_with(n, options, body);
}

// The byte that rank (or root) `who` holds at index i: differs between ranks and along a buffer.
inline unsigned char pattern(int who, std::size_t i) {
  return static_cast<unsigned char>((i * 7 + static_cast<std::size_t>(who) * 59 + (i >> 9) + 1) & 0xff);
}

inline std::vector<unsigned char> pattern_bytes(int who, std::size_t n) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = pattern(who, i);
  return v;
}

// What a rank's call threw: its peer and message (peer -1 when it returned, -2 for another error).
struct outcome {
  int peer = -1;
  std::string what;
};

template <class F>
outcome capture(F&& f) {
  try {
    f();
  } catch (const peer_error& e) {
    return {e.peer(), e.what()};
  } catch (const std::exception& e) {
    return {-2, e.what()};
  }
  return {};
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Rank r's value at index i for a small all-reduce test: random (any float bits) when `exact` is
// false; small integers otherwise, whose sums are exact in any order (the large ring's order).
template <class T>
std::vector<T> block_values(int r, std::int64_t count, bool exact, unsigned salt) {
  std::mt19937 gen(static_cast<unsigned>(r) * 7919u + salt);
  std::uniform_int_distribution<int> small(-1000, 1000);
  std::vector<T> v(static_cast<std::size_t>(count));
  for (auto& x : v) {
    if constexpr (std::is_floating_point_v<T>) {
      x = exact ? static_cast<T>(small(gen)) : std::uniform_real_distribution<T>(-1, 1)(gen);
    } else {
      x = static_cast<T>(small(gen)) * static_cast<T>(1000003);
    }
  }
  return v;
}

// Runs one all-reduce of `count` elements on every rank of `ring` (inside run_ring) and checks
// it against the host's sum in rank order 0..n-1; returns the result for the cross-rank check.
template <class T>
std::vector<T> reduce_and_check(int r, tcp_ring& ring, std::int64_t count, scalar_type type, reduce_kind op,
                                unsigned salt) {
  const int n = ring.size();
  const bool exact = static_cast<std::size_t>(count) * sizeof(T) > tcp_ring::small_all_reduce_bytes;
  std::vector<T> w = block_values<T>(r, count, exact, salt);
  ring.all_reduce(w.data(), count, type, op);
  std::vector<T> expected = block_values<T>(0, count, exact, salt);
  for (int q = 1; q < n; ++q) {
    const auto v = block_values<T>(q, count, exact, salt);
    for (std::size_t i = 0; i < v.size(); ++i) expected[i] += v[i];
  }
  if (op == reduce_kind::mean) {
    for (auto& x : expected) x /= static_cast<T>(n);
  }
  if (std::memcmp(w.data(), expected.data(), w.size() * sizeof(T)) != 0) {
    throw std::runtime_error("rank " + std::to_string(r) + ": wrong result for " + std::to_string(count) +
                             " elements of " + std::to_string(sizeof(T)) + " bytes");
  }
  return w;
}

}  // namespace tcp_ring_test
