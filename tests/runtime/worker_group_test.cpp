// WorkerGroup, the workers a strategy spans: the one-process group, and the ring group over real
// TCP rings between threads on loopback (no rendezvous: the members are made here).
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "distribute/collectives/worker_group.hpp"
#include "troupe/actors/membership_state.hpp"
#include "troupe/kernels/half_kernels.hpp"
#include "test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::message_of;
namespace wg = troupe::distribute::detail;

namespace {

std::string task(int rank) { return "/job:worker/replica:0/task:" + std::to_string(rank); }

// Forms an n-worker ring on loopback and runs body(rank, group, failures) on n threads; the
// rings' collectives are bounded by 5 s, so a broken test fails instead of hanging.
void with_ring_groups(int n, const std::function<void(int, wg::RingWorkerGroup&, wg::WorkerFailures&)>& body) {
  std::vector<std::unique_ptr<transport::listener>> listeners;
  std::vector<transport::endpoint> peers;
  std::vector<actors::member> members;
  for (int r = 0; r < n; ++r) {
    listeners.push_back(std::make_unique<transport::listener>("127.0.0.1", 0));
    peers.push_back({"127.0.0.1", listeners.back()->port()});
    actors::member m;
    m.rank = r;
    m.task = task(r);
    m.data_host = "127.0.0.1";
    m.data_port = listeners.back()->port();
    m.devices = 1;
    members.push_back(m);
  }
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      errors[static_cast<std::size_t>(r)] = message_of([&] {
        auto& own = *listeners[static_cast<std::size_t>(r)];
        auto ring = std::make_unique<transport::tcp_ring>(r, n, own, peers, std::chrono::milliseconds(5000));
        ring->set_timeout(std::chrono::milliseconds(5000));
        auto failures = std::make_shared<wg::WorkerFailures>();
        wg::RingWorkerGroup group(r, members, std::move(listeners[static_cast<std::size_t>(r)]), std::move(ring),
                                      failures, nullptr);
        body(r, group, *failures);
      });
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) CHECK_MESSAGE(errors[static_cast<std::size_t>(r)] == "", "rank ", r);
}

}  // namespace

TEST_CASE("a one-process worker group hands back this worker's values") {
  wg::LocalWorkerGroup group;
  CHECK(group.size() == 1);
  CHECK(group.rank() == 0);
  const Tensor t = Tensor::from_vector<float>({1.5f, -2.0f, 3.25f}, {3});
  CHECK(group.sum(t).to_vector<float>() == std::vector<float>{1.5f, -2.0f, 3.25f});
  CHECK(group.broadcast_from_chief(t).to_vector<float>() == std::vector<float>{1.5f, -2.0f, 3.25f});
  CHECK(group.concat(t, 0).to_vector<float>() == std::vector<float>{1.5f, -2.0f, 3.25f});
  ReductionToOneDevice ops;
  const std::vector<Tensor> parts = {Tensor::from_vector<float>({1, 2}, {2}), Tensor::from_vector<float>({3, 6}, {2})};
  CHECK(group.reduce(ReduceOp::sum, parts, ops).to_vector<float>() == std::vector<float>{4, 8});
  CHECK(group.reduce(ReduceOp::mean, parts, ops).to_vector<float>() == std::vector<float>{2, 4});
}

TEST_CASE("a ring worker group sums, reduces, broadcasts from the chief and concatenates over 3 workers") {
  with_ring_groups(3, [](int r, wg::RingWorkerGroup& group, wg::WorkerFailures&) {
    REQUIRE(group.size() == 3);
    REQUIRE(group.rank() == r);
    // Element i of worker r: 10 r + i.
    std::vector<float> mine;
    for (int i = 0; i < 5; ++i) mine.push_back(10.0f * r + float(i));
    const std::vector<float> sum = group.sum(Tensor::from_vector(mine, {5})).to_vector<float>();
    for (int i = 0; i < 5; ++i) CHECK(sum[static_cast<std::size_t>(i)] == 30.0f + 3.0f * float(i));
    // Two local replicas per worker holding r and 2 r: the SUM over 6 replicas is 9, the MEAN 1.5.
    ReductionToOneDevice ops;
    const std::vector<Tensor> parts = {Tensor::scalar<double>(r), Tensor::scalar<double>(2.0 * r)};
    CHECK(group.reduce(ReduceOp::sum, parts, ops).item<double>() == 9.0);
    CHECK(group.reduce(ReduceOp::mean, parts, ops).item<double>() == 1.5);
    // The chief's value everywhere.
    CHECK(group.broadcast_from_chief(Tensor::full({4}, 7 + r, DType::i64)).to_vector<std::int64_t>() ==
          std::vector<std::int64_t>(4, 7));
    // Worker r holds r + 1 rows of [r, 100 + r]: joined in rank order along axis 0.
    std::vector<std::int32_t> rows;
    for (int k = 0; k <= r; ++k) {
      rows.push_back(r);
      rows.push_back(100 + r);
    }
    const Tensor joined = group.concat(Tensor::from_vector(rows, {r + 1, 2}), 0);
    CHECK(joined.shape() == Shape{6, 2});
    CHECK(joined.to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 100, 1, 101, 1, 101, 2, 102, 2, 102, 2, 102});
  });
}

TEST_CASE("a ring worker group names the worker whose gathered shape disagrees") {
  with_ring_groups(3, [](int r, wg::RingWorkerGroup& group, wg::WorkerFailures&) {
    const Tensor mine = Tensor::zeros({2, r == 2 ? 3 : 4});
    const std::string error = message_of([&] { group.concat(mine, 0); });
    if (r == 2) {  // its own shape against the first that differs: worker 0's
      CHECK(error == "gather across workers: " + task(2) + " sent float32 tensor of shape [2, 3], " + task(0) +
                         " sent float32 tensor of shape [2, 4]; only the size of axis 0 may differ");
    } else {
      CHECK(error == "gather across workers: " + task(r) + " sent float32 tensor of shape [2, 4], " + task(2) +
                         " sent float32 tensor of shape [2, 3]; only the size of axis 0 may differ");
    }
  });
}

TEST_CASE("a failure the watch reports breaks the ring, and the collective's error names the peer and the cause") {
  with_ring_groups(2, [](int r, wg::RingWorkerGroup& group, wg::WorkerFailures& failures) {
    CHECK(group.sum(Tensor::scalar<float>(1.0f)).item<float>() == 2.0f);
    if (r == 1) failures.report(task(0) + " sent no heartbeat");
    const std::string error = message_of([&] { group.sum(Tensor::scalar<float>(1.0f)); });
    CHECK(contains(error, "cross-worker collective failed: "));
    CHECK(contains(error, "[peer " + task(1 - r) + " (127.0.0.1:"));
    if (r == 1) {
      CHECK(failures.reason() == task(0) + " sent no heartbeat");
      CHECK(contains(error, "; cluster watch: " + task(0) + " sent no heartbeat"));
    }
  });
}

TEST_CASE("elastic membership: the survivors of a lost worker re-form the ring as a new generation and sum again") {
  const std::string incarnation = "0123456789abcdef0123456789abcdef";
  with_ring_groups(3, [&](int r, wg::RingWorkerGroup& group, wg::WorkerFailures& failures) {
    CHECK(group.sum(Tensor::scalar<float>(1.0f)).item<float>() == 3.0f);
    if (r == 2) return;  // worker 2 is lost: its group closes its sockets
    group.begin_step();
    CHECK(contains(message_of([&] { group.sum(Tensor::scalar<float>(1.0f)); }), "[peer " + task(2) + " (127.0.0.1:"));
    failures.report(task(2) + " sent no heartbeat");  // what the watch says on a real cluster
    const std::vector<actors::member> survivors{group.members()[0], group.members()[1]};
    CHECK(contains(message_of([&] { group.reform(r, survivors, 0, {}, std::chrono::milliseconds(5000)); }),
                   "generation 0 is not after the ring's 0"));
    group.reform(r, survivors, 1, {"", actors::generation_incarnation(incarnation, 1)},
                 std::chrono::milliseconds(5000));
    CHECK(group.size() == 2);
    CHECK(group.rank() == r);
    CHECK(group.generation() == 1);
    CHECK(failures.reason().empty());
    CHECK(group.sum(Tensor::scalar<float>(static_cast<float>(r + 1))).item<float>() == 3.0f);
    CHECK(group.broadcast_from_chief(Tensor::scalar<int>(r == 0 ? 42 : -1)).item<int>() == 42);
  });
}

TEST_CASE("elastic membership: a survivor proving another generation's incarnation is refused, named, within the bound") {
  const std::string incarnation = "0123456789abcdef0123456789abcdef";
  with_ring_groups(2, [&](int r, wg::RingWorkerGroup& group, wg::WorkerFailures&) {
    const std::vector<actors::member> members = group.members();
    // Worker 1 still proves generation 1's incarnation when the other re-forms generation 2.
    const std::string error = message_of([&] {
      group.reform(r, members, r == 0 ? 2 : 1, {"", actors::generation_incarnation(incarnation, r == 0 ? 2 : 1)},
                   std::chrono::milliseconds(1500));
    });
    CHECK(contains(error, "elastic membership: the ring of generation " + std::to_string(r == 0 ? 2 : 1) +
                              " did not form: cross-worker collective failed: "));
    CHECK(contains(error, "[peer " + task(1 - r)));
    // The group has no ring now: every collective says so instead of touching one.
    CHECK(message_of([&] { group.sum(Tensor::scalar<float>(1.0f)); }) ==
          "cross-worker collective: the ring of generation " + std::to_string(r == 0 ? 2 : 1) +
              " did not form, so this worker cannot go on (the restart path)");
  });
}

TEST_CASE("a fault report names the workers out of step, or the ring link tampered with from end to end") {
  std::vector<actors::member> members(3);
  for (int r = 0; r < 3; ++r) {
    members[static_cast<std::size_t>(r)].rank = r;
    members[static_cast<std::size_t>(r)].task = task(r);
  }
  const std::string step = "all_reduce: rank 0 (127.0.0.1:5000) is at step 3, collective 0";
  CHECK(wg::describe_fault_report(transport::peer_error(0, step + " (this worker)", step), members, 1) ==
        task(1) + " (rank 1) found the workers out of step: " + step);
  const std::string tag = "a frame from rank 2 (127.0.0.1:5002) failed its integrity check (its tag does not match)";
  const transport::peer_error altered(2, tag, tag, transport::peer_error::fault::altered);
  CHECK(altered.kind() == transport::peer_error::fault::altered);
  CHECK(wg::describe_fault_report(altered, members, 0) ==
        task(0) + " (rank 0) found the ring link from " + task(2) + " (rank 2) tampered with: " + tag);
  // A peer outside the table is still named by its rank.
  CHECK(wg::describe_fault_report(transport::peer_error(7, tag, tag, transport::peer_error::fault::altered), members,
                                  0) == task(0) + " (rank 0) found the ring link from rank 7 tampered with: " + tag);
  CHECK(transport::peer_error(0, "gone").kind() == transport::peer_error::fault::link);
}

TEST_CASE("a ring worker group carries float32 as fp16 or bf16: rounded sums, the same bits on every worker") {
  using troupe::distribute::Compression;
  for (const Compression c : {Compression::fp16, Compression::bf16}) {
    CAPTURE(troupe::distribute::compression_name(c));
    const auto narrow = c == Compression::fp16 ? troupe::kernels::float_to_f16 : troupe::kernels::float_to_bf16;
    const auto widen = c == Compression::fp16 ? troupe::kernels::f16_to_float : troupe::kernels::bf16_to_float;
    // 2 workers: each element is one addition, round(round(a) + round(b)), on either ring path
    // (small: 7 elements, a whole-buffer swap; large: 100000, reduce-scatter). 3 workers over the
    // large path: every worker ends with the same bits, close to the float32 sum.
    for (const int workers : {2, 3}) {
      for (const std::int64_t count : {std::int64_t{7}, std::int64_t{100000}}) {
        std::vector<std::vector<float>> results(static_cast<std::size_t>(workers));
        auto value = [](int r, std::int64_t i) { return 0.1f * float(i % 1000) + 1.37f * float(r) + 0.003f; };
        with_ring_groups(workers, [&](int r, wg::RingWorkerGroup& group, wg::WorkerFailures&) {
          std::vector<float> mine(static_cast<std::size_t>(count));
          for (std::int64_t i = 0; i < count; ++i) mine[static_cast<std::size_t>(i)] = value(r, i);
          Tensor t = Tensor::from_vector(mine, {count});
          group.all_reduce_in_place(t, c);
          results[static_cast<std::size_t>(r)] = t.to_vector<float>();
          // Other dtypes cross unchanged.
          Tensor ints = Tensor::full({3}, r + 1, DType::i32);
          group.all_reduce_in_place(ints, c);
          CHECK(ints.to_vector<std::int32_t>() == std::vector<std::int32_t>(3, workers * (workers + 1) / 2));
        });
        for (int r = 1; r < workers; ++r) REQUIRE(results[static_cast<std::size_t>(r)] == results[0]);
        for (std::int64_t i = 0; i < count; ++i) {
          const float got = results[0][static_cast<std::size_t>(i)];
          if (workers == 2) {
            REQUIRE(got == widen(narrow(widen(narrow(value(0, i))) + widen(narrow(value(1, i))))));
          } else {
            float exact = 0;
            for (int r = 0; r < workers; ++r) exact += value(r, i);
            REQUIRE(std::abs(got - exact) <= std::abs(exact) * (c == Compression::fp16 ? 0x1p-8f : 0x1p-5f));
          }
        }
      }
    }
  }
}

TEST_CASE("a ring worker group sums float16 and bfloat16 tensors in float32 and rounds once, over 3 workers") {
  for (const DType dtype : {DType::f16, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    // b + 1 + 1 where the format's spacing at b is 2 (float16: 2048, bfloat16: 256): 16-bit
    // partial sums would stay at b (b + 1 ties to even), the float32 sum b + 2 is exact.
    const float base = dtype == DType::f16 ? 2048.0f : 256.0f;
    for (const std::int64_t count : {std::int64_t{5}, std::int64_t{100000}}) {
      std::vector<Tensor> results(3);
      with_ring_groups(3, [&](int r, wg::RingWorkerGroup& group, wg::WorkerFailures&) {
        Tensor t = Tensor::full({count}, r == 0 ? base : 1.0f, DType::f32).cast(dtype);
        group.all_reduce_in_place(t);
        results[static_cast<std::size_t>(r)] = t;
      });
      const Tensor want = Tensor::full({count}, base + 2.0f, DType::f32).cast(dtype);
      for (const Tensor& got : results) {
        CHECK(got.dtype() == dtype);
        CHECK(got.equals(want));
      }
    }
  }
}

}  // namespace TROUPE_TEST_FILE
