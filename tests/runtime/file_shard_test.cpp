#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "../common/temp_dir.hpp"
#include "test_util.hpp"
#include "troupe/data/readers.hpp"

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
