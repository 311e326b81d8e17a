#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "../common/temp_dir.hpp"
#include "distribute/input/file_split.hpp"
#include "test_util.hpp"
#include "troupe/data/readers.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::cpus;
using troupe::testing::message_of;
using troupe::testing::temp_dir;

namespace {

// Files part-0.csv .. part-<n-1>.csv; file f holds the ids 10*f .. 10*f + f (f + 1 rows).
std::vector<std::string> write_parts(const temp_dir& dir, int n) {
  std::vector<std::string> paths;
  for (int f = 0; f < n; ++f) {
    paths.push_back((dir.path / ("part-" + std::to_string(f) + ".csv")).string());
    std::ofstream out(paths.back());
    out << "id\n";
    for (int k = 0; k <= f; ++k) out << 10 * f + k << "\n";
  }
  return paths;
}

std::vector<float> ids(const data::Dataset& d) {
  std::vector<float> out;
  for (const data::Element& e : d) {
    for (float v : e[0].to_vector<float>()) out.push_back(v);
  }
  return out;
}

data::Dataset sharded(const data::Dataset& d, std::int64_t shards, std::int64_t index) {
  auto impl = d.impl()->shard_files(shards, index);
  REQUIRE(impl != nullptr);
  return data::Dataset(impl);
}

}  // namespace

TEST_CASE("files_dataset reads its files in order, and shard_files keeps every operator above them") {
  temp_dir dir("files");
  const auto paths = write_parts(dir, 4);
  const data::Dataset all = data::csv_files_dataset(paths);
  CHECK(all.impl()->num_files() == 4);
  CHECK(ids(all) == std::vector<float>{0, 10, 11, 20, 21, 22, 30, 31, 32, 33});
  // Worker 1 of 2 reads files 1 and 3 only.
  CHECK(ids(sharded(all, 2, 1)) == std::vector<float>{10, 11, 30, 31, 32, 33});
  // Through map, filter, shuffle, repeat, take, skip, shard, prefetch and batch.
  const data::Dataset pipeline = all.map([](const data::Element& e) { return data::Element{e[0] * 2.0f}; })
                                     .filter([](const data::Element& e) { return e[0].item<float>() != 60.0f; })
                                     .shuffle(3, 7)
                                     .repeat(2)
                                     .skip(1)
                                     .take(100)
                                     .shard(1, 0)
                                     .prefetch(2)
                                     .batch(3);
  CHECK(pipeline.impl()->num_files() == 4);
  const data::Dataset mine = sharded(pipeline, 2, 0);  // files 0 and 2: ids 0, 20, 21, 22
  CHECK(mine.impl()->batch_size() == std::optional<std::int64_t>(3));
  std::vector<float> got = ids(mine);
  std::sort(got.begin(), got.end());
  // Doubled (the filter drops 60, from file 3, not read here), twice over, less the first skipped.
  CHECK(got.size() == 7);
  for (float v : got) CHECK((v == 0.0f || v == 40.0f || v == 42.0f || v == 44.0f));
  // A dataset that reads no files has none to shard.
  CHECK(data::Dataset::range(5).batch(2).impl()->num_files() == 0);
  CHECK(data::Dataset::range(5).batch(2).impl()->shard_files(2, 0) == nullptr);
}

TEST_CASE("files_dataset refuses bad arguments and names a bad file when the pass reaches it") {
  CHECK(contains(message_of([] { data::files_dataset({}, [](const std::string& p) { return data::csv_dataset(p); }); }),
                 "files_dataset: no files"));
  CHECK(contains(message_of([] { data::files_dataset({"a.csv", ""}, [](const std::string& p) { return data::csv_dataset(p); }); }),
                 "path 1 is empty"));
  CHECK(contains(message_of([] { data::files_dataset({"a.csv"}, nullptr); }), "read function is empty"));
  temp_dir dir("files-missing");
  auto paths = write_parts(dir, 1);
  paths.push_back((dir.path / "missing.csv").string());
  const data::Dataset d = data::csv_files_dataset(paths);  // made without reading
  auto it = d.make_iterator();
  CHECK(it.get_next()[0].item<float>() == 0.0f);
  CHECK(contains(message_of([&] { it.get_next(); }), "missing.csv"));
}

TEST_CASE("AutoShardPolicy::file needs a dataset that reads files - on one worker it reads them all") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  InputOptions file;
  file.auto_shard_policy = AutoShardPolicy::file;
  CHECK(contains(message_of([&] { s.experimental_distribute_dataset(data::Dataset::range(8).batch(4), file); }),
                 "AutoShardPolicy::file needs a dataset that reads files"));
  temp_dir dir("files-one-worker");
  const auto paths = write_parts(dir, 3);
  std::vector<float> seen;
  for (const auto& x : s.experimental_distribute_dataset(data::csv_files_dataset(paths).batch(2), file)) {
    for (const data::Element& e : x.values()) {
      for (float v : e[0].to_vector<float>()) seen.push_back(v);
    }
  }
  CHECK(seen == std::vector<float>{0, 10, 11, 20, 21, 22});
}

namespace {

// Every row's first component of a per-replica step, replica by replica.
void collect(const PerReplica<data::Element>& step, std::vector<float>& out) {
  for (const data::Element& e : step.values()) {
    for (float v : e[0].to_vector<float>()) out.push_back(v);
  }
}

std::vector<float> sorted(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

TEST_CASE("a FILE pass begun over 2 workers and taken up by any number: every row of the pass once") {
  temp_dir dir("files-split");
  const auto paths = write_parts(dir, 5);  // 15 rows, 1 to 5 a file
  const data::Dataset ds = data::csv_files_dataset(paths).shuffle(4, 3).batch(4);
  const std::vector<float> all = sorted(ids(data::csv_files_dataset(paths)));
  for (int local : {1, 2}) {
    for (std::int64_t k : {0, 1, 2, 3, 6}) {
      CAPTURE(local);
      CAPTURE(k);
      distribute::detail::FileSplit split(ds, local);
      const std::int64_t pass = split.next_pass();
      // The first membership: 2 workers, each reading its own files, k steps each.
      std::vector<float> seen;
      std::vector<std::function<std::optional<PerReplica<data::Element>>()>> workers;
      for (int w = 0; w < 2; ++w) workers.push_back(split.own_steps(2, w, pass));
      for (std::int64_t s = 0; s < k; ++s) {
        for (auto& steps : workers) {
          if (auto step = steps()) collect(*step, seen);
        }
      }
      // The rest of the pass, as every worker of the next membership reads it: the 2 workers'
      // steps joined, the first k skipped.
      distribute::detail::FileSplit again(ds, local);
      auto rest = again.global_steps(2, again.next_pass());
      for (std::int64_t s = 0; s < k; ++s) rest();
      while (auto step = rest()) {
        CHECK(step->at(0).shape()[0] <= 4);  // at most a global batch a step
        for (float v : step->at(0).template to_vector<float>()) seen.push_back(v);
      }
      CHECK(sorted(seen) == all);
    }
  }
}

TEST_CASE("AUTO over files: a pass taken up is read by the policy it began with, chosen over the workers of then") {
  // An elastic worker that joins distributes its dataset over the workers there are then: with
  // more workers than files its own choice would be DATA where the members' pass is FILE, and the
  // other way round. The pass's split_workers carries the choice: here one worker (whose own
  // choice is DATA) takes up a FILE pass begun over 2 workers and a DATA pass begun over 4.
  temp_dir dir("files-auto");
  const auto paths = write_parts(dir, 3);  // 6 rows, 1 to 3 a file
  const auto make = [&] { return data::csv_files_dataset(paths).shuffle(4, 5).batch(2); };
  const std::vector<float> all = sorted(ids(data::csv_files_dataset(paths)));
  const std::vector<float> data_order = ids(make());  // pass 0 of the whole dataset, in order
  Runtime rt;
  for (int local : {1, 2}) {
    MirroredStrategy s(rt, cpus(local));
    for (std::int64_t k : {0, 1, 2, 3}) {
      CAPTURE(local);
      CAPTURE(k);
      // FILE, begun over 2 workers (3 files: one each at least): k steps of each worker's own
      // files, then the rest as this worker reads it.
      std::vector<float> seen;
      {
        distribute::detail::FileSplit split(make(), local);
        std::vector<std::function<std::optional<PerReplica<data::Element>>()>> workers;
        for (int w = 0; w < 2; ++w) workers.push_back(split.own_steps(2, w, 0));
        for (std::int64_t step = 0; step < k; ++step) {
          for (auto& steps : workers) {
            if (auto x = steps()) collect(*x, seen);
          }
        }
      }
      auto it = s.experimental_distribute_dataset(make()).make_iterator(2);
      CHECK(it.split_workers() == 2);
      for (std::int64_t step = 0; step < k; ++step) it.get_next_as_optional();
      while (auto x = it.get_next_as_optional()) collect(*x, seen);
      CHECK(sorted(seen) == all);
      // DATA, begun over 4 workers (fewer files than workers): k global batches, then the rest,
      // in the order of the whole dataset's pass.
      seen.assign(data_order.begin(), data_order.begin() + std::min<std::int64_t>(2 * k, 6));
      auto rest = s.experimental_distribute_dataset(make()).make_iterator(4);
      CHECK(rest.split_workers() == 4);
      for (std::int64_t step = 0; step < k; ++step) rest.get_next_as_optional();
      while (auto x = rest.get_next_as_optional()) collect(*x, seen);
      CHECK(seen == data_order);
    }
    // The passes count together whichever policy each chose: pass 1 taken up as FILE reads FILE's
    // orders of pass 1, after a DATA pass 0 (this worker's own choice), and after a rewind again.
    auto dist = s.experimental_distribute_dataset(make());
    CHECK(dist.make_iterator().split_workers() == 1);
    std::vector<float> second;
    {
      auto it = dist.make_iterator(2);
      while (auto x = it.get_next_as_optional()) collect(*x, second);
    }
    distribute::detail::FileSplit split(make(), local);
    std::vector<float> expected;
    auto joined = split.global_steps(2, 1);
    while (auto x = joined()) {
      for (float v : x->at(0).template to_vector<float>()) expected.push_back(v);
    }
    CHECK(sorted(second) == all);
    CHECK(second == expected);
    dist.rewind_passes();
    dist.make_iterator().get_next_as_optional();
    std::vector<float> again;
    auto it = dist.make_iterator(2);
    while (auto x = it.get_next_as_optional()) collect(*x, again);
    CHECK(again == second);
  }
}

TEST_CASE("a FILE split's joined steps are its workers' steps, and pass p reads the orders of pass p") {
  temp_dir dir("files-passes");
  const auto paths = write_parts(dir, 4);
  const data::Dataset ds = data::csv_files_dataset(paths).shuffle(10, 11).batch(2);
  distribute::detail::FileSplit split(ds, 1);
  // Pass 0 over 3 workers, step by step: the joined step holds worker 0's rows, then 1's, then 2's.
  std::vector<std::vector<float>> joined;
  {
    auto rest = split.global_steps(3, 0);
    while (auto step = rest()) joined.push_back(step->at(0).template to_vector<float>());
  }
  std::vector<std::vector<float>> by_worker;
  {
    std::vector<std::function<std::optional<PerReplica<data::Element>>()>> workers;
    for (int w = 0; w < 3; ++w) workers.push_back(split.own_steps(3, w, 0));
    for (;;) {
      std::vector<float> step;
      bool any = false;
      for (auto& steps : workers) {
        if (auto s = steps()) {
          any = true;
          collect(*s, step);
        }
      }
      if (!any) break;
      by_worker.push_back(step);
    }
  }
  CHECK(joined == by_worker);
  // Pass 1 differs from pass 0 (a new order per pass) and is the same on a split that read no
  // pass before it, and after rewind() and the passes before it read again.
  auto read = [](std::function<std::optional<PerReplica<data::Element>>()> steps) {
    std::vector<float> out;
    while (auto s = steps()) collect(*s, out);
    return out;
  };
  const std::vector<float> first = read(split.own_steps(2, 1, 0));
  const std::vector<float> second = read(split.own_steps(2, 1, 1));
  CHECK(sorted(first) == sorted(second));
  CHECK(first != second);
  distribute::detail::FileSplit fresh(ds, 1);
  CHECK(read(fresh.own_steps(2, 1, 1)) == second);
  CHECK(read(fresh.own_steps(2, 1, 0)) == first);  // a graph past the pass asked for is rewound
  CHECK(split.next_pass() == 0);
  CHECK(split.next_pass() == 1);
  split.rewind();
  CHECK(split.next_pass() == 0);
}

TEST_CASE("distribute_datasets_from_function takes up a pass begun over 2 workers: the rest of every pipeline once") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  // Input pipeline p gives the ids 100p .. 100p + 8 + p, per-replica batches of 2.
  auto fn = [](const InputContext& ctx) {
    const std::int64_t p = ctx.input_pipeline_id;
    return data::Dataset::range(100 * p, 100 * p + 9 + p)
        .map([](const data::Element& e) { return data::Element{e[0].cast(DType::f32)}; })
        .batch(2);
  };
  for (auto mode : {InputReplicationMode::per_worker, InputReplicationMode::per_replica}) {
    for (std::int64_t k : {0, 1, 2, 5}) {
      CAPTURE(k);
      InputOptions options;
      options.experimental_replication_mode = mode;
      const bool per_replica = mode == InputReplicationMode::per_replica;
      // The first membership: 2 workers of 2 replicas, k steps each.
      std::vector<float> seen, all;
      const int pipelines = per_replica ? 4 : 2;
      for (int p = 0; p < pipelines; ++p) {
        const InputContext ctx{pipelines, p, 4};
        for (const data::Element& e : fn(ctx)) {
          for (float v : e[0].to_vector<float>()) all.push_back(v);
        }
        auto it = fn(ctx).make_iterator();
        for (std::int64_t step = 0; step < k * (per_replica ? 1 : 2); ++step) {
          if (auto e = it.get_next_as_optional()) {
            for (float v : e->at(0).template to_vector<float>()) seen.push_back(v);
          }
        }
      }
      // Taken up by this one worker: every pipeline of then, joined, the first k steps skipped.
      auto dist = s.distribute_datasets_from_function(fn, options);
      CHECK(dist.make_iterator().split_workers() == 1);
      auto it = dist.make_iterator(2);
      CHECK(it.split_workers() == 2);
      for (std::int64_t step = 0; step < k; ++step) it.get_next_as_optional();
      while (auto step = it.get_next_as_optional()) {
        CHECK(it.last_global_rows() <= std::optional<std::int64_t>(8));
        collect(*step, seen);
      }
      CHECK(sorted(seen) == sorted(all));
    }
  }
  CHECK(contains(message_of([&] { s.distribute_datasets_from_function(fn).make_iterator(-1); }),
                 "split_workers -1"));
}

}  // namespace TROUPE_TEST_FILE
