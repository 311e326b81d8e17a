// The examples of API.md's core and strategy sections (seed examples 1-8), with the values the
// seed documentation prints.
#include <doctest/doctest.h>

#include "test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::cpus;
using troupe::testing::message_of;

TEST_CASE("seed 1: gather of [[1], [2]] over two replicas") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  auto v = s.experimental_distribute_values_from_function(
      [](const ValueContext&) { return Tensor::from_vector<int>({1, 2}, {2, 1}); });
  Tensor g = s.gather(v, 0);
  CHECK(g.to_string() == "[[1], [2], [1], [2]]");
  CHECK(g.shape() == Shape{4, 1});
}

TEST_CASE("seed 2: gather of reshape(range(6), [1, 2, 3]) over four replicas on each axis") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(4));
  auto v = s.experimental_distribute_values_from_function(
      [](const ValueContext&) { return Tensor::range(6, DType::i32).reshape({1, 2, 3}); });
  CHECK(s.gather(v, 0).shape() == Shape{4, 2, 3});
  CHECK(s.gather(v, 1).shape() == Shape{1, 8, 3});
  Tensor g2 = s.gather(v, 2);
  CHECK(g2.shape() == Shape{1, 2, 12});
  CHECK(g2.to_string() == "[[[0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2], [3, 4, 5, 3, 4, 5, 3, 4, 5, 3, 4, 5]]]");
  CHECK(s.gather(v, 1).to_string() == "[[[0, 1, 2], [3, 4, 5], [0, 1, 2], [3, 4, 5], [0, 1, 2], [3, 4, 5], [0, 1, 2], "
                                      "[3, 4, 5]]]");
}

TEST_CASE("seed 3: reduce(SUM) of replica ids over two replicas is 1") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  auto ids = s.run([] { return Tensor::scalar<int>(get_replica_context()->replica_id_in_sync_group()); });
  Tensor total = s.reduce(ReduceOp::sum, ids, std::nullopt);
  CHECK(total.item<int>() == 1);
  CHECK(total.device().to_string() == "CPU:0");
  CHECK(s.reduce("SUM", ids, std::nullopt).item<int>() == 1);
  auto local = s.experimental_local_results(ids);
  REQUIRE(local.size() == 2);
  CHECK(local[0].item<int>() == 0);
  CHECK(local[1].item<int>() == 1);
}

TEST_CASE("seed 4: reduce's axis semantics and the partial batch denominator") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  auto v = s.experimental_distribute_values_from_function([](const ValueContext& c) {
    return c.replica_id_in_sync_group == 0 ? Tensor::from_vector<int>({0, 1, 2, 3})
                                           : Tensor::from_vector<int>({4, 5, 6, 7});
  });
  CHECK(s.reduce("SUM", v, std::nullopt).to_vector<int>() == std::vector<int>{4, 6, 8, 10});
  CHECK(s.reduce("sum", v, 0).item<int>() == 28);
  CHECK(s.reduce(ReduceOp::sum, v, 0).shape() == Shape{});

  auto partial = s.experimental_distribute_values_from_function([](const ValueContext& c) {
    return c.replica_id_in_sync_group == 0 ? Tensor::from_vector<float>({0, 1, 2, 3})
                                           : Tensor::from_vector<float>({4, 5});
  });
  CHECK(s.reduce(ReduceOp::mean, partial, 0).item<float>() == 2.5f);  // 15 / 6, not the mean of means
  std::string msg = message_of([&] { s.reduce(ReduceOp::sum, partial, std::nullopt); });
  CHECK(contains(msg, "replica 0 sent float32 tensor of shape [4]"));
  CHECK(contains(msg, "replica 1 sent float32 tensor of shape [2]"));
  CHECK_THROWS_AS(s.reduce(ReduceOp::sum, partial, std::nullopt), std::invalid_argument);
}

TEST_CASE("seed 5: run with a plain argument gives every replica the same value") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  auto r = s.run([](const Tensor& x) { return x * 2.0f; }, Tensor::scalar<float>(3.0f));
  auto local = s.experimental_local_results(r);
  REQUIRE(local.size() == 2);
  CHECK(local[0].item<float>() == 6.0f);
  CHECK(local[1].item<float>() == 6.0f);
  CHECK(local[0].to_string() == "6.0");
}

TEST_CASE("seed 6: distributed values as arguments") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  auto n = s.experimental_distribute_values_from_function(
      [](const ValueContext& c) { return Tensor::scalar<int>(c.num_replicas_in_sync); });
  auto r = s.run([](const Tensor& x) { return x * 2; }, n);
  for (const Tensor& t : s.experimental_local_results(r)) CHECK(t.item<int>() == 4);
}

TEST_CASE("seed 7: all_reduce inside the replica function") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  auto r = s.run([](const Tensor& x) { return get_replica_context()->all_reduce(ReduceOp::sum, x); },
                 s.experimental_distribute_values_from_function(
                     [](const ValueContext& c) { return Tensor::scalar<int>(c.replica_id_in_sync_group); }));
  auto local = s.experimental_local_results(r);
  REQUIRE(local.size() == 2);
  CHECK(local[0].item<int>() == 1);
  CHECK(local[1].item<int>() == 1);
  CHECK(local[1].device().to_string() == "CPU:1");
}

TEST_CASE("seed 8: values from a host array indexed by replica id") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  const std::vector<double> array_value{3.0, 2.0, 1.0};
  auto v = s.experimental_distribute_values_from_function([&](const ValueContext& c) {
    return Tensor::scalar<double>(array_value[static_cast<std::size_t>(c.replica_id_in_sync_group)]);
  });
  auto local = s.experimental_local_results(v);
  REQUIRE(local.size() == 2);
  CHECK(local[0].item<double>() == 3.0);
  CHECK(local[1].item<double>() == 2.0);
  CHECK(v.to_string() == "PerReplica{0: 3.0, 1: 2.0}");
}

}  // namespace TROUPE_TEST_FILE
