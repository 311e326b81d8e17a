// Failures fail the step with an error that names the replica and keeps the cause; replicas
// waiting in a collective are released; the next step works. Each case is bounded by ctest's
// timeout: a hang is a failure.
#include <doctest/doctest.h>

#include "test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::cpus;
using troupe::testing::message_of;

namespace {

// A step that must work after a failed one: every replica's all_reduce gives the sum of ids.
void check_next_step_works(MirroredStrategy& s) {
  const int n = s.num_replicas_in_sync();
  auto r = s.run([] {
    auto* ctx = get_replica_context();
    return ctx->all_reduce(ReduceOp::sum, Tensor::scalar<int>(ctx->replica_id_in_sync_group())).item<int>();
  });
  CHECK(r.values() == std::vector<int>(static_cast<std::size_t>(n), n * (n - 1) / 2));
}

}  // namespace

TEST_CASE("an exception in one replica fails the step, names it, and releases the others") {
  Runtime rt;
  for (int replicas : {2, 4, 8}) {
    CAPTURE(replicas);
    MirroredStrategy s(rt, cpus(replicas));
    const int bad = replicas - 1;
    try {
      s.run([bad] {
        auto* ctx = get_replica_context();
        if (ctx->replica_id_in_sync_group() == bad) throw std::runtime_error("loss is NaN");
        // The others wait in a collective the failed replica never joins.
        return ctx->all_reduce(ReduceOp::sum, Tensor::zeros({1000}));
      });
      FAIL("the step should have failed");
    } catch (const ReplicaError& e) {
      CHECK(e.replica() == bad);
      CHECK(contains(e.what(), "replica " + std::to_string(bad) + " (CPU:" + std::to_string(bad) + ") failed"));
      CHECK(contains(e.what(), "loss is NaN"));
      CHECK_THROWS_WITH_AS(std::rethrow_exception(e.cause()), "loss is NaN", std::runtime_error);
    }
    check_next_step_works(s);
  }
}

TEST_CASE("an exception after a collective, while others wait in the next one, releases them") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(3));
  std::string msg = message_of([&] {
    s.run([] {
      auto* ctx = get_replica_context();
      ctx->all_reduce(ReduceOp::sum, Tensor::scalar<float>(1.0f));
      if (ctx->replica_id_in_sync_group() == 0) throw std::out_of_range("bad index 17");
      ctx->all_reduce(ReduceOp::sum, Tensor::zeros({100000}));
    });
  });
  CHECK(contains(msg, "replica 0 (CPU:0) failed: bad index 17"));
  check_next_step_works(s);
}

TEST_CASE("replicas that disagree on shape fail the step with both shapes") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(4));
  try {
    s.run([] {
      auto* ctx = get_replica_context();
      Tensor t = ctx->replica_id_in_sync_group() == 3 ? Tensor::zeros({4}) : Tensor::zeros({4, 2});
      ctx->all_reduce(ReduceOp::sum, t);
    });
    FAIL("the step should have failed");
  } catch (const ReplicaError& e) {
    CHECK(contains(e.what(), "all_reduce: replica 0 sent float32 tensor of shape [4, 2], replica 3 sent float32 "
                             "tensor of shape [4]"));
    CHECK_THROWS_AS(std::rethrow_exception(e.cause()), std::invalid_argument);
  }
  check_next_step_works(s);
}

TEST_CASE("replicas that disagree on dtype, op, count or collective fail the step") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto fails_with = [&](const std::function<void(ReplicaContext&)>& body, const std::string& needle) {
    std::string msg = message_of([&] { s.run([&] { body(*get_replica_context()); }); });
    CAPTURE(msg);
    CHECK(contains(msg, needle));
    check_next_step_works(s);
  };
  fails_with([](ReplicaContext& c) {
    c.all_reduce(ReduceOp::sum, c.replica_id_in_sync_group() ? Tensor::zeros({2}, DType::i32) : Tensor::zeros({2}));
  }, "replica 1 sent int32 tensor of shape [2]");
  fails_with([](ReplicaContext& c) {
    c.all_reduce(c.replica_id_in_sync_group() ? ReduceOp::mean : ReduceOp::sum, Tensor::zeros({2}));
  }, "replica 0 asked for SUM, replica 1 for MEAN");
  fails_with([](ReplicaContext& c) {
    std::vector<Tensor> v(static_cast<std::size_t>(c.replica_id_in_sync_group() + 1), Tensor::zeros({1}));
    c.all_reduce(ReduceOp::sum, v);
  }, "replica 0 sent 1 tensors, replica 1 sent 2");
  fails_with([](ReplicaContext& c) {
    if (c.replica_id_in_sync_group()) {
      c.all_gather(Tensor::zeros({2}), 0);
    } else {
      c.all_reduce(ReduceOp::sum, Tensor::zeros({2}));
    }
  }, "replica 0 called all_reduce, replica 1 called all_gather");
  fails_with([](ReplicaContext& c) {
    c.all_gather(c.replica_id_in_sync_group() ? Tensor::zeros({2, 3}) : Tensor::zeros({2, 4}), 0);
  }, "only the size along the gather axis may differ");
  fails_with([](ReplicaContext& c) { c.all_gather(Tensor::scalar<float>(1.0f), 0); },
             "all_gather: axis 0 out of range for rank-0 tensor");
}

TEST_CASE("a replica that returns while the others wait in a collective fails the step, no hang") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(4));
  std::string msg = message_of([&] {
    s.run([] {
      auto* ctx = get_replica_context();
      if (ctx->replica_id_in_sync_group() != 2) ctx->all_reduce(ReduceOp::sum, Tensor::zeros({8}));
    });
  });
  CAPTURE(msg);
  CHECK(contains(msg, "all_reduce abandoned: replica 2 returned from its function without joining it"));
  check_next_step_works(s);
}

TEST_CASE("a non-standard exception still fails the step with a message") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  try {
    s.run([] {
      if (get_replica_context()->replica_id_in_sync_group() == 1) throw 42;
    });
    FAIL("the step should have failed");
  } catch (const ReplicaError& e) {
    CHECK(e.replica() == 1);
    CHECK(contains(e.what(), "non-standard exception"));
    CHECK_THROWS_AS(std::rethrow_exception(e.cause()), int);
  }
  check_next_step_works(s);
}

TEST_CASE("every replica failing reports the lowest one") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(3));
  try {
    s.run([] {
      throw std::runtime_error("replica says " + std::to_string(get_replica_context()->replica_id_in_sync_group()));
    });
    FAIL("the step should have failed");
  } catch (const ReplicaError& e) {
    CHECK(e.replica() == 0);
    CHECK(contains(e.what(), "replica says 0"));
  }
  check_next_step_works(s);
}

}  // namespace TROUPE_TEST_FILE
