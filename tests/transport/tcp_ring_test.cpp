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

namespace {

// `n` ranks as threads on loopback, each with its own listener and `options` (whose timeout bounds
// setup and collectives); body(rank, ring) runs on each.
std::vector<std::string> run_ring_with(int n, const tcp_ring_options& options,
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
std::vector<std::string> run_ring(int n, const std::function<void(int, tcp_ring&)>& body,
                                  std::chrono::milliseconds timeout = 10s) {
  tcp_ring_options options;
  options.timeout = timeout;
  return run_ring_with(n, options, body);
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
  CAPTURE(errors[2]);
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

// The byte that rank (or root) `who` holds at index i: differs between ranks and along a buffer.
unsigned char pattern(int who, std::size_t i) {
  return static_cast<unsigned char>((i * 7 + static_cast<std::size_t>(who) * 59 + (i >> 9) + 1) & 0xff);
}

std::vector<unsigned char> pattern_bytes(int who, std::size_t n) {
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

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("ring broadcast delivers the root's bytes from every root across 1, 2, 3 and 4 ranks") {
  const std::vector<std::size_t> sizes{0, 1, 1000, (std::size_t{3} << 20) + 7};
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    std::vector<std::vector<unsigned char>> expected;
    for (int root = 0; root < n; ++root) expected.push_back(pattern_bytes(root, sizes.back()));
    std::vector<std::string> failures(static_cast<std::size_t>(n));
    const auto start = std::chrono::steady_clock::now();
    auto errors = run_ring(n, [&](int r, tcp_ring& ring) {
      auto& failed = failures[static_cast<std::size_t>(r)];
      // 0 bytes touches nothing: each rank makes a different number of such calls, and the ring
      // stays in step.
      for (int i = 0; i < r * 3; ++i) ring.broadcast(nullptr, 0, i % n);
      for (int root = 0; root < n; ++root) {
        const auto& want = expected[static_cast<std::size_t>(root)];
        for (std::size_t bytes : sizes) {
          for (std::size_t misalign : {std::size_t{0}, std::size_t{1}}) {
            std::vector<unsigned char> buf(bytes + misalign + 1, 0);
            unsigned char* p = buf.data() + misalign;
            if (r == root) {
              std::memcpy(p, want.data(), bytes);
            } else {
              std::memset(p, 0xA5 ^ r, bytes);  // something else to overwrite
            }
            buf[misalign + bytes] = 0x5A;  // a guard byte that must stay
            ring.broadcast(p, bytes, root);
            if (std::memcmp(p, want.data(), bytes) != 0 || buf[misalign + bytes] != 0x5A) {
              failed += "root " + std::to_string(root) + ", " + std::to_string(bytes) + " bytes, offset " +
                        std::to_string(misalign) + "; ";
            }
          }
        }
      }
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(errors[static_cast<std::size_t>(r)] == "");
      CHECK(failures[static_cast<std::size_t>(r)] == "");
    }
    CHECK(std::chrono::steady_clock::now() - start < 5s);
  }
}

TEST_CASE("ring all-gather concatenates uneven blocks, empty ones included, across 1, 2, 3 and 4 ranks") {
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    const auto un = static_cast<std::size_t>(n);
    std::vector<std::vector<std::size_t>> layouts;
    layouts.emplace_back(un, 0);     // nothing anywhere
    layouts.emplace_back(un, 4096);  // even
    std::vector<std::size_t> uneven(un), big(un), last_only(un, 0);
    for (std::size_t r = 0; r < un; ++r) {
      uneven[r] = r % 2 == 1 ? 0 : 1000 * r + 7;                               // 7, 0, 2007, 0
      big[r] = r == 0 ? (std::size_t{2} << 20) + 5 : (r == un - 1 ? 0 : 13 * r);  // 2 MiB + 5, 13, 26, 0
    }
    last_only[un - 1] = 1;
    layouts.push_back(uneven);
    layouts.push_back(big);
    layouts.push_back(last_only);

    std::vector<std::string> failures(un);
    const auto start = std::chrono::steady_clock::now();
    auto errors = run_ring(n, [&](int r, tcp_ring& ring) {
      auto& failed = failures[static_cast<std::size_t>(r)];
      for (std::size_t l = 0; l < layouts.size(); ++l) {
        const auto& sizes = layouts[l];
        std::vector<unsigned char> want;
        for (int q = 0; q < n; ++q) {
          auto block = pattern_bytes(q, sizes[static_cast<std::size_t>(q)]);
          want.insert(want.end(), block.begin(), block.end());
        }
        const auto mine = pattern_bytes(r, sizes[static_cast<std::size_t>(r)]);
        // From a separate buffer, then in place (this rank's block already inside `out`).
        for (bool in_place : {false, true}) {
          std::vector<unsigned char> out(want.size() + 1, 0xEE);
          out.back() = 0x5A;  // guard
          const void* src = mine.data();
          if (in_place) {
            std::size_t offset = 0;
            for (int q = 0; q < r; ++q) offset += sizes[static_cast<std::size_t>(q)];
            std::memcpy(out.data() + offset, mine.data(), mine.size());
            src = out.data() + offset;
          }
          ring.all_gather(src, mine.size(), out.data(), sizes);
          if (std::memcmp(out.data(), want.data(), want.size()) != 0 || out.back() != 0x5A) {
            failed += "layout " + std::to_string(l) + (in_place ? " in place" : "") + "; ";
          }
        }
      }
      // The other collectives still line up on the same ring afterwards.
      std::vector<float> v(1000, static_cast<float>(r + 1));
      ring.all_reduce(v.data(), 1000, scalar_type::f32, reduce_kind::sum);
      if (v[999] != static_cast<float>(n * (n + 1) / 2)) failed += "all_reduce after all_gather; ";
      std::vector<unsigned char> b = r == n - 1 ? pattern_bytes(n - 1, 5000) : std::vector<unsigned char>(5000, 0);
      ring.broadcast(b.data(), b.size(), n - 1);
      if (b != pattern_bytes(n - 1, 5000)) failed += "broadcast after all_gather; ";
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(errors[static_cast<std::size_t>(r)] == "");
      CHECK(failures[static_cast<std::size_t>(r)] == "");
    }
    CHECK(std::chrono::steady_clock::now() - start < 5s);
  }
}

TEST_CASE("broadcast and all-gather reject a bad root or block size with std::invalid_argument") {
  listener own("127.0.0.1", 0);
  tcp_ring ring(0, 1, own, {{"127.0.0.1", own.port()}}, 1s);
  char byte = 'x';
  CHECK_THROWS_WITH_AS(ring.broadcast(&byte, 1, 1), "broadcast: root 1 out of range for a ring of 1 ranks (expected 0..0)",
                       std::invalid_argument);
  CHECK_THROWS_AS(ring.broadcast(&byte, 1, -1), std::invalid_argument);
  std::vector<char> out(4);
  CHECK_THROWS_WITH_AS(ring.all_gather("abc", 3, out.data(), {4}),
                       "all_gather: rank 0 gives 3 bytes, but bytes_per_rank[0] is 4 (expected them equal)",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(ring.all_gather("abc", 3, out.data(), {3, 1}),
                       "all_gather: 2 block sizes for a ring of 1 ranks (expected one per rank)", std::invalid_argument);
  // One rank: the block is the result.
  ring.all_gather("abcd", 4, out.data(), {4});
  CHECK(std::string(out.data(), 4) == "abcd");
  ring.broadcast(&byte, 1, 0);
  CHECK(byte == 'x');
}

TEST_CASE("ranks that disagree on a broadcast or all-gather get a peer_error naming the peer, quickly") {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();

  SUBCASE("two ranks that each think they are the root") {
    std::vector<outcome> got(2);
    auto errors = run_ring(2, [&](int r, tcp_ring& ring) {
      std::vector<char> buf(1000, static_cast<char>(r));
      got[static_cast<std::size_t>(r)] = capture([&] { ring.broadcast(buf.data(), buf.size(), r); });
    }, 5s);
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      const auto& o = got[static_cast<std::size_t>(r)];
      const int other = 1 - r;
      CHECK(o.peer == other);
      CHECK(contains(o.what, "broadcast: rank " + std::to_string(other) + " (127.0.0.1:"));
      CHECK(contains(o.what, "from root " + std::to_string(other)));
      CHECK(contains(o.what, "rank " + std::to_string(r) + " (this worker) expected"));
      CHECK(contains(o.what, "disagree"));
    }
  }

  SUBCASE("one rank of three with another size") {
    std::vector<outcome> got(3);
    auto errors = run_ring(3, [&](int r, tcp_ring& ring) {
      std::vector<char> buf(r == 2 ? 2000 : 1000, 'a');
      got[static_cast<std::size_t>(r)] = capture([&] { ring.broadcast(buf.data(), buf.size(), 0); });
    }, 5s);
    // Rank 2 hears 1000 bytes from rank 1; the root hears rank 2's 2000 in its closing frame.
    CHECK(got[2].peer == 1);
    CHECK(contains(got[2].what, "rank 1 (127.0.0.1:"));
    CHECK(contains(got[2].what, "sent a broadcast of 1000 bytes from root 0"));
    CHECK(contains(got[2].what, "expected a broadcast of 2000 bytes from root 0"));
    CHECK(got[0].peer == 2);
    CHECK(contains(got[0].what, "rank 2 (127.0.0.1:"));
    CHECK(contains(got[0].what, "2000 bytes"));
  }

  SUBCASE("an all-gather whose ranks disagree on a block's size") {
    std::vector<outcome> got(2);
    auto errors = run_ring(2, [&](int r, tcp_ring& ring) {
      const std::vector<std::size_t> sizes = r == 0 ? std::vector<std::size_t>{100, 60} : std::vector<std::size_t>{100, 50};
      std::vector<char> mine(sizes[static_cast<std::size_t>(r)], 'm');
      std::vector<char> out(sizes[0] + sizes[1]);
      got[static_cast<std::size_t>(r)] = capture([&] { ring.all_gather(mine.data(), mine.size(), out.data(), sizes); });
    }, 5s);
    CHECK(got[0].peer == 1);
    CHECK(contains(got[0].what, "all_gather: rank 1 (127.0.0.1:"));
    CHECK(contains(got[0].what, "a block of 50 bytes from rank 1"));
    CHECK(contains(got[0].what, "expected an all-gather with a block of 60 bytes from rank 1"));
  }

  SUBCASE("ranks in different collectives") {
    std::vector<outcome> got(2);
    auto errors = run_ring(2, [&](int r, tcp_ring& ring) {
      std::vector<float> v(1000, 1.0f);
      got[static_cast<std::size_t>(r)] = capture([&] {
        if (r == 0) {
          ring.all_reduce(v.data(), 1000, scalar_type::f32, reduce_kind::sum);
        } else {
          ring.broadcast(v.data(), v.size() * sizeof(float), 1);
        }
      });
    }, 5s);
    CHECK(got[0].peer == 1);
    CHECK(contains(got[0].what, "all_reduce: rank 1 (127.0.0.1:"));
    CHECK(contains(got[0].what, "sent a broadcast of 4000 bytes from root 1"));
    CHECK(got[1].peer == 0);
    CHECK(contains(got[1].what, "broadcast: rank 0 (127.0.0.1:"));
    CHECK(contains(got[1].what, "sent an all-reduce"));
  }

  CHECK(clock::now() - start < 3s);  // found from the frames, not by the 5 s timeout
}

TEST_CASE("shutdown releases a pending broadcast or all-gather at once") {
  for (const std::string op : {"broadcast", "all_gather"}) {
    CAPTURE(op);
    std::atomic<bool> finished{false};
    outcome pending, after;
    std::chrono::steady_clock::duration waited{};
    auto errors = run_ring(2, [&](int r, tcp_ring& ring) {
      if (r == 0) {  // never joins the collective; keeps its connections open until rank 1 is done
        const auto until = std::chrono::steady_clock::now() + 5s;
        while (!finished.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
        return;
      }
      std::vector<char> buf(1000, 'b'), out(2000);
      auto call = [&] {
        if (op == "broadcast") {
          ring.broadcast(buf.data(), buf.size(), 0);
        } else {
          ring.all_gather(buf.data(), buf.size(), out.data(), {1000, 1000});
        }
      };
      std::thread stopper([&] {
        std::this_thread::sleep_for(200ms);
        ring.shutdown();
      });
      const auto start = std::chrono::steady_clock::now();
      pending = capture(call);
      waited = std::chrono::steady_clock::now() - start;
      stopper.join();
      after = capture(call);  // the ring is unusable from now on: fails at once too
      finished.store(true);
    }, 10s);
    CHECK(errors[0] == "");
    CHECK(errors[1] == "");
    CHECK(pending.peer == 0);
    CHECK(contains(pending.what, "the ring was shut down here"));
    CHECK(contains(pending.what, "rank 0 (127.0.0.1:"));
    CHECK(waited >= 150ms);
    CHECK(waited < 2s);
    CHECK(after.peer == 0);
    CHECK(contains(after.what, "shut down"));
  }
}

TEST_CASE("a listener on 0.0.0.0 serves a ring whose peers are named by host name, and its port is reusable") {
  // Rank 1 starts listening 300 ms late, so rank 0's connection is refused at first and retried.
  listener first("0.0.0.0", 0);
  const std::uint16_t late_port = troupe::testing::free_port();
  const std::vector<endpoint> peers{{"localhost", first.port()}, {"localhost", late_port}};
  std::vector<outcome> got(2);
  std::vector<float> sums(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      got[static_cast<std::size_t>(r)] = capture([&] {
        std::unique_ptr<listener> own;
        if (r == 1) {
          std::this_thread::sleep_for(300ms);
          own = std::make_unique<listener>("127.0.0.1", late_port);
        }
        tcp_ring ring(r, 2, r == 0 ? first : *own, peers, 5s);
        float v = static_cast<float>(r + 1);
        ring.all_reduce(&v, 1, scalar_type::f32, reduce_kind::sum);
        sums[static_cast<std::size_t>(r)] = v;
      });
    });
  }
  for (auto& t : threads) t.join();
  CHECK(got[0].what == "");
  CHECK(got[1].what == "");
  CHECK(sums[0] == 3.0f);
  CHECK(sums[1] == 3.0f);
  // The ring's connections on late_port are closed (some in TIME_WAIT): it can be listened on again.
  CHECK_NOTHROW(listener("127.0.0.1", late_port));
  CHECK_THROWS_WITH_AS(listener("not-an-address", 0), "listener: \"not-an-address\" is not an IPv4 address",
                       std::invalid_argument);
}

namespace {

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

}  // namespace

TEST_CASE("ring small all-reduce sums every dtype in rank order, bit-identical, across 3, 4, 5 and 6 ranks") {
  for (int n : {3, 4, 5, 6}) {
    CAPTURE(n);
    // results[rank][case]: the bytes every rank got, compared across ranks below.
    std::vector<std::vector<std::vector<char>>> results(static_cast<std::size_t>(n));
    auto errors = run_ring(n, [&](int r, tcp_ring& ring) {
      unsigned salt = 0;
      auto run = [&](auto tag, scalar_type type) {
        using T = decltype(tag);
        const auto at_threshold = static_cast<std::int64_t>(tcp_ring::small_all_reduce_bytes / sizeof(T));
        const std::int64_t counts[] = {1, 3, 1001, at_threshold, at_threshold + 1};
        for (std::int64_t count : counts) {
          for (reduce_kind op : {reduce_kind::sum, reduce_kind::mean}) {
            const auto w = reduce_and_check<T>(r, ring, count, type, op, ++salt);
            const auto* p = reinterpret_cast<const char*>(w.data());
            results[static_cast<std::size_t>(r)].emplace_back(p, p + w.size() * sizeof(T));
          }
        }
      };
      run(float{}, scalar_type::f32);
      run(double{}, scalar_type::f64);
      run(std::int32_t{}, scalar_type::i32);
      run(std::int64_t{}, scalar_type::i64);
    }, 5s);
    for (const auto& e : errors) CHECK(e == "");
    for (int r = 1; r < n; ++r) CHECK(results[static_cast<std::size_t>(r)] == results[0]);
  }
}

TEST_CASE("ring small and large all-reduces interleaved with broadcast and all-gather leave no frame behind") {
  for (int n : {3, 4, 5}) {
    CAPTURE(n);
    auto errors = run_ring(n, [&](int r, tcp_ring& ring) {
      const std::int64_t large = static_cast<std::int64_t>(tcp_ring::small_all_reduce_bytes / sizeof(float)) + 1;
      for (int i = 0; i < 40; ++i) {
        const unsigned salt = static_cast<unsigned>(1000 + i);
        switch (i % 5) {
          case 0: reduce_and_check<float>(r, ring, 1 + i * 37, scalar_type::f32, reduce_kind::sum, salt); break;
          case 1: reduce_and_check<float>(r, ring, large + i, scalar_type::f32, reduce_kind::mean, salt); break;
          case 2: {
            const int root = i % n;
            const std::size_t bytes = 100 + static_cast<std::size_t>(i);
            auto buf = r == root ? pattern_bytes(root, bytes) : std::vector<unsigned char>(bytes);
            ring.broadcast(buf.data(), bytes, root);
            if (buf != pattern_bytes(root, bytes)) throw std::runtime_error("broadcast " + std::to_string(i));
            break;
          }
          case 3: reduce_and_check<std::int64_t>(r, ring, 512, scalar_type::i64, reduce_kind::sum, salt); break;
          case 4: {
            std::vector<std::size_t> sizes;
            for (int q = 0; q < n; ++q) sizes.push_back(static_cast<std::size_t>(q * 10 + i));
            std::vector<unsigned char> out(std::accumulate(sizes.begin(), sizes.end(), std::size_t{0}));
            const auto mine = pattern_bytes(r, sizes[static_cast<std::size_t>(r)]);
            ring.all_gather(mine.data(), mine.size(), out.data(), sizes);
            std::size_t at = 0;
            for (int q = 0; q < n; ++q) {
              const auto want = pattern_bytes(q, sizes[static_cast<std::size_t>(q)]);
              if (!std::equal(want.begin(), want.end(), out.begin() + static_cast<std::ptrdiff_t>(at))) {
                throw std::runtime_error("all_gather " + std::to_string(i));
              }
              at += want.size();
            }
            break;
          }
        }
      }
    }, 5s);
    for (const auto& e : errors) CHECK(e == "");
  }
}

TEST_CASE("ring ranks that disagree on a small all-reduce's size get a peer_error naming the peer, quickly") {
  const auto start = std::chrono::steady_clock::now();
  std::vector<outcome> got(3);
  auto errors = run_ring(3, [&](int r, tcp_ring& ring) {
    std::vector<float> v(r == 2 ? 200 : 100, 1.0f);
    const auto count = static_cast<std::int64_t>(v.size());
    got[static_cast<std::size_t>(r)] =
        capture([&] { ring.all_reduce(v.data(), count, scalar_type::f32, reduce_kind::sum); });
  }, 5s);
  // Rank 2 hears rank 1's 400 bytes from its predecessor; rank 1 hears rank 2's 800 from its successor.
  CHECK(got[2].peer == 1);
  CHECK(contains(got[2].what, "all_reduce: rank 1 (127.0.0.1:"));
  CHECK(contains(got[2].what, "sent a small all-reduce with the block of 400 bytes of rank 1"));
  CHECK(contains(got[2].what, "expected a small all-reduce with the block of 800 bytes of rank 1"));
  CHECK(got[1].peer == 2);
  CHECK(contains(got[1].what, "rank 2 (127.0.0.1:"));
  CHECK(contains(got[1].what, "disagree"));
  CHECK(got[0].peer == 2);
  CHECK(std::chrono::steady_clock::now() - start < 3s);
}

TEST_CASE("ring shutdown releases a pending small all-reduce at once") {
  std::atomic<bool> finished{false};
  outcome pending, after;
  std::chrono::steady_clock::duration waited{};
  auto errors = run_ring(4, [&](int r, tcp_ring& ring) {
    if (r != 1) {  // never join: their connections stay open until rank 1 is done
      const auto until = std::chrono::steady_clock::now() + 5s;
      while (!finished.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
      return;
    }
    std::vector<float> v(1000, 1.0f);
    auto call = [&] { ring.all_reduce(v.data(), 1000, scalar_type::f32, reduce_kind::sum); };
    std::thread stopper([&] {
      std::this_thread::sleep_for(200ms);
      ring.shutdown();
    });
    const auto start = std::chrono::steady_clock::now();
    pending = capture(call);
    waited = std::chrono::steady_clock::now() - start;
    stopper.join();
    after = capture(call);
    finished.store(true);
  }, 10s);
  for (const auto& e : errors) CHECK(e == "");
  CHECK((pending.peer == 0 || pending.peer == 2));
  CHECK(contains(pending.what, "the ring was shut down here"));
  CHECK(waited >= 150ms);
  CHECK(waited < 2s);
  CHECK((after.peer == 0 || after.peer == 2));
  CHECK(contains(after.what, "shut down"));
}

namespace {

tcp_ring_options tiny_segments() {
  tcp_ring_options o;
  o.segment_bytes = 64;
  o.timeout = 10s;
  return o;
}

}  // namespace

TEST_CASE("ring all-reduce with 64-byte segments sums every dtype, element by element, across 2, 3 and 4 ranks") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    std::vector<std::vector<std::vector<char>>> results(static_cast<std::size_t>(n));
    auto errors = run_ring_with(n, tiny_segments(), [&](int r, tcp_ring& ring) {
      REQUIRE(ring.options().segment_bytes == 64);
      unsigned salt = 0;
      auto run = [&](auto tag, scalar_type type) {
        using T = decltype(tag);
        // Past the small paths (64 KiB), not a multiple of the ranks, of 16 or of a segment.
        const auto large = static_cast<std::int64_t>(tcp_ring::small_all_reduce_bytes / sizeof(T)) + 1 + 2 * 3 * 5 * 7;
        for (std::int64_t count : {std::int64_t{1}, std::int64_t{13}, std::int64_t{1001}, large}) {
          for (reduce_kind op : {reduce_kind::sum, reduce_kind::mean}) {
            // reduce_and_check compares every element with the host's sum and throws on the first
            // difference.
            const auto w = reduce_and_check<T>(r, ring, count, type, op, ++salt);
            const auto* p = reinterpret_cast<const char*>(w.data());
            results[static_cast<std::size_t>(r)].emplace_back(p, p + w.size() * sizeof(T));
          }
        }
      };
      run(float{}, scalar_type::f32);
      run(double{}, scalar_type::f64);
      run(std::int32_t{}, scalar_type::i32);
      run(std::int64_t{}, scalar_type::i64);
    });
    for (const auto& e : errors) CHECK(e == "");
    for (int r = 1; r < n; ++r) CHECK(results[static_cast<std::size_t>(r)] == results[0]);
  }
}

TEST_CASE("ring broadcast and all-gather with 64-byte segments deliver every byte across 2, 3 and 4 ranks") {
  const std::vector<std::size_t> sizes{1, 63, 64, 65, 1000, 4099};
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    std::vector<std::string> failures(static_cast<std::size_t>(n));
    auto errors = run_ring_with(n, tiny_segments(), [&](int r, tcp_ring& ring) {
      auto& failed = failures[static_cast<std::size_t>(r)];
      for (std::size_t bytes : sizes) {
        for (std::size_t misalign : {std::size_t{0}, std::size_t{3}}) {
          const int root = static_cast<int>(bytes % static_cast<std::size_t>(n));
          std::vector<unsigned char> buf(bytes + misalign, 0);
          unsigned char* p = buf.data() + misalign;
          const auto want = pattern_bytes(root, bytes);
          if (r == root) std::memcpy(p, want.data(), bytes);
          ring.broadcast(p, bytes, root);
          if (std::memcmp(p, want.data(), bytes) != 0) failed += "broadcast of " + std::to_string(bytes) + "; ";
        }
        // Blocks of bytes, bytes + 1, ..., one of them empty.
        std::vector<std::size_t> blocks;
        for (int q = 0; q < n; ++q) blocks.push_back(q == 1 ? 0 : bytes + static_cast<std::size_t>(q));
        std::vector<unsigned char> want;
        for (int q = 0; q < n; ++q) {
          const auto b = pattern_bytes(q, blocks[static_cast<std::size_t>(q)]);
          want.insert(want.end(), b.begin(), b.end());
        }
        std::vector<unsigned char> out(want.size());
        const auto mine = pattern_bytes(r, blocks[static_cast<std::size_t>(r)]);
        ring.all_gather(mine.data(), mine.size(), out.data(), blocks);
        if (out != want) failed += "all_gather around " + std::to_string(bytes) + "; ";
      }
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(errors[static_cast<std::size_t>(r)] == "");
      CHECK(failures[static_cast<std::size_t>(r)] == "");
    }
  }
}

TEST_CASE("tcp_ring options: a bad segment size is std::invalid_argument, and the setters change the options") {
  listener own("127.0.0.1", 0);
  for (std::size_t bad : {std::size_t{0}, std::size_t{8}, std::size_t{100}, tcp_ring_options::max_segment_bytes + 8}) {
    CAPTURE(bad);
    tcp_ring_options o;
    o.segment_bytes = bad;
    CHECK_THROWS_AS(tcp_ring(0, 1, own, {{"127.0.0.1", own.port()}}, o), std::invalid_argument);
  }
  tcp_ring_options o;
  o.segment_bytes = 100;
  CHECK_THROWS_WITH_AS(tcp_ring(0, 1, own, {{"127.0.0.1", own.port()}}, o),
                       "tcp_ring: segment_bytes 100 (expected a multiple of 8 in 64..67108864)", std::invalid_argument);
  tcp_ring ring(0, 1, own, {{"127.0.0.1", own.port()}}, 1s);
  CHECK(ring.options().segment_bytes == tcp_ring_options::default_segment_bytes);
  CHECK(ring.options().timeout == 1s);
  CHECK(tcp_ring_options{}.timeout == 60s);  // bounded unless asked otherwise
  CHECK(ring.options().spin == tcp_ring_options::default_spin);
  ring.set_timeout(250ms);
  ring.set_spin(7us, true);
  CHECK(ring.options().timeout == 250ms);
  CHECK(ring.options().spin == 7us);
  CHECK(ring.options().yield_while_spinning);
}

TEST_CASE("ring all-reduce reports how long it waited for its predecessor to join, small and large") {
  // Rank 1 joins each all-reduce 100 ms after rank 0: rank 0's wait for its predecessor's first
  // byte covers at least those 100 ms (it cannot arrive before rank 1 sends); rank 1 finds rank
  // 0's first bytes already sent, so its own wait is shorter.
  for (std::int64_t count : {std::int64_t{100}, std::int64_t{300000}}) {
    CAPTURE(count);
    std::vector<tcp_ring::peer_wait> waits(2);
    std::atomic<bool> rank0_joining{false};
    std::chrono::steady_clock::time_point rank1_joined;
    auto errors = run_ring(2, [&](int r, tcp_ring& ring) {
      std::vector<float> v(static_cast<std::size_t>(count), 1.0f);
      ring.all_reduce(v.data(), count, scalar_type::f32, reduce_kind::sum);  // both connected and warm
      // Rank 1's 100 ms start once rank 0 is on its way into the second all-reduce (a rank 0 that
      // the OS runs late must not eat into them).
      if (r == 0) rank0_joining = true;
      if (r == 1) {
        while (!rank0_joining) std::this_thread::yield();
        std::this_thread::sleep_for(100ms);
        rank1_joined = std::chrono::steady_clock::now();
      }
      ring.all_reduce(v.data(), count, scalar_type::f32, reduce_kind::sum);
      waits[static_cast<std::size_t>(r)] = ring.last_all_reduce_wait();
      CHECK(v.front() == 4.0f);
      CHECK(v.back() == 4.0f);
    });
    for (const auto& e : errors) CHECK(e == "");
    const auto waited = [&](int r) { return waits[static_cast<std::size_t>(r)].first_from_prev - waits[static_cast<std::size_t>(r)].begin; };
    CHECK(waits[0].first_from_prev >= rank1_joined);  // its predecessor's bytes came after it joined
    CHECK(waited(0) >= 100ms);
    CHECK(waited(1) >= 0ms);
    CHECK(waited(1) < waited(0));
  }
  // One rank waits for nobody.
  auto errors = run_ring(1, [&](int, tcp_ring& ring) {
    float x = 1.0f;
    ring.all_reduce(&x, 1, scalar_type::f32, reduce_kind::sum);
    const tcp_ring::peer_wait w = ring.last_all_reduce_wait();
    CHECK(w.first_from_prev == w.begin);
  });
  CHECK(errors[0] == "");
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
