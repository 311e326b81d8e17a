// tcp_ring's broadcast and all-gather: every root and block, bad arguments, disagreeing ranks, shutdown.
#include "tcp_ring_harness.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace tcp_ring_test;

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

}  // namespace TROUPE_TEST_FILE
