// Sweeps of the replica-context collectives over what breaks them: 1, 2, 3, 4 and 8 replicas;
// 0, 1, non-divisible and large element counts (large ones take the fused reduce-scatter path);
// every dtype; SUM and MEAN; packed lists; uneven all_gather.
#include <doctest/doctest.h>

#include <cstring>
#include <random>

#include "test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::cpus;

namespace {

const int replica_counts[] = {1, 2, 3, 4, 8};
// 100003 elements are 400 KB of f32: past the whole-copy threshold, so the fused path runs.
const std::int64_t element_counts[] = {0, 1, 7, 1001, 100003};

// Replica r holds (r + 1) * (i % 7 + 1) at element i: sums stay exact in every dtype.
template <class T>
Tensor replica_value(int r, std::int64_t n) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<T>((r + 1) * (i % 7 + 1));
  return Tensor::from_vector<T>(v, {n});
}

template <class T>
void check_all_reduce(Strategy& s, std::int64_t n, ReduceOp op) {
  const int replicas = s.num_replicas_in_sync();
  auto out = s.run([&] {
    auto* ctx = get_replica_context();
    return ctx->all_reduce(op, replica_value<T>(ctx->replica_id_in_sync_group(), n));
  });
  const T ids_sum = static_cast<T>(replicas * (replicas + 1) / 2);
  for (int r = 0; r < replicas; ++r) {
    const Tensor& t = out[r];
    REQUIRE(t.shape() == Shape{n});
    REQUIRE(t.dtype() == dtype_v<T>);
    CHECK(t.device().to_string() == "CPU:" + std::to_string(r));
    const T* p = t.data<T>();
    bool ok = true;
    for (std::int64_t i = 0; i < n && ok; ++i) {
      T expected = static_cast<T>(ids_sum * static_cast<T>(i % 7 + 1));
      if (op == ReduceOp::mean) expected = expected / static_cast<T>(replicas);
      if (p[i] != expected) {
        ok = false;
        FAIL_CHECK("replica " << r << " element " << i << ": " << p[i] << " != " << expected);
      }
    }
    if (r > 0) CHECK(t.equals(out[0]));
  }
}

}  // namespace

TEST_CASE("all_reduce sums and averages every dtype over 1, 2, 3, 4, 8 replicas and awkward sizes") {
  Runtime rt;
  for (int replicas : replica_counts) {
    MirroredStrategy s(rt, cpus(replicas));
    for (std::int64_t n : element_counts) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean}) {
        CAPTURE(replicas);
        CAPTURE(n);
        CAPTURE(reduce_op_name(op));
        check_all_reduce<float>(s, n, op);
        check_all_reduce<double>(s, n, op);
        check_all_reduce<std::int32_t>(s, n, op);
        check_all_reduce<std::int64_t>(s, n, op);
      }
    }
  }
}

TEST_CASE("a packed all_reduce of mixed tensors is one collective with every result right") {
  Runtime rt;
  for (int replicas : replica_counts) {
    CAPTURE(replicas);
    MirroredStrategy s(rt, cpus(replicas));
    auto out = s.run([] {
      auto* ctx = get_replica_context();
      const int r = ctx->replica_id_in_sync_group();
      return ctx->all_reduce(ReduceOp::sum, std::vector<Tensor>{replica_value<float>(r, 3), replica_value<std::int64_t>(r, 50000),
                                                                 Tensor::zeros({0}), replica_value<double>(r, 9000),
                                                                 Tensor::scalar<int>(r)});
    });
    const int ids_sum = replicas * (replicas + 1) / 2;
    for (int r = 0; r < replicas; ++r) {
      const auto& v = out[r];
      REQUIRE(v.size() == 5);
      CHECK(v[0].to_vector<float>() == std::vector<float>{float(ids_sum), float(2 * ids_sum), float(3 * ids_sum)});
      const auto big = v[1].to_vector<std::int64_t>();
      bool ok = true;
      for (std::size_t i = 0; i < big.size(); ++i) ok = ok && big[i] == ids_sum * static_cast<std::int64_t>(i % 7 + 1);
      CHECK(ok);
      CHECK(v[2].num_elements() == 0);
      CHECK(v[3].data<double>()[8999] == double(ids_sum * (8999 % 7 + 1)));
      CHECK(v[4].item<int>() == replicas * (replicas - 1) / 2);
    }
  }
}

TEST_CASE("all_reduce is bit-identical on every replica and from run to run") {
  Runtime rt;
  for (int replicas : {2, 3, 4, 8}) {
    CAPTURE(replicas);
    MirroredStrategy s(rt, cpus(replicas));
    for (std::int64_t n : {5, 300001}) {
      CAPTURE(n);
      auto step = [&] {
        return s.run([n] {
          auto* ctx = get_replica_context();
          std::mt19937 gen(static_cast<unsigned>(1234 + ctx->replica_id_in_sync_group()));
          std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
          std::vector<float> v(static_cast<std::size_t>(n));
          for (auto& x : v) x = dist(gen) * 1e3f;
          return ctx->all_reduce(ReduceOp::mean, Tensor::from_vector<float>(v));
        });
      };
      auto first = step();
      auto second = step();
      for (int r = 0; r < replicas; ++r) {
        CHECK(first[r].equals(first[0]));
        CHECK(second[r].equals(first[0]));
      }
    }
  }
}

TEST_CASE("all_gather concatenates in replica order, with uneven sizes along the axis") {
  Runtime rt;
  for (int replicas : replica_counts) {
    CAPTURE(replicas);
    MirroredStrategy s(rt, cpus(replicas));
    auto out = s.run([] {
      auto* ctx = get_replica_context();
      const int r = ctx->replica_id_in_sync_group();
      // Replica r holds r rows of [r, r]: replica 0 contributes nothing.
      Tensor rows = Tensor::full({r, 2}, r, DType::i64);
      // Along the last axis: replica r holds [1, 2, r + 1] with element [0, j, k] = 100 r + 10 j + k.
      std::vector<float> block;
      for (int j = 0; j < 2; ++j) {
        for (int k = 0; k <= r; ++k) block.push_back(static_cast<float>(100 * r + 10 * j + k));
      }
      return std::make_pair(ctx->all_gather(rows, 0),
                            ctx->all_gather(Tensor::from_vector(block, {1, 2, r + 1}), 2));
    });
    std::vector<std::int64_t> expected;
    for (int r = 0; r < replicas; ++r) {
      for (int k = 0; k < 2 * r; ++k) expected.push_back(r);
    }
    // Row j of the gathered [1, 2, sum of (r + 1)] is replica 0's row j, then replica 1's, ...
    const int width = replicas * (replicas + 1) / 2;
    std::vector<float> expected_last;
    for (int j = 0; j < 2; ++j) {
      for (int q = 0; q < replicas; ++q) {
        for (int k = 0; k <= q; ++k) expected_last.push_back(static_cast<float>(100 * q + 10 * j + k));
      }
    }
    for (int r = 0; r < replicas; ++r) {
      CHECK(out[r].first.to_vector<std::int64_t>() == expected);
      CHECK(out[r].first.shape() == Shape{replicas * (replicas - 1) / 2, 2});
      CHECK(out[r].second.shape() == Shape{1, 2, width});
      CHECK(out[r].second.to_vector<float>() == expected_last);
    }
  }
}

TEST_CASE("strategy reduce matches the replicas' own all_reduce bit for bit") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(4));
  auto values = s.experimental_distribute_values_from_function([](const ValueContext& c) {
    std::mt19937 gen(static_cast<unsigned>(c.replica_id_in_sync_group));
    std::uniform_real_distribution<double> dist(-1.0, 1.0);
    std::vector<double> v(1000);
    for (auto& x : v) x = dist(gen);
    return Tensor::from_vector<double>(v);
  });
  auto reduced = s.run([](const Tensor& x) { return get_replica_context()->all_reduce(ReduceOp::sum, x); }, values);
  CHECK(s.reduce(ReduceOp::sum, values, std::nullopt).equals(reduced[0]));
}

TEST_CASE("a large all_reduce hands every replica one shared result - small ones and the next steps stay right") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(4));
  for (int step = 0; step < 3; ++step) {
    auto r = s.run([step] {
      auto* ctx = get_replica_context();
      const float id = static_cast<float>(ctx->replica_id_in_sync_group());
      Tensor big = ctx->all_reduce(ReduceOp::sum, Tensor::full({100000}, id + step, DType::f32));
      Tensor small = ctx->all_reduce(ReduceOp::sum, Tensor::full({3}, id, DType::f32));
      Tensor big2 = ctx->all_reduce(ReduceOp::mean, std::vector<Tensor>{big, big})[1];
      return std::vector<Tensor>{big, small, big2};
    });
    const auto& all = r.values();
    for (int k = 0; k < 4; ++k) {
      CHECK(all[static_cast<std::size_t>(k)][0].to_vector<float>()[99999] == 6.0f + 4.0f * step);
      CHECK(all[static_cast<std::size_t>(k)][1].to_vector<float>() == std::vector<float>(3, 6.0f));
      CHECK(all[static_cast<std::size_t>(k)][2].to_vector<float>()[0] == 6.0f + 4.0f * step);
      CHECK(all[static_cast<std::size_t>(k)][0].device().to_string() == "CPU:" + std::to_string(k));
      CHECK(all[static_cast<std::size_t>(k)][0].shares_storage_with(all[0][0]));
      CHECK_FALSE(all[static_cast<std::size_t>(k)][1].shares_storage_with(all[k == 0 ? 1 : 0][1]));
    }
  }
}

}  // namespace TROUPE_TEST_FILE
