#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "troupe/kernels/reduce_kernels.hpp"
#include "troupe/transport/shm_group.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::transport;
using namespace std::chrono_literals;

namespace {

// Runs body(rank) on `n` threads and returns what each threw ("" when it returned).
std::vector<std::string> on_threads(int n, const std::function<void(int)>& body) {
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

buffer make_buffer(const std::vector<float>& in, std::vector<float>& out) {
  buffer b;
  b.in = in.data();
  b.out = out.data();
  b.count = static_cast<std::int64_t>(in.size());
  b.type = scalar_type::f32;
  b.shape = {b.count};
  return b;
}

void all_reduce_one(shm_group& group, int rank, const buffer& b) { group.all_reduce(rank, &b, 1, reduce_kind::sum); }

// Rank r's element i in input set `set`: distinct per rank, per element (over a period of 4096)
// and per set, and small integers, so any sum of up to 8 of them is exact in float in any order.
float element(int set, int rank, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 31 + static_cast<std::size_t>(set) * 17) % 4096) * 16 + rank + 1);
}

// Every rank's input for `set`, and their sum computed apart from the library, in integers.
struct inputs {
  std::vector<std::vector<float>> per_rank;
  std::vector<float> sum;
};

inputs make_inputs(int set, int n, std::size_t count) {
  inputs in;
  in.per_rank.resize(static_cast<std::size_t>(n));
  in.sum.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    std::int64_t total = 0;
    for (int r = 0; r < n; ++r) {
      const float v = element(set, r, i);
      in.per_rank[static_cast<std::size_t>(r)].push_back(v);
      total += static_cast<std::int64_t>(v);
    }
    in.sum[i] = static_cast<float>(total);
  }
  return in;
}

// How many elements of `got` differ from `want`, and the first one ("" when none).
std::string differences(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return std::to_string(got.size()) + " elements, expected " + std::to_string(want.size());
  std::size_t wrong = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      if (wrong++ == 0) first = i;
    }
  }
  if (wrong == 0) return "";
  return std::to_string(wrong) + " wrong elements, the first at " + std::to_string(first) + ": " +
         std::to_string(got[first]) + " instead of " + std::to_string(want[first]);
}

}  // namespace

TEST_CASE("shm all_reduce over threads, on both paths and repeatedly") {
  for (int n : {1, 2, 3, 4, 8}) {
    for (std::size_t count : {std::size_t{1}, std::size_t{13}, std::size_t{200000}}) {
      CAPTURE(n);
      CAPTURE(count);
      shm_group group(n, 20us);
      // Two input sets in turn, so that a round that left its output alone shows the last
      // round's sums; inputs are never written once posted (the group may still read them).
      const inputs sets[2] = {make_inputs(0, n, count), make_inputs(1, n, count)};
      std::vector<std::vector<float>> outs(static_cast<std::size_t>(n));
      std::vector<std::string> wrong(static_cast<std::size_t>(n));
      auto errors = on_threads(n, [&](int r) {
        auto& out = outs[static_cast<std::size_t>(r)];
        for (int round = 0; round < 20; ++round) {
          const inputs& in = sets[round % 2];
          // Only this rank writes its output between its collectives: the others are done with it
          // when its all_reduce returns.
          out.assign(count, -1.0f);
          all_reduce_one(group, r, make_buffer(in.per_rank[static_cast<std::size_t>(r)], out));
          const std::string diff = differences(out, in.sum);
          if (!diff.empty() && wrong[static_cast<std::size_t>(r)].empty()) {
            wrong[static_cast<std::size_t>(r)] = "round " + std::to_string(round) + ": " + diff;
          }
        }
      });
      for (const auto& e : errors) CHECK(e == "");
      for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        CHECK(wrong[static_cast<std::size_t>(r)] == "");
      }
    }
  }
}

TEST_CASE("reduce_range sums in input order and averages") {
  std::vector<double> a{1, 2}, b{3, 4}, c{5, 6}, out(2);
  const void* ins[] = {a.data(), b.data(), c.data()};
  void* outs[] = {out.data()};
  troupe::kernels::reduce_range(ins, 3, outs, 1, 0, 2, scalar_type::f64, reduce_kind::mean);
  CHECK(out == std::vector<double>{3, 4});
  std::vector<std::int32_t> x{7, -7}, y{2, 2}, o(2);
  const void* ins2[] = {x.data(), y.data()};
  void* outs2[] = {o.data()};
  troupe::kernels::reduce_range(ins2, 2, outs2, 1, 0, 2, scalar_type::i32, reduce_kind::mean);
  CHECK(o == std::vector<std::int32_t>{4, -2});  // integer mean truncates toward zero
}

TEST_CASE("abort releases ranks waiting in a collective and reset re-arms the group") {
  shm_group group(3, 5us);
  std::vector<float> in(4, 1.0f);
  std::vector<std::vector<float>> outs(3, std::vector<float>(4));
  auto errors = on_threads(3, [&](int r) {
    if (r == 2) {
      std::this_thread::sleep_for(20ms);  // the others are asleep in the barrier by now
      group.abort(2, "replica 2 failed: disk full");
      return;
    }
    all_reduce_one(group, r, make_buffer(in, outs[static_cast<std::size_t>(r)]));
  });
  CHECK(errors[0] == "all_reduce abandoned: replica 2 failed: disk full");
  CHECK(errors[1] == errors[0]);
  group.reset();
  errors = on_threads(3, [&](int r) {
    all_reduce_one(group, r, make_buffer(in, outs[static_cast<std::size_t>(r)]));
  });
  CHECK(errors == std::vector<std::string>(3, ""));
  CHECK(outs[2][3] == 3.0f);
}

TEST_CASE("a rank that finishes while others wait for it fails the collective instead of hanging") {
  shm_group group(2, 5us);
  std::vector<float> in(4, 1.0f), out(4);
  auto errors = on_threads(2, [&](int r) {
    if (r == 1) {
      std::this_thread::sleep_for(10ms);
      group.finish(1);
      return;
    }
    all_reduce_one(group, 0, make_buffer(in, out));
  });
  CHECK(errors[0].find("replica 1 returned from its function without joining it") != std::string::npos);
}

TEST_CASE("a timeout names the ranks that never arrived") {
  shm_group group(3, 5us, 50ms);
  std::vector<float> in(4, 1.0f), out0(4), out1(4);
  auto errors = on_threads(2, [&](int r) {
    all_reduce_one(group, r, make_buffer(in, r == 0 ? out0 : out1));
  });
  CHECK(errors[0].find("timed out after 50 ms waiting for replicas 2") != std::string::npos);
  CHECK(errors[1].find("timed out") != std::string::npos);
}

TEST_CASE("mismatched buffers are refused by every rank before any byte moves") {
  shm_group group(2, 5us);
  std::vector<float> a(4, 1.0f), b(3, 1.0f), out_a(4, -1.0f), out_b(3, -1.0f);
  auto errors = on_threads(2, [&](int r) {
    if (r == 0) {
      all_reduce_one(group, 0, make_buffer(a, out_a));
    } else {
      all_reduce_one(group, 1, make_buffer(b, out_b));
    }
  });
  CHECK(errors[0] == "all_reduce: replica 0 sent float32 tensor of shape [4], replica 1 sent float32 tensor of shape [3]");
  CHECK(errors[1] == errors[0]);
  CHECK(out_a[0] == -1.0f);
  CHECK(out_b[0] == -1.0f);
}

TEST_CASE("shm_group refuses a size below one") { CHECK_THROWS_AS(shm_group(0, 0us), std::invalid_argument); }

TEST_CASE("a fused all_reduce with shared_output writes rank 0's output only - a small one every rank's") {
  for (int n : {2, 3, 4}) {
    for (std::size_t count : {std::size_t{8}, std::size_t{300001}}) {
      CAPTURE(n);
      CAPTURE(count);
      const bool fused = shm_group::fused(count * sizeof(float), n);
      CHECK(fused == (count * sizeof(float) > shm_group::small_bytes));
      shm_group group(n, 20us);
      const inputs in = make_inputs(0, n, count);
      std::vector<std::vector<float>> outs(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) outs[static_cast<std::size_t>(r)].assign(count, -1.0f);
      for (int round = 0; round < 3; ++round) {
        auto errors = on_threads(n, [&](int r) {
          buffer b = make_buffer(in.per_rank[static_cast<std::size_t>(r)], outs[static_cast<std::size_t>(r)]);
          if (fused && r != 0) b.out = nullptr;  // never written
          group.all_reduce(r, &b, 1, reduce_kind::sum, true);
        });
        for (const auto& e : errors) CHECK(e.empty());
      }
      CHECK(differences(outs[0], in.sum) == "");
      for (int r = 1; r < n; ++r) {
        CAPTURE(r);
        CHECK(differences(outs[static_cast<std::size_t>(r)], fused ? std::vector<float>(count, -1.0f) : in.sum) == "");
      }
    }
  }
}

}  // namespace TROUPE_TEST_FILE
