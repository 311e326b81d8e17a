// Distributed input: how global batches split over replicas (the seed docs' rules), per-worker and
// per-replica input pipelines, the end of data, errors, and the input pipeline actor's bounded
// prefetch.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <numeric>
#include <thread>

#include "test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::data::Dataset;
using troupe::data::Element;
using troupe::testing::contains;
using troupe::testing::cpus;
using troupe::testing::message_of;

namespace {

// Each replica's first component as a vector of int64.
std::vector<std::vector<std::int64_t>> rows_of(const PerReplica<Element>& x) {
  std::vector<std::vector<std::int64_t>> out;
  for (const Element& e : x) out.push_back(e.at(0).to_vector<std::int64_t>());
  return out;
}

using Rows = std::vector<std::vector<std::int64_t>>;

}  // namespace

TEST_CASE("seed 9: range(4).batch(2) over two replicas, replica function x*2") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  auto dist = s.experimental_distribute_dataset(Dataset::range(4).batch(2));
  std::vector<Rows> steps;
  for (const auto& x : dist) {
    auto r = s.run([](const Element& e) { return e[0] * 2; }, x);
    Rows step;
    for (const Tensor& t : s.experimental_local_results(r)) step.push_back(t.to_vector<std::int64_t>());
    steps.push_back(step);
  }
  REQUIRE(steps.size() == 2);
  CHECK(steps[0] == Rows{{0}, {2}});
  CHECK(steps[1] == Rows{{4}, {6}});
}

TEST_CASE("split_rows gives the first B % N replicas one row more and fills a partial batch in order") {
  using troupe::distribute::detail::split_rows;
  using P = std::vector<std::pair<std::int64_t, std::int64_t>>;
  CHECK(split_rows(5, 5, 2) == P{{0, 3}, {3, 5}});
  CHECK(split_rows(7, 7, 3) == P{{0, 3}, {3, 5}, {5, 7}});
  CHECK(split_rows(6, 8, 2) == P{{0, 4}, {4, 6}});            // the seed docs' last partial batch
  CHECK(split_rows(1, 4, 4) == P{{0, 1}, {1, 1}, {1, 1}, {1, 1}});
  CHECK(split_rows(0, 4, 2) == P{{0, 0}, {0, 0}});
}

TEST_CASE("a last partial batch splits as the seed docs show, and a replica without data gets an empty batch") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  auto it = s.experimental_distribute_dataset(Dataset::range(14).batch(8)).make_iterator();
  CHECK(rows_of(it.get_next()) == Rows{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(rows_of(it.get_next()) == Rows{{8, 9, 10, 11}, {12, 13}});
  CHECK_FALSE(it.get_next_as_optional());

  MirroredStrategy four(rt, cpus(4));
  auto it4 = four.experimental_distribute_dataset(Dataset::range(9).batch(4)).make_iterator();
  CHECK(rows_of(it4.get_next()) == Rows{{0}, {1}, {2}, {3}});
  CHECK(rows_of(it4.get_next()) == Rows{{4}, {5}, {6}, {7}});
  auto last = it4.get_next();
  CHECK(rows_of(last) == Rows{{8}, {}, {}, {}});
  CHECK(last[3][0].shape() == Shape{0});
  CHECK_THROWS_AS(it4.get_next(), OutOfRange);
}

TEST_CASE("experimental_distribute_dataset's iterator knows each step's rows over every replica, a partial one too") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(4));
  auto it = s.experimental_distribute_dataset(Dataset::range(13).batch(6)).make_iterator();
  CHECK_FALSE(it.last_global_rows());
  CHECK(rows_of(it.get_next()) == Rows{{0, 1}, {2, 3}, {4}, {5}});
  CHECK(it.last_global_rows() == std::optional<std::int64_t>(6));
  it.get_next();
  CHECK(it.last_global_rows() == std::optional<std::int64_t>(6));
  CHECK(rows_of(it.get_next()) == Rows{{12}, {}, {}, {}});
  CHECK(it.last_global_rows() == std::optional<std::int64_t>(1));
  CHECK_FALSE(it.get_next_as_optional());
  CHECK_FALSE(it.last_global_rows());
}

TEST_CASE("a global batch not divisible by the replicas gives the first ones a row more") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(3));
  auto x = s.experimental_distribute_dataset(Dataset::range(7).batch(7)).make_iterator().get_next();
  CHECK(rows_of(x) == Rows{{0, 1, 2}, {3, 4}, {5, 6}});
  CHECK(x[2][0].device().to_string() == "CPU:2");
}

TEST_CASE("every component of an element is split the same way") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  Tensor features = Tensor::range(8, DType::f32).reshape({4, 2});
  Tensor labels = Tensor::from_vector<std::int64_t>({10, 11, 12, 13});
  auto x = s.experimental_distribute_dataset(Dataset::from_tensor_slices({features, labels}).batch(4))
               .make_iterator()
               .get_next();
  CHECK(x[1][0].to_vector<float>() == std::vector<float>{4, 5, 6, 7});
  CHECK(x[1][1].to_vector<std::int64_t>() == std::vector<std::int64_t>{12, 13});
  CHECK(contains(message_of([&] { s.experimental_distribute_dataset(Dataset::range(3)).make_iterator().get_next(); }),
                 "batch the dataset"));
}

TEST_CASE("distribute_datasets_from_function, per worker: consecutive elements go to the replicas in turn") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  std::vector<InputContext> seen;
  auto dist = s.distribute_datasets_from_function([&](const InputContext& ctx) {
    seen.push_back(ctx);
    return Dataset::range(10).batch(ctx.get_per_replica_batch_size(4));
  });
  auto it = dist.make_iterator();
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].num_input_pipelines == 1);
  CHECK(seen[0].input_pipeline_id == 0);
  CHECK(seen[0].num_replicas_in_sync == 2);
  CHECK(rows_of(it.get_next()) == Rows{{0, 1}, {2, 3}});
  CHECK(rows_of(it.get_next()) == Rows{{4, 5}, {6, 7}});
  CHECK(rows_of(it.get_next()) == Rows{{8, 9}, {}});
  CHECK_FALSE(it.get_next_as_optional());
}

TEST_CASE("distribute_datasets_from_function, per replica: a pipeline per replica and no element lost at the end") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(3));
  InputOptions options;
  options.experimental_replication_mode = InputReplicationMode::per_replica;
  auto dist = s.distribute_datasets_from_function(
      [](const InputContext& ctx) {
        CHECK(ctx.num_input_pipelines == 3);
        // Replica r gets r + 1 elements: 100r, 100r + 1, ...
        const std::int64_t id = ctx.input_pipeline_id;
        return Dataset::range(100 * id, 100 * id + id + 1).batch(1);
      },
      options);
  std::vector<Rows> steps;
  for (const auto& x : dist) steps.push_back(rows_of(x));
  REQUIRE(steps.size() == 3);
  CHECK(steps[0] == Rows{{0}, {100}, {200}});
  CHECK(steps[1] == Rows{{}, {101}, {201}});
  CHECK(steps[2] == Rows{{}, {}, {202}});
}

TEST_CASE("get_per_replica_batch_size rejects a global batch the replicas cannot share") {
  InputContext ctx{1, 0, 2};
  CHECK(ctx.get_per_replica_batch_size(8) == 4);
  std::string msg = message_of([&] { ctx.get_per_replica_batch_size(5); });
  CHECK(contains(msg, "global batch size (5)"));
  CHECK(contains(msg, "replicas in sync (2)"));
}

TEST_CASE("an error while reading reaches the caller after the good batches, with its cause") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  auto ds = Dataset::range(6)
                .map([](const Element& e) -> Element {
                  if (e[0].item<std::int64_t>() == 4) throw std::runtime_error("corrupt record 4");
                  return e;
                })
                .batch(2);
  auto it = s.experimental_distribute_dataset(ds).make_iterator();
  CHECK(rows_of(it.get_next()) == Rows{{0}, {1}});
  CHECK(rows_of(it.get_next()) == Rows{{2}, {3}});
  CHECK_THROWS_WITH_AS(it.get_next(), "corrupt record 4", std::runtime_error);
  CHECK_THROWS_WITH_AS(it.get_next(), "corrupt record 4", std::runtime_error);
}

TEST_CASE("the TF1 names map onto the distribution API") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  auto numpy = s.experimental_make_numpy_dataset({Tensor::from_vector<std::int64_t>({5, 6, 7, 8})});
  CHECK(numpy.cardinality() == 4);
  auto it = s.make_dataset_iterator(numpy.batch(2));
  auto r = s.experimental_run([](const Element& e) { return e[0] + std::int64_t{1}; }, it);
  CHECK(s.experimental_local_results(r)[1].to_vector<std::int64_t>() == std::vector<std::int64_t>{7});
  auto fn_it = s.make_input_fn_iterator([](const InputContext&) { return Dataset::range(2).batch(1); });
  CHECK(rows_of(fn_it.get_next()) == Rows{{0}, {1}});
}

TEST_CASE("the input pipeline stays a bounded number of batches ahead") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  std::atomic<int> produced{0};
  auto gen = Dataset::from_generator([&]() -> std::optional<Element> {
    ++produced;
    return Element{Tensor::from_vector<std::int64_t>({1, 2})};
  });
  InputOptions options;
  options.experimental_prefetch_to_device = 3;
  auto it = s.experimental_distribute_dataset(gen, options).make_iterator();
  for (int consumed = 1; consumed <= 20; ++consumed) {
    it.get_next();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // time to run ahead, if it would
    CHECK(produced.load() <= consumed + 3 + 1);                  // ready ones + one in production
  }
  CHECK(produced.load() >= 20);
}

TEST_CASE("an iterator over an endless dataset can be dropped early without a hang") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(4));
  {
    auto it = s.experimental_distribute_dataset(Dataset::range(8).repeat(-1).batch(4)).make_iterator();
    CHECK(rows_of(it.get_next()) == Rows{{0}, {1}, {2}, {3}});
  }
  int steps = 0;
  for (const auto& x : s.experimental_distribute_dataset(Dataset::range(8).repeat(-1).batch(8))) {
    CHECK(x.num_replicas() == 4);
    if (++steps == 5) break;
  }
  CHECK(steps == 5);
}

TEST_CASE("the default strategy distributes a dataset on the calling thread") {
  Strategy& d = get_strategy();
  auto it = d.experimental_distribute_dataset(Dataset::range(3).batch(2)).make_iterator();
  CHECK(rows_of(it.get_next()) == Rows{{0, 1}});
  CHECK(rows_of(it.get_next()) == Rows{{2}});
  CHECK_FALSE(it.get_next_as_optional());
}

TEST_CASE("the declared batch size decides the split even when the first batch is already partial") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  // 3 rows of a batch of 8: replica 0 can take 4, so it takes all three.
  auto it = s.experimental_distribute_dataset(Dataset::range(3).batch(8).prefetch(1)).make_iterator();
  CHECK(rows_of(it.get_next()) == Rows{{0, 1, 2}, {}});
  CHECK(Dataset::range(3).batch(8).repeat(2).take(1).impl()->batch_size() == 8);
  CHECK_FALSE(Dataset::range(3).impl()->batch_size());
}

TEST_CASE("distribute_datasets_from_function, per replica: replicas after the first one with data get empty batches") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(3));
  InputOptions options;
  options.experimental_replication_mode = InputReplicationMode::per_replica;
  auto dist = s.distribute_datasets_from_function(
      [](const InputContext& ctx) {
        // Replica r gets 3 - r elements: the first replica's data outlasts the others'.
        const std::int64_t id = ctx.input_pipeline_id;
        return Dataset::range(100 * id, 100 * id + 3 - id).batch(1);
      },
      options);
  std::vector<Rows> steps;
  for (const auto& x : dist) steps.push_back(rows_of(x));
  REQUIRE(steps.size() == 3);
  CHECK(steps[0] == Rows{{0}, {100}, {200}});
  CHECK(steps[1] == Rows{{1}, {101}, {}});
  CHECK(steps[2] == Rows{{2}, {}, {}});
}

TEST_CASE("rewind_passes sets a distributed dataset's shuffles back: the passes after it replay the same orders") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  // Each pass of a shuffle draws a new order (reshuffle_each_iteration), counted per dataset.
  auto dist = s.experimental_distribute_dataset(Dataset::range(16).shuffle(16, 5).batch(8));
  auto pass = [&] {
    std::vector<std::int64_t> order;
    for (const auto& x : dist) {
      for (const auto& rows : rows_of(x)) order.insert(order.end(), rows.begin(), rows.end());
    }
    return order;
  };
  std::vector<std::vector<std::int64_t>> first;
  for (int p = 0; p < 3; ++p) first.push_back(pass());
  CHECK(first[0] != first[1]);
  CHECK(first[1] != first[2]);
  for (const auto& order : first) {
    std::vector<std::int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::int64_t> all(16);
    std::iota(all.begin(), all.end(), 0);
    CHECK(sorted == all);
  }
  dist.rewind_passes();
  for (int p = 0; p < 3; ++p) CHECK(pass() == first[static_cast<std::size_t>(p)]);
  // Rewound in the middle of the sequence again, after one pass: the first pass's order again.
  dist.rewind_passes();
  CHECK(pass() == first[0]);
  // Through repeat and map too: the passes of the same graph.
  auto mapped = s.experimental_distribute_dataset(
      Dataset::range(8).shuffle(8, 9).map([](const Element& e) { return Element{e[0] * 3}; }).batch(4));
  std::vector<std::int64_t> a, b;
  for (int p = 0; p < 2; ++p) {
    for (const auto& x : mapped) a.push_back(rows_of(x)[0][0]);
  }
  mapped.rewind_passes();
  for (int p = 0; p < 2; ++p) {
    for (const auto& x : mapped) b.push_back(rows_of(x)[0][0]);
  }
  CHECK(a == b);
}

}  // namespace TROUPE_TEST_FILE
