// tcp_ring's all-reduce across ranks on loopback: every dtype, large and small, a peer lost or late.
#include "tcp_ring_harness.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace tcp_ring_test;

namespace {

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

}  // namespace TROUPE_TEST_FILE
