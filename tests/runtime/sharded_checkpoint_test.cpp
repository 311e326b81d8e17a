#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "../common/free_port.hpp"
#include "../common/temp_dir.hpp"
#include "test_util.hpp"
#include "troupe/troupe.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::message_of;
namespace fs = std::filesystem;

namespace {

// One step of training on the ps tasks: "w" by Adam with a gradient that depends on its value
// (so that a step after restore reads what was restored), "emb" by Adam on some rows (so that its
// shards have had different numbers of updates).
FunctionRegistry training_functions() {
  FunctionRegistry f;
  f.add("step", [](FunctionContext& ctx) {
    const Tensor w = ctx.read_variable("w");
    ctx.apply_gradients(ShardOptimizer::adam(0.05f), {"w"}, {w * 0.5f + ctx.arg(0)});
    const auto row = ctx.arg(1).item<std::int64_t>();
    ctx.apply_gradients(ShardOptimizer::adam(0.05f), "emb", {row, 0},
                        Tensor::from_vector<float>({0.5f, -1.0f, 0.25f, 2.0f}, {2, 2}));
    return std::vector<Tensor>{};
  });
  return f;
}

Tensor gradient_of(int step) {
  std::vector<float> g(12);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = 0.1f * static_cast<float>((i * 5 + static_cast<std::size_t>(step) * 3) % 7) - 0.3f;
  return Tensor::from_vector<float>(g, {6, 2});
}

void train(ClusterCoordinator& c, int from, int steps) {
  for (int s = from; s < from + steps; ++s) {
    // One at a time, so that the order of updates (and so the bits) is the same in every run.
    c.fetch(c.schedule("step", gradient_of(s), std::int64_t{(s * 3) % 7}));
  }
}

void make_variables(ParameterServerStrategy& strategy, bool zeros) {
  std::vector<float> w(12), emb(14);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = zeros ? 0.0f : 0.25f * static_cast<float>(i) - 1.0f;
  for (std::size_t i = 0; i < emb.size(); ++i) emb[i] = zeros ? 0.0f : 0.125f * static_cast<float>(i);
  strategy.create_variable("w", Tensor::from_vector<float>(w, {6, 2}));
  strategy.create_variable("emb", Tensor::from_vector<float>(emb, {7, 2}));
}

// A cluster on loopback in this process: 1 worker, `ps` ps tasks, the chief's strategy with
// `shards` shards per variable.
struct Cluster {
  ClusterSpec spec;
  ServerOptions o;
  std::vector<std::unique_ptr<Runtime>> runtimes;
  std::vector<std::unique_ptr<Server>> servers;
  Runtime chief_rt;
  std::unique_ptr<ParameterServerStrategy> strategy;
  std::unique_ptr<ClusterCoordinator> coordinator;

  Cluster(int ps, int shards) {
    const auto a = troupe::testing::loopback_addresses(2 + ps);
    spec = ClusterSpec(ClusterSpec::JobMap{
        {"chief", {a[0]}}, {"worker", {a[1]}}, {"ps", std::vector<std::string>(a.begin() + 2, a.end())}});
    runtimes.push_back(std::make_unique<Runtime>());
    servers.push_back(std::make_unique<Server>(*runtimes.back(), spec, "worker", 0, training_functions(), o));
    for (int i = 0; i < ps; ++i) {
      runtimes.push_back(std::make_unique<Runtime>());
      servers.push_back(std::make_unique<Server>(*runtimes.back(), spec, "ps", i, FunctionRegistry{}, o));
    }
    strategy = std::make_unique<ParameterServerStrategy>(chief_rt, std::make_shared<SimpleClusterResolver>(spec, "chief", 0),
                                                         std::make_shared<FixedShardsPartitioner>(shards), o);
    coordinator = std::make_unique<ClusterCoordinator>(*strategy);
  }
  ~Cluster() {
    coordinator.reset();
    strategy.reset();
  }
};

void flip_byte(const fs::path& file, std::uintmax_t at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 0x5a));
}

}  // namespace

TEST_CASE("a sharded checkpoint keeps Adam's slots and steps: training resumed from it has the bits of uninterrupted training") {
  troupe::testing::temp_dir dir("sharded-ckpt");
  Cluster c(2, 2);
  make_variables(*c.strategy, false);
  ShardedCheckpointManager manager(*c.strategy, dir.path.string(), 2);
  CHECK_FALSE(manager.restore_or_initialize().has_value());  // nothing saved yet
  train(*c.coordinator, 0, 3);
  const std::string saved = manager.save(3);
  CHECK(saved == (fs::weakly_canonical(dir.path) / "ckpt-3").string());
  CHECK(fs::exists(fs::path(saved) / "manifest.json"));
  CHECK(fs::exists(fs::path(saved) / "shard-0-of-2.ckpt"));
  CHECK(fs::exists(fs::path(saved) / "shard-1-of-2.ckpt"));
  const Tensor w_saved = c.strategy->read_variable("w");
  train(*c.coordinator, 3, 3);
  const Tensor w_uninterrupted = c.strategy->read_variable("w");
  const Tensor emb_uninterrupted = c.strategy->read_variable("emb");
  CHECK_FALSE(w_uninterrupted.equals(w_saved));

  CHECK(manager.restore(saved) == 3);
  CHECK(c.strategy->read_variable("w").equals(w_saved));
  train(*c.coordinator, 3, 3);
  CHECK(c.strategy->read_variable("w").equals(w_uninterrupted));
  CHECK(c.strategy->read_variable("emb").equals(emb_uninterrupted));

  // What the checkpoint holds, as troupe-ckpt reads it.
  const ShardedCheckpointInfo info = inspect_sharded_checkpoint(saved);
  CHECK(info.intact());
  CHECK(info.step == 3);
  CHECK(info.num_ps == 2);
  REQUIRE(info.variables.size() == 2);
  CHECK(info.variables[0].name == "w");
  REQUIRE(info.files.size() == 2);
  bool has_slot = false;
  for (const auto& e : info.files[0].entries) has_slot = has_slot || e.name == "w/part_0/slot_1";
  CHECK(has_slot);

  // max_to_keep 2: the oldest goes; the newest is what restore_or_initialize takes.
  manager.save(4);
  manager.save(5);
  CHECK(manager.checkpoints().size() == 2);
  CHECK_FALSE(fs::exists(saved));
  CHECK(manager.latest_checkpoint().value() == (fs::weakly_canonical(dir.path) / "ckpt-5").string());
}

TEST_CASE("a sharded checkpoint of 2 ps tasks restores its variables and slots onto 3 (resharded)") {
  troupe::testing::temp_dir dir("sharded-reshard");
  std::string saved;
  Tensor w_uninterrupted, emb_saved;
  {
    Cluster c(2, 2);
    make_variables(*c.strategy, false);
    ShardedCheckpointManager manager(*c.strategy, dir.path.string(), 3);
    train(*c.coordinator, 0, 4);
    saved = manager.save(4);
    emb_saved = c.strategy->read_variable("emb");
    train(*c.coordinator, 4, 3);
    w_uninterrupted = c.strategy->read_variable("w");
  }
  Cluster c(3, 3);
  make_variables(*c.strategy, true);
  REQUIRE(c.strategy->variables().at(0).shards.size() == 3);
  ShardedCheckpointManager manager(*c.strategy, dir.path.string(), 3);
  CHECK(manager.restore_or_initialize() == 4);
  CHECK(c.strategy->read_variable("emb").equals(emb_saved));
  // Every shard of "w" had 4 Adam updates: resharded, its slots and step give the same bits.
  train(*c.coordinator, 4, 3);
  CHECK(c.strategy->read_variable("w").equals(w_uninterrupted));
}

// The variables as a model makes them: troupe::Variable in the strategy's scope.
std::map<std::string, Variable> scoped_variables(ParameterServerStrategy& strategy, bool zeros) {
  std::vector<float> w(12), emb(14);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = zeros ? 0.0f : 0.25f * static_cast<float>(i) - 1.0f;
  for (std::size_t i = 0; i < emb.size(); ++i) emb[i] = zeros ? 0.0f : 0.125f * static_cast<float>(i);
  auto scope = strategy.scope();
  return {{"dense/w", Variable(Tensor::from_vector<float>(w, {6, 2}), "w")},
          {"embedding/emb", Variable(Tensor::from_vector<float>(emb, {7, 2}), "emb")}};
}

TEST_CASE("Checkpoint and CheckpointManager of ps variables: Adam's slots saved by the ps tasks, restored onto 2 and then 3 ps tasks") {
  troupe::testing::temp_dir dir("ckpt-ps-public");
  std::string saved;
  Tensor w_uninterrupted, emb_saved, w_at_8;
  {
    Cluster c(2, 2);
    CheckpointManager manager(Checkpoint(scoped_variables(*c.strategy, false)), dir.path.string(), 2);
    CHECK_FALSE(manager.restore_or_initialize().has_value());  // nothing saved yet
    train(*c.coordinator, 0, 4);
    saved = manager.save(4);
    // The layout of a sharded checkpoint: troupe-ckpt and the sidecar evaluator read it.
    CHECK(saved == (fs::weakly_canonical(dir.path) / "ckpt-4").string());
    CHECK(manager.latest_checkpoint().value() == saved);
    const ShardedCheckpointInfo info = inspect_sharded_checkpoint(saved);
    CHECK(info.intact());
    CHECK(info.step == 4);
    CHECK(info.num_ps == 2);
    REQUIRE(info.variables.size() == 2);
    bool has_slot = false;
    for (const auto& f : info.files) {
      for (const auto& e : f.entries) has_slot = has_slot || e.name == "w/part_1/slot_1";
    }
    CHECK(has_slot);
    CHECK(read_sharded_checkpoint(saved).variables.at("w").equals(c.strategy->read_variable("w")));
    emb_saved = c.strategy->read_variable("emb");
    train(*c.coordinator, 4, 3);
    w_uninterrupted = c.strategy->read_variable("w");
    // Same cluster: restored, the next steps give the bits of training without the restore.
    CHECK(manager.restore_or_initialize() == 4);
    CHECK(manager.checkpoint().step() == 4);
    CHECK(c.strategy->read_variable("emb").equals(emb_saved));
    train(*c.coordinator, 4, 3);
    CHECK(c.strategy->read_variable("w").equals(w_uninterrupted));
    // max_to_keep 2: the oldest directory goes.
    manager.save(7);
    manager.save(8);
    w_at_8 = c.strategy->read_variable("w");
    CHECK(manager.checkpoints().size() == 2);
    CHECK_FALSE(fs::exists(saved));
    // Checkpoint::save numbers its directories, and restore takes one back.
    Checkpoint numbered = manager.checkpoint();
    const std::string first = numbered.save((dir.path / "run" / "model").string());
    CHECK(first == (fs::weakly_canonical(dir.path) / "run" / "model-1").string());
    CHECK(fs::exists(fs::path(first) / "manifest.json"));
    CHECK(numbered.save((dir.path / "run" / "model").string()) == (fs::weakly_canonical(dir.path) / "run" / "model-2").string());
    CHECK(latest_checkpoint((dir.path / "run").string()).has_value());
    numbered.restore(first);
    CHECK(numbered.step() == 8);
    saved = (fs::weakly_canonical(dir.path) / "ckpt-8").string();
  }
  {
    // Onto 3 ps tasks and 3 shards per variable: resharded, slots and steps with the rows.
    Cluster c(3, 3);
    auto variables = scoped_variables(*c.strategy, true);
    REQUIRE(c.strategy->variables().at(0).shards.size() == 3);
    CheckpointManager manager(Checkpoint(variables), dir.path.string(), 2);
    CHECK(manager.restore_or_initialize() == 8);
    Checkpoint direct(variables);
    direct.restore(saved);
    CHECK(direct.step() == 8);
    const Tensor w8 = c.strategy->read_variable("w");
    CHECK(w8.equals(w_at_8));
    // Saved again from 3 ps tasks, and restored onto 2 below.
    CHECK(manager.save(9) == (fs::weakly_canonical(dir.path) / "ckpt-9").string());
    CHECK(inspect_sharded_checkpoint(manager.latest_checkpoint().value()).num_ps == 3);
    train(*c.coordinator, 8, 2);
    w_uninterrupted = c.strategy->read_variable("w");
    CHECK_FALSE(w_uninterrupted.equals(w8));
  }
  Cluster c(2, 1);
  auto variables = scoped_variables(*c.strategy, true);
  CheckpointManager manager(Checkpoint(variables), dir.path.string(), 2);
  CHECK(manager.restore_or_initialize() == 9);
  train(*c.coordinator, 8, 2);
  CHECK(c.strategy->read_variable("w").equals(w_uninterrupted));
}

TEST_CASE("a damaged, missing or unfinished sharded checkpoint is named, skipped for an older one, and changes nothing") {
  troupe::testing::temp_dir dir("sharded-bad");
  Cluster c(2, 2);
  make_variables(*c.strategy, false);
  ShardedCheckpointManager manager(*c.strategy, dir.path.string(), 5);
  train(*c.coordinator, 0, 2);
  const std::string first = manager.save(2);
  const Tensor w2 = c.strategy->read_variable("w");
  train(*c.coordinator, 2, 2);
  const std::string second = manager.save(4);
  const Tensor w4 = c.strategy->read_variable("w");

  // A byte flipped in a shard file: named, and the older checkpoint is restored instead.
  const fs::path shard = fs::path(second) / "shard-1-of-2.ckpt";
  flip_byte(shard, fs::file_size(shard) / 2);
  const std::string damaged = message_of([&] { manager.restore(second); });
  CAPTURE(damaged);
  CHECK(contains(damaged, shard.string()));
  CHECK(contains(damaged, "the manifest says"));
  CHECK(c.strategy->read_variable("w").equals(w4));  // nothing changed
  CHECK_FALSE(inspect_sharded_checkpoint(second).intact());
  CHECK(manager.restore_or_initialize() == 2);
  CHECK(c.strategy->read_variable("w").equals(w2));

  // A missing shard file, and a manifest cut short.
  fs::remove(fs::path(first) / "shard-0-of-2.ckpt");
  CHECK(contains(message_of([&] { manager.restore(first); }), (fs::path(first) / "shard-0-of-2.ckpt").string() + " is missing"));
  std::filesystem::resize_file(fs::path(second) / "manifest.json", 40);
  CHECK(contains(message_of([&] { manager.restore(second); }), "manifest.json: not valid JSON"));
  CHECK(contains(message_of([&] { manager.restore_or_initialize(); }), "reads back intact"));

  // A save killed before its manifest: its directory is no checkpoint, and the next manager
  // removes it (its writer, this pid's made-up neighbour, is not running).
  const fs::path unfinished = fs::path(dir.path) / "ckpt-9.tmp-999999999-0";
  fs::create_directories(unfinished);
  std::ofstream(unfinished / "shard-0-of-2.ckpt") << "partial";
  CHECK(manager.checkpoints().size() == 2);
  ShardedCheckpointManager again(*c.strategy, dir.path.string(), 5);
  CHECK_FALSE(fs::exists(unfinished));

  // A variable the checkpoint lacks, or of another shape: named.
  const std::string good = manager.save(6);
  c.strategy->create_variable("extra", Tensor::zeros({2}));
  CHECK(contains(message_of([&] { manager.restore(good); }), "has no variable 'extra'"));
  CHECK_THROWS_AS(ShardedCheckpointManager(*c.strategy, dir.path.string(), 0), std::invalid_argument);
  std::ofstream(dir.path / "a-file") << "x";
  CHECK_THROWS_AS(ShardedCheckpointManager(*c.strategy, (dir.path / "a-file").string(), 1), CheckpointError);
}

}  // namespace TROUPE_TEST_FILE
