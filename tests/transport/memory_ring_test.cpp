#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "troupe/transport/memory_ring.hpp"
#include "troupe/transport/tcp_ring.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::transport;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

// What a rank's body did: returned (peer -1, what empty) or threw (the peer_error's peer, or -2
// for another exception).
struct outcome {
  int peer = -1;
  std::string what;
  peer_error::fault kind = peer_error::fault::link;
  std::string for_everyone;
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// `n` ranks as threads over a memory_ring with `hook`. A rank whose body throws shuts its ring down
// at once (unless `shut_down_on_error` is false), as a process that ends would close its sockets;
// one that returns keeps its connections open until every rank is done, so that its neighbours
// fail for their own reasons.
std::vector<outcome> run_memory(int n, fault_hook hook, const tcp_ring_options& options,
                                const std::function<void(int, tcp_ring&)>& body, bool shut_down_on_error = true,
                                const std::string& token = {}) {
  memory_ring net(n, std::move(hook), token);
  std::vector<std::unique_ptr<ring_link>> links;
  for (int r = 0; r < n; ++r) links.push_back(net.link(r));
  std::vector<outcome> got(static_cast<std::size_t>(n));
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto& o = got[static_cast<std::size_t>(r)];
      std::unique_ptr<tcp_ring> ring;
      try {
        ring = std::make_unique<tcp_ring>(r, n, std::move(links[static_cast<std::size_t>(r)]), options);
        body(r, *ring);
      } catch (const peer_error& e) {
        o = {e.peer(), e.what(), e.kind(), e.for_everyone()};
      } catch (const std::exception& e) {
        o = {-2, e.what(), peer_error::fault::link, {}};
      }
      if (!o.what.empty() && shut_down_on_error && ring) ring->shutdown();
      ++done;
      const auto until = clock_type::now() + 10s;
      while (done.load() < n && clock_type::now() < until) std::this_thread::sleep_for(1ms);
    });
  }
  for (auto& t : threads) t.join();
  return got;
}

tcp_ring_options with(std::chrono::milliseconds timeout, std::size_t segment_bytes = tcp_ring_options::default_segment_bytes) {
  tcp_ring_options o;
  o.timeout = timeout;
  o.segment_bytes = segment_bytes;
  return o;
}

// Every rank's all-reduce of `count` f32 values (rank r holds r + 1 + i % 7 at i), checked element
// by element; a wrong sum throws, so a rank that returns returned the right one.
void sum_and_check(int r, tcp_ring& ring, std::int64_t count) {
  const int n = ring.size();
  std::vector<float> v(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(r + 1 + i % 7);
  ring.all_reduce(v.data(), count, scalar_type::f32, reduce_kind::sum);
  for (std::int64_t i = 0; i < count; ++i) {
    const float want = static_cast<float>(n * (n + 1) / 2 + n * (i % 7));
    if (v[static_cast<std::size_t>(i)] != want) {
      throw std::logic_error("rank " + std::to_string(r) + ": wrong sum at " + std::to_string(i));
    }
  }
}

// A hook that applies `change` to the `number`th frame from `from` to `to` and delivers the rest.
fault_hook on_frame(int from, int to, std::uint64_t number, std::function<frame_fate(std::vector<unsigned char>&)> change) {
  return [=](frame_in_flight& f) {
    if (f.from == from && f.to == to && f.number == number) return change(f.bytes);
    return frame_fate::deliver();
  };
}

// A hook that rewrites one chunk frame's fields.
fault_hook forge(int from, int to, std::uint64_t number, std::function<void(chunk_fields&)> edit) {
  return on_frame(from, to, number, [edit, number](std::vector<unsigned char>& bytes) {
    auto fields = decode_chunk_frame(bytes);
    if (!fields) throw std::logic_error("forge: frame " + std::to_string(number) + " is not a chunk frame");
    edit(*fields);
    bytes = encode_chunk_frame(*fields);
    return frame_fate::deliver();
  });
}

}  // namespace

TEST_CASE("the ring's collectives over the in-process double give the right results across 2, 3 and 4 ranks, "
          "with the next segment sent ahead and without") {
  for (int n : {2, 3, 4}) {
    for (std::size_t segment : {std::size_t{64}, tcp_ring_options::default_segment_bytes}) {
      for (bool ahead : {true, false}) {
        CAPTURE(n);
        CAPTURE(segment);
        CAPTURE(ahead);
        tcp_ring_options options = with(5s, segment);
        options.send_ahead = ahead;
        std::atomic<int> frames{0};
        auto got = run_memory(n, [&](frame_in_flight&) { ++frames; return frame_fate::deliver(); }, options,
                              [&](int r, tcp_ring& ring) {
                                for (std::int64_t count : {std::int64_t{1}, std::int64_t{1001}, std::int64_t{20011}}) {
                                  sum_and_check(r, ring, count);
                                }
                                std::vector<char> b(3000, r == 1 ? 'x' : 'o');
                                ring.broadcast(b.data(), b.size(), 1);
                                if (b != std::vector<char>(3000, 'x')) throw std::logic_error("broadcast");
                              });
        for (const auto& o : got) CHECK(o.what == "");
        CHECK(frames.load() > 0);
      }
    }
  }
}

TEST_CASE("a ring frame dropped at the end is a timeout naming the peer that did not send it") {
  const auto start = clock_type::now();
  // Two ranks swap one frame each; rank 0's never reaches rank 1.
  auto got = run_memory(2, on_frame(0, 1, 0, [](auto&) { return frame_fate::drop(); }), with(300ms),
                        [](int r, tcp_ring& ring) { sum_and_check(r, ring, 100); });
  CHECK(got[0].what == "");  // rank 1's frame arrived: rank 0 has the right sum
  CHECK(got[1].peer == 0);
  CHECK(got[1].what == "timed out after 300 ms waiting for rank 0 (in-process) to send");
  CHECK(clock_type::now() - start < 3s);
}

TEST_CASE("a ring frame dropped mid-stream is caught by the next frame's offset, naming the peer, before the timeout") {
  const auto start = clock_type::now();
  // 64-byte segments: rank 0 sends its chunk in many frames; the 3rd never arrives.
  auto got = run_memory(2, on_frame(0, 1, 2, [](auto&) { return frame_fate::drop(); }), with(5s, 64),
                        [](int r, tcp_ring& ring) { sum_and_check(r, ring, 20011); });
  CHECK(got[1].peer == 0);
  CAPTURE(got[1].what);
  CHECK(contains(got[1].what, "all_reduce: malformed frame from rank 0 (in-process): "));
  CHECK(contains(got[1].what, "at offset 48 in an all-reduce of chunk 0 (step 0, collective 0), expected 64 bytes"));
  CHECK(contains(got[1].what, "at offset 32"));
  CHECK(got[0].peer == 1);  // rank 1 left: rank 0 is told, not left waiting
  CHECK(clock_type::now() - start < 3s);
}

TEST_CASE("a delayed ring frame still arrives and the all-reduce succeeds within the timeout") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    const auto start = clock_type::now();
    auto got = run_memory(n, on_frame(0, 1, 1, [](auto&) { return frame_fate::delay_by(200ms); }), with(2s, 64),
                          [](int r, tcp_ring& ring) {
                            sum_and_check(r, ring, 20011);
                            sum_and_check(r, ring, 77);
                          });
    for (const auto& o : got) CHECK(o.what == "");
    const auto took = clock_type::now() - start;
    CHECK(took >= 190ms);
    CHECK(took < 2s);
  }
}

TEST_CASE("a ring frame delayed past the timeout is a timeout naming the peer") {
  auto got = run_memory(2, on_frame(1, 0, 0, [](auto&) { return frame_fate::delay_by(1500ms); }), with(200ms),
                        [](int r, tcp_ring& ring) { sum_and_check(r, ring, 100); });
  CHECK(got[0].peer == 1);
  CHECK(got[0].what == "timed out after 200 ms waiting for rank 1 (in-process) to send");
}

TEST_CASE("corrupt ring frames are a clear error naming the peer, never a wrong sum") {
  // Layout of a frame: the segment table (segment count - 1, each segment's words, padding), then
  // the segments; the first begins with the root pointer of the Chunk.
  struct corruption {
    const char* name;
    std::function<void(std::vector<unsigned char>&)> apply;
    const char* expect;
  };
  const std::vector<corruption> corruptions{
      {"a segment count beyond the limit",
       [](auto& b) { b[0] = 0xff; b[1] = 0xff; },
       "malformed frame from rank 0 (in-process): 65535+1 segments"},
      {"a segment longer than any frame",
       [](auto& b) { b[5] = 0xff; b[6] = 0xff; },
       "oversized frame from rank 0 (in-process): "},
      {"a root pointer that points nowhere",
       [](auto& b) { std::memset(b.data() + 16, 0xfe, 8); },
       "all_reduce: malformed frame from rank 0 (in-process): "},
      {"a root pointer of the wrong kind",
       [](auto& b) { b[16] = 0x01; },
       "all_reduce: malformed frame from rank 0 (in-process): "},
      {"a null root pointer (every field 0, no data)",
       [](auto& b) { std::memset(b.data() + 16, 0, 8); },
       "all_reduce: malformed frame from rank 0 (in-process): 0 bytes, 0 elements"},
  };
  for (const auto& c : corruptions) {
    for (std::int64_t count : {std::int64_t{100}, std::int64_t{20011}}) {
      CAPTURE(c.name);
      CAPTURE(count);
      const auto start = clock_type::now();
      auto got = run_memory(2, on_frame(0, 1, 0, [&](std::vector<unsigned char>& b) {
                              c.apply(b);
                              return frame_fate::deliver();
                            }),
                            with(5s), [&](int r, tcp_ring& ring) { sum_and_check(r, ring, count); });
      // Rank 1 never returns a sum from the corrupt frame; rank 0 either has the right one (two
      // ranks, one swap) or is told that rank 1 left.
      CHECK(got[1].peer == 0);
      CHECK(contains(got[1].what, c.expect));
      CHECK(!contains(got[0].what, "wrong sum"));
      CHECK(clock_type::now() - start < 3s);
    }
  }
}

TEST_CASE("a ring frame with a wrong collective kind, offset, length, type or operation is refused naming the peer") {
  struct forgery {
    const char* name;
    std::function<void(chunk_fields&)> edit;
    const char* expect;
  };
  const std::vector<forgery> forgeries{
      {"kind", [](chunk_fields& f) { f.kind = frame_kind::broadcast; f.total = 400; },
       "all_reduce: rank 0 (in-process) sent a broadcast of 400 bytes from root 0 (step 0, collective 0), rank 1 (this "
       "worker) expected an all-reduce of chunk 0 (step 0, collective 0) (the workers disagree on the collective)"},
      {"operation", [](chunk_fields& f) { f.sequence = 7; },
       "all_reduce: rank 0 (in-process) is at step 0, collective 7 (it sent an all-reduce of chunk 0 (step 0, collective "
       "7)), rank 1 (this worker) at step 0, collective 0 (it expected an all-reduce of chunk 0 (step 0, collective 0)) "
       "(the workers disagree on the collective: one skipped, added or reordered a collective)"},
      {"step", [](chunk_fields& f) { f.step = 3; },
       "all_reduce: rank 0 (in-process) is at step 3, collective 0 (it sent an all-reduce of chunk 0 (step 3, collective "
       "0)), rank 1 (this worker) at step 0, collective 0"},
      {"offset", [](chunk_fields& f) { f.offset = 16; },
       "all_reduce: malformed frame from rank 0 (in-process): 400 bytes, 100 elements of type 0 at offset 16"},
      {"count", [](chunk_fields& f) { f.count = 99; },
       "all_reduce: malformed frame from rank 0 (in-process): 400 bytes, 99 elements of type 0 at offset 0"},
      {"short data", [](chunk_fields& f) { f.data.resize(396); },
       "all_reduce: malformed frame from rank 0 (in-process): 396 bytes, 100 elements"},
      {"long data", [](chunk_fields& f) { f.data.resize(404); },
       "all_reduce: malformed frame from rank 0 (in-process): 404 bytes, 100 elements"},
      {"type", [](chunk_fields& f) { f.type = 2; },
       "all_reduce: malformed frame from rank 0 (in-process): 400 bytes, 100 elements of type 2"},
      {"type named", [](chunk_fields& f) { f.type = 5; },
       "at offset 0 (it sent float16, this worker expected float32: every worker must all-reduce the same dtype "
       "with the same CommunicationOptions::compression)"},
  };
  for (const auto& f : forgeries) {
    CAPTURE(f.name);
    auto got = run_memory(2, forge(0, 1, 0, f.edit), with(5s), [](int r, tcp_ring& ring) { sum_and_check(r, ring, 100); });
    CHECK(got[1].peer == 0);
    CHECK(contains(got[1].what, f.expect));
    CHECK(contains(got[1].what, "expected 400 bytes, 100 elements of type 0 at offset 0") !=
          contains(got[1].what, "disagree"));
  }
}

TEST_CASE("a rank that skips a collective of a step fails on both ranks, naming both steps and numbers") {
  // Rank 1 skips the second all-reduce of step 2: its step 3 meets rank 0's step 2. Both see it;
  // no value of one step is added to another's.
  for (std::int64_t count : {std::int64_t{100}, std::int64_t{1} << 20}) {  // swap and ring paths
    CAPTURE(count);
    auto got = run_memory(2, {}, with(5s), [count](int r, tcp_ring& ring) {
      std::vector<float> v(static_cast<std::size_t>(count), 1.0f);
      for (std::uint64_t step = 1; step <= 3; ++step) {
        ring.begin_step(step);
        ring.all_reduce(v.data(), count, scalar_type::f32, reduce_kind::sum);
        if (!(r == 1 && step == 2)) ring.all_reduce(v.data(), count, scalar_type::f32, reduce_kind::sum);
      }
    });
    CHECK(got[0].peer == 1);
    CHECK(contains(got[0].what, "rank 1 (in-process) is at step 3, collective 0"));
    CHECK(contains(got[0].what, "rank 0 (this worker) at step 2, collective 1"));
    CHECK(got[1].peer == 0);
    CHECK(contains(got[1].what, "rank 0 (in-process) is at step 2, collective 1"));
    CHECK(contains(got[1].what, "rank 1 (this worker) at step 3, collective 0"));
  }
}

TEST_CASE("collectives are numbered from 0 in every step, and broadcast and all-gather carry the step too") {
  auto got = run_memory(3, {}, with(5s), [](int r, tcp_ring& ring) {
    std::vector<char> bytes(100, r == 0 ? 'x' : 0);
    std::vector<char> all(300);
    for (std::uint64_t step = 4; step <= 5; ++step) {
      ring.begin_step(step);
      CHECK(ring.step() == step);
      ring.broadcast(bytes.data(), bytes.size(), 0);
      ring.all_gather(bytes.data(), bytes.size(), all.data(), {100, 100, 100});
    }
    CHECK(bytes[99] == 'x');
    CHECK(all[299] == 'x');
  });
  for (const auto& o : got) CHECK(o.what.empty());
  auto ahead = run_memory(3, {}, with(5s), [](int r, tcp_ring& ring) {
    std::vector<char> bytes(100, 0);
    ring.begin_step(r == 2 ? 8 : 7);
    ring.broadcast(bytes.data(), bytes.size(), 0);
  });
  CHECK(contains(ahead[0].what + ahead[1].what + ahead[2].what, "is at step 8, collective 0"));
}

TEST_CASE("forged ring broadcast and all-gather frames are refused naming the peer across 3 ranks") {
  SUBCASE("a broadcast segment at the wrong offset") {
    auto got = run_memory(3, forge(1, 2, 1, [](chunk_fields& f) { f.offset += 8; }), with(5s, 64),
                          [](int r, tcp_ring& ring) {
                            std::vector<char> b(1000, r == 0 ? 'r' : '-');
                            ring.broadcast(b.data(), b.size(), 0);
                          });
    CHECK(got[2].peer == 1);
    CHECK(contains(got[2].what, "broadcast: malformed frame from rank 1 (in-process): 64 bytes, 64 elements of type 4 "
                                "at offset 72 in a broadcast of 1000 bytes from root 0 (step 0, collective 0), expected 64 "
                                "bytes, 64 elements of type 4 at offset 64"));
  }
  SUBCASE("an all-gather block that claims another rank") {
    auto got = run_memory(3, forge(0, 1, 0, [](chunk_fields& f) { f.index = 2; }), with(5s, 64),
                          [](int r, tcp_ring& ring) {
                            std::vector<char> mine(100, static_cast<char>('a' + r)), out(300);
                            ring.all_gather(mine.data(), mine.size(), out.data(), {100, 100, 100});
                          });
    CHECK(got[1].peer == 0);
    CHECK(contains(got[1].what, "all_gather: rank 0 (in-process) sent an all-gather with a block of 100 bytes from "
                                "rank 2 (step 0, collective 0), rank 1 (this worker) expected an all-gather with a block of 100 "
                                "bytes from rank 0"));
  }
}

TEST_CASE("a ring rank whose link closes mid-collective is named by its neighbours over the in-process double") {
  // Only rank 1 closes its link: the others keep theirs open when they fail, so that each is told
  // about rank 1 and not about a neighbour that failed because of it.
  auto got = run_memory(
      3, {}, with(5s),
      [](int r, tcp_ring& ring) {
        sum_and_check(r, ring, 1000);
        if (r == 1) {
          ring.shutdown();  // as at exit
          throw std::runtime_error("rank 1 leaves");
        }
        sum_and_check(r, ring, 1000);
      },
      false);
  CHECK(got[1].what == "rank 1 leaves");
  CAPTURE(got[2].what);
  CHECK(got[2].peer == 1);
  CHECK(contains(got[2].what, "rank 1 (in-process) closed its connection"));
  CHECK(got[0].peer == 1);
  CHECK(contains(got[0].what, "rank 1 (in-process) closed its connection"));
}

TEST_CASE("memory_ring refuses fewer than 2 ranks, a rank out of range and a link taken twice") {
  CHECK_THROWS_WITH_AS(memory_ring(1), "memory_ring: 1 ranks (expected at least 2)", std::invalid_argument);
  memory_ring net(2);
  CHECK_THROWS_WITH_AS(net.link(2), "memory_ring: rank 2 out of range for 2 ranks (expected 0..1)", std::out_of_range);
  auto first = net.link(0);
  CHECK(first->peer(ring_side::next).rank == 1);
  CHECK(first->peer(ring_side::prev).name == "rank 1 (in-process)");
  CHECK_THROWS_WITH_AS(net.link(0), "memory_ring: the link of rank 0 was taken already", std::invalid_argument);
  CHECK_THROWS_AS(tcp_ring(0, 2, nullptr), std::invalid_argument);
}

TEST_CASE("with a cluster token, a ring frame with one payload byte flipped fails its integrity check naming the link") {
  for (std::int64_t count : {std::int64_t{100}, std::int64_t{20000}}) {
    CAPTURE(count);
    const auto start = clock_type::now();
    auto got = run_memory(2, on_frame(0, 1, 0, [](std::vector<unsigned char>& b) {
                            // The frame's last data byte, just before its 16-byte tag.
                            b[b.size() - 17] ^= 0x01;
                            return frame_fate::deliver();
                          }),
                          with(5s), [&](int r, tcp_ring& ring) { sum_and_check(r, ring, count); }, true, "the token");
    CHECK(got[1].peer == 0);
    CHECK(contains(got[1].what, "a frame from rank 0 (in-process) failed its integrity check"));
    // The other workers learn it as a link tampered with, not as workers out of step.
    CHECK(got[1].kind == peer_error::fault::altered);
    CHECK(got[1].for_everyone == got[1].what);
    CHECK(!contains(got[0].what, "wrong sum"));
    CHECK(clock_type::now() - start < 3s);
  }
}

TEST_CASE("with a cluster token, a ring frame replayed in place of a later one fails its integrity check") {
  std::vector<unsigned char> first;
  auto got = run_memory(2,
                        [&](frame_in_flight& f) {
                          if (f.from != 0 || f.to != 1) return frame_fate::deliver();
                          if (f.number == 0) first = f.bytes;
                          if (f.number == 1) f.bytes = first;  // the same bytes, tag and all, again
                          return frame_fate::deliver();
                        },
                        with(5s),
                        [&](int r, tcp_ring& ring) {
                          for (int k = 0; k < 2; ++k) sum_and_check(r, ring, 100);
                        },
                        true, "the token");
  CHECK(got[1].peer == 0);
  CHECK(contains(got[1].what, "failed its integrity check"));
}

TEST_CASE("with a cluster token, large frames (tagged beside the ring's thread) altered, replayed or reordered fail their integrity check") {
  // 2 ranks, 300001 floats: each frame carries a chunk of 600 KB, hashed on the link's tag thread
  // while its bytes move. Rank 0 sends rank 1 two frames per all-reduce (its chunk, then the sum).
  const std::int64_t count = 300001;
  auto frames_to_1 = [](std::function<void(frame_in_flight&)> change) {
    return [change](frame_in_flight& f) {
      if (f.from == 0 && f.to == 1) change(f);
      return frame_fate::deliver();
    };
  };
  std::vector<unsigned char> held;
  const std::vector<std::pair<const char*, fault_hook>> attacks = {
      {"a byte in the middle of the first frame flipped",
       frames_to_1([](frame_in_flight& f) {
         if (f.number == 0) f.bytes[f.bytes.size() / 2] ^= 0x10;
       })},
      {"a byte of the second frame flipped",
       frames_to_1([](frame_in_flight& f) {
         if (f.number == 1) f.bytes[f.bytes.size() / 3] ^= 0x01;
       })},
      {"the first frame replayed in place of the second",
       frames_to_1([&](frame_in_flight& f) {
         if (f.number == 0) held = f.bytes;
         if (f.number == 1) f.bytes = held;
       })},
      {"the first two frames swapped",
       [&](frame_in_flight& f) {
         if (f.from != 0 || f.to != 1) return frame_fate::deliver();
         if (f.number == 0) {
           held = f.bytes;
           return frame_fate::drop();
         }
         if (f.number == 1) f.bytes.insert(f.bytes.end(), held.begin(), held.end());  // 1, then 0
         return frame_fate::deliver();
       }},
  };
  for (const auto& [what, hook] : attacks) {
    CAPTURE(what);
    held.clear();
    const auto start = clock_type::now();
    auto got = run_memory(2, hook, with(5s),
                          [&](int r, tcp_ring& ring) {
                            for (int k = 0; k < 2; ++k) sum_and_check(r, ring, count);
                          },
                          true, "the token");
    CHECK(got[1].peer == 0);
    CHECK(contains(got[1].what, "a frame from rank 0 (in-process) failed its integrity check"));
    CHECK(got[1].kind == peer_error::fault::altered);
    CHECK(!contains(got[0].what, "wrong sum"));
    CHECK(clock_type::now() - start < 3s);
  }
}

TEST_CASE("with a cluster token, tagged frames give the right results across 2, 3 and 4 ranks") {
  for (int n : {2, 3, 4}) {
    for (std::int64_t count : {std::int64_t{0}, std::int64_t{1}, std::int64_t{100}, std::int64_t{300001}}) {
      CAPTURE(n);
      CAPTURE(count);
      auto got = run_memory(n, {}, with(10s, 64 * 1024), [&](int r, tcp_ring& ring) { sum_and_check(r, ring, count); },
                            true, "the token");
      for (const auto& o : got) CHECK(o.what == "");
    }
  }
}

TEST_CASE("two named all-reduces of the same shape run in swapped order fail on both ranks naming both collectives") {
  // Rank 0 runs a then b, rank 1 b then a: the same kind, type and size, so only their names tell
  // them apart.
  std::vector<std::vector<float>> results(2);
  auto got = run_memory(2, {}, with(5s), [&](int r, tcp_ring& ring) {
    std::vector<float> a(4, 1.0f), b(4, 100.0f);
    const std::uint64_t key_a = 11, key_b = 22;
    auto run = [&](std::vector<float>& v, std::uint64_t key) {
      ring.name_next_collective(key);
      ring.all_reduce(v.data(), 4, scalar_type::f32, reduce_kind::sum);
    };
    if (r == 0) {
      run(a, key_a);
      run(b, key_b);
    } else {
      run(b, key_b);
      run(a, key_a);
    }
    results[static_cast<std::size_t>(r)] = a;
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(got[static_cast<std::size_t>(r)].peer == 1 - r);
    CHECK(contains(got[static_cast<std::size_t>(r)].what, "the workers run their collectives in different orders"));
    CHECK(contains(got[static_cast<std::size_t>(r)].what, "named 11"));
    CHECK(contains(got[static_cast<std::size_t>(r)].what, "named 22"));
  }
}

}  // namespace TROUPE_TEST_FILE
