// tcp_ring's options and listener: segment sizes, the wait for a predecessor, a listener on 0.0.0.0.
#include "tcp_ring_harness.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace tcp_ring_test;

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

}  // namespace TROUPE_TEST_FILE
