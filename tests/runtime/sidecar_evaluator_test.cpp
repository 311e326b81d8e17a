#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
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

// A cluster on loopback in this process: 1 worker, 2 ps tasks, the chief's strategy with 2 shards
// per variable.
struct Cluster {
  ClusterSpec spec;
  ServerOptions o;
  std::vector<std::unique_ptr<Runtime>> runtimes;
  std::vector<std::unique_ptr<Server>> servers;
  Runtime chief_rt;
  std::unique_ptr<ParameterServerStrategy> strategy;

  Cluster() {
    const auto a = troupe::testing::loopback_addresses(4);
    spec = ClusterSpec(ClusterSpec::JobMap{{"chief", {a[0]}}, {"worker", {a[1]}}, {"ps", {a[2], a[3]}}});
    runtimes.push_back(std::make_unique<Runtime>());
    servers.push_back(std::make_unique<Server>(*runtimes.back(), spec, "worker", 0, FunctionRegistry{}, o));
    for (int i = 0; i < 2; ++i) {
      runtimes.push_back(std::make_unique<Runtime>());
      servers.push_back(std::make_unique<Server>(*runtimes.back(), spec, "ps", i, FunctionRegistry{}, o));
    }
    strategy = std::make_unique<ParameterServerStrategy>(chief_rt, std::make_shared<SimpleClusterResolver>(spec, "chief", 0),
                                                         std::make_shared<FixedShardsPartitioner>(2), o);
  }
  ~Cluster() { strategy.reset(); }
};

nn::Model make_model() {
  nn::Model model(nn::Sequential({nn::Dense(6, 8, nn::Activation::relu, 11, "dense"),
                                  nn::Dense(8, 3, nn::Activation::none, 12, "dense_1")}));
  model.compile(std::make_shared<nn::SGD>(0.1f), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
  return model;
}

data::Dataset held_out() {
  nn::BlobOptions options;
  options.samples = 96;
  options.features = 6;
  options.classes = 3;
  options.seed = 5;
  const auto d = nn::make_blobs(options);
  return data::Dataset::from_tensor_slices({d.features, d.labels}).batch(32);
}

// The trained model (its variables on the ps tasks) moved to "step" s: every weight scaled by
// a factor of s, so that every checkpoint holds other weights.
void move_to(nn::Model& trained, int s) {
  for (Variable v : trained.trainable_variables()) v.assign(v.value() * (1.0f + 0.25f * static_cast<float>(s)));
}

// Model::evaluate of the ps tasks' current weights, in one process with no cluster.
nn::EvaluateResult reference(ParameterServerStrategy& strategy) {
  nn::Model local = make_model();
  for (Variable v : local.trainable_variables()) v.assign(strategy.read_variable(v.name()));
  return local.evaluate(held_out());
}

// The scalars of a TensorBoard event file: tag -> [(step, value)], read from its records
// (uint64 length, uint32 crc, Event, uint32 crc) and the protocol buffer wire format of
// Event{step = 2, summary = 5 {value = 1 {tag = 1, simple_value = 2}}}.
struct Reader {
  const std::string& b;
  std::size_t at, end;
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; at < end; shift += 7) {
      const auto c = static_cast<unsigned char>(b[at++]);
      v |= static_cast<std::uint64_t>(c & 0x7f) << shift;
      if (!(c & 0x80)) break;
    }
    return v;
  }
};

void skip(Reader& r, std::uint64_t wire) {
  if (wire == 0) r.varint();
  else if (wire == 1) r.at += 8;
  else if (wire == 2) r.at += r.varint();
  else if (wire == 5) r.at += 4;
}

std::map<std::string, std::vector<std::pair<std::int64_t, float>>> scalars_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, std::vector<std::pair<std::int64_t, float>>> out;
  std::size_t at = 0;
  while (at + 12 <= bytes.size()) {
    std::uint64_t len = 0;
    std::memcpy(&len, bytes.data() + at, 8);
    REQUIRE(at + 12 + len + 4 <= bytes.size());
    Reader event{bytes, at + 12, at + 12 + len};
    std::int64_t step = 0;
    std::vector<std::pair<std::string, float>> values;
    while (event.at < event.end) {
      const std::uint64_t key = event.varint();
      if (key == (2u << 3)) {
        step = static_cast<std::int64_t>(event.varint());
      } else if (key == ((5u << 3) | 2)) {
        const std::uint64_t n = event.varint();
        Reader summary{bytes, event.at, event.at + n};
        event.at += n;
        while (summary.at < summary.end) {
          const std::uint64_t k = summary.varint();
          if (k != ((1u << 3) | 2)) { skip(summary, k & 7); continue; }
          const std::uint64_t m = summary.varint();
          Reader value{bytes, summary.at, summary.at + m};
          summary.at += m;
          std::string tag;
          float simple = 0;
          while (value.at < value.end) {
            const std::uint64_t vk = value.varint();
            if (vk == ((1u << 3) | 2)) {
              const std::uint64_t t = value.varint();
              tag = bytes.substr(value.at, t);
              value.at += t;
            } else if (vk == ((2u << 3) | 5)) {
              std::memcpy(&simple, bytes.data() + value.at, 4);
              value.at += 4;
            } else {
              skip(value, vk & 7);
            }
          }
          values.emplace_back(tag, simple);
        }
      } else {
        skip(event, key & 7);
      }
    }
    for (auto& [tag, v] : values) out[tag].emplace_back(step, v);
    at += 12 + len + 4;
  }
  return out;
}

std::string only_event_file(const fs::path& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().string());
  REQUIRE(files.size() == 1);
  return files[0];
}

}  // namespace

TEST_CASE("SidecarEvaluator evaluates every sharded checkpoint once, in step order, as Model::evaluate of its weights, "
          "and writes eval_loss and eval_accuracy at each step") {
  troupe::testing::temp_dir dir("sidecar");
  const std::string ckpts = dir.file("ckpt"), logs = dir.file("eval");
  Cluster c;
  std::optional<nn::Model> trained;
  {
    auto scope = c.strategy->scope();
    trained.emplace(make_model());
  }
  ShardedCheckpointManager manager(*c.strategy, ckpts, 10);
  std::map<std::int64_t, nn::EvaluateResult> expected;
  for (int s : {10, 20, 30}) {
    move_to(*trained, s);
    expected[s] = reference(*c.strategy);
    manager.save(s);
  }
  // A save still in its temporary directory (of this running process) is never evaluated.
  fs::copy(fs::path(ckpts) / "ckpt-30", fs::path(ckpts) / ("ckpt-40.tmp-" + std::to_string(::getpid()) + "-0"));
  CHECK(expected[10].loss != expected[30].loss);

  nn::Model local = make_model();
  std::ostringstream lines;
  nn::SidecarEvaluatorOptions options;
  options.poll_interval = std::chrono::milliseconds(20);
  options.final_step = 30;
  options.tensorboard_dir = logs;
  options.out = &lines;
  nn::SidecarEvaluator evaluator(local, held_out(), ckpts, 0, 0, options);
  const auto done = evaluator.start();
  REQUIRE(done.size() == 3);
  std::int64_t k = 0;
  for (const auto& e : done) {
    k += 10;
    CHECK(e.step == k);
    CHECK(e.checkpoint == (fs::path(ckpts) / ("ckpt-" + std::to_string(k))).string());
    CHECK(e.result.loss == expected[k].loss);
    CHECK(e.result.accuracy == expected[k].accuracy);
    CHECK(e.result.samples == 96);
  }
  CHECK(evaluator.last_step() == 30);
  CHECK(contains(lines.str(), "evaluator: step 20 ("));
  CHECK(contains(lines.str(), "eval_loss="));

  const auto scalars = scalars_of(only_event_file(logs));
  REQUIRE(scalars.count("eval_loss") == 1);
  REQUIRE(scalars.count("eval_accuracy") == 1);
  const auto& loss = scalars.at("eval_loss");
  REQUIRE(loss.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    const std::int64_t s = 10 * static_cast<std::int64_t>(i + 1);
    CHECK(loss[i].first == s);
    CHECK(loss[i].second == static_cast<float>(expected[s].loss));
    CHECK(scalars.at("eval_accuracy")[i].second == static_cast<float>(expected[s].accuracy));
  }

  // max_evaluations: a second evaluator stops after the first.
  nn::Model again = make_model();
  nn::SidecarEvaluator one(again, held_out(), ckpts, 1, 1, {});
  const auto first = one.start();
  REQUIRE(first.size() == 1);
  CHECK(first[0].step == 10);
  CHECK(first[0].result.samples == 32);  // steps 1: one batch
}

TEST_CASE("SidecarEvaluator follows a training that saves while it waits, and a damaged checkpoint is reported and skipped") {
  troupe::testing::temp_dir dir("sidecar-live");
  const std::string ckpts = dir.file("ckpt");
  Cluster c;
  std::optional<nn::Model> trained;
  {
    auto scope = c.strategy->scope();
    trained.emplace(make_model());
  }
  nn::Model local = make_model();
  std::ostringstream lines;
  nn::SidecarEvaluatorOptions options;
  options.poll_interval = std::chrono::milliseconds(10);
  options.final_step = 4;
  options.out = &lines;
  nn::SidecarEvaluator evaluator(local, held_out(), ckpts, 0, 0, options);  // the directory does not exist yet
  std::vector<nn::SidecarEvaluation> done;
  std::thread watcher([&] { done = evaluator.start(); });

  ShardedCheckpointManager manager(*c.strategy, ckpts, 10);
  std::map<std::int64_t, nn::EvaluateResult> expected;
  for (int s = 1; s <= 4; ++s) {
    move_to(*trained, s);
    expected[s] = reference(*c.strategy);
    if (s == 3) {
      // Damaged (as a disk would do it): saved beside the directory, a byte flipped, then renamed
      // into it whole, so that the evaluator never sees it intact.
      ShardedCheckpointManager staging(*c.strategy, dir.file("staging"), 1);
      const std::string saved = staging.save(s);
      {
        std::fstream f(fs::path(saved) / "shard-1-of-2.ckpt", std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(40);
        f.put('\x5a');
      }
      fs::rename(saved, fs::path(ckpts) / "ckpt-3");
    } else {
      manager.save(s);
    }
    if (s <= 2) {
      // Let the evaluator take each of the first two before the next save.
      for (int i = 0; i < 1000 && evaluator.last_step() < s; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  watcher.join();
  REQUIRE(done.size() == 3);
  CHECK(done[0].step == 1);
  CHECK(done[1].step == 2);
  CHECK(done[2].step == 4);
  for (const auto& e : done) CHECK(e.result.loss == expected[e.step].loss);
  CHECK(contains(lines.str(), "evaluator: skipping step 3"));
  CHECK(contains(lines.str(), "shard-1-of-2.ckpt"));
}

TEST_CASE("SidecarEvaluator: stop() ends a wait on an empty directory, bad arguments and another model are errors") {
  troupe::testing::temp_dir dir("sidecar-stop");
  nn::Model local = make_model();
  nn::SidecarEvaluatorOptions options;
  options.poll_interval = std::chrono::milliseconds(60000);
  nn::SidecarEvaluator evaluator(local, held_out(), dir.file("none"), 0, 0, options);
  std::vector<nn::SidecarEvaluation> done{nn::SidecarEvaluation{}};
  std::thread watcher([&] { done = evaluator.start(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  evaluator.stop();
  watcher.join();  // at once, not after the poll interval
  CHECK(done.empty());

  CHECK(contains(message_of([&] { nn::SidecarEvaluator(local, held_out(), "", 0, 0); }), "checkpoint_dir is empty"));
  CHECK(contains(message_of([&] { nn::SidecarEvaluator(local, held_out(), "d", -1, 0); }), "steps -1"));
  CHECK(contains(message_of([&] { nn::SidecarEvaluator(local, held_out(), "d", 0, -2); }), "max_evaluations -2"));

  // A checkpoint of another model: its variable is named.
  Cluster c;
  std::optional<Variable> other;
  {
    auto scope = c.strategy->scope();
    other.emplace(Tensor::zeros({4, 2}), "other/kernel");
  }
  ShardedCheckpointManager manager(*c.strategy, dir.file("other"), 2);
  manager.save(1);
  nn::SidecarEvaluator wrong(local, held_out(), dir.file("other"), 0, 1);
  CHECK(contains(message_of([&] { wrong.start(); }), "has no variable 'dense/kernel'"));
}

}  // namespace TROUPE_TEST_FILE
