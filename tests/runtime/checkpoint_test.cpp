#include <doctest/doctest.h>

#include "../common/temp_dir.hpp"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <string_view>

#include "test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::message_of;
namespace fs = std::filesystem;

using troupe::testing::read_bytes;
using troupe::testing::temp_dir;
using troupe::testing::write_bytes;

namespace {


// Every component of every variable, to check that a failed restore changed nothing.
using snapshot = std::map<std::string, std::vector<Tensor>>;
snapshot take(const Checkpoint& c) {
  snapshot s;
  for (const auto& [name, v] : c.variables()) s[name] = v.components();
  return s;
}
bool same(const snapshot& a, const snapshot& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, components] : a) {
    const auto& other = b.at(name);
    if (components.size() != other.size()) return false;
    for (std::size_t i = 0; i < components.size(); ++i) {
      if (!components[i].equals(other[i])) return false;
    }
  }
  return true;
}

std::string checkpoint_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

// Captures what is written to std::cerr while it lives.
struct capture_cerr {
  std::ostringstream text;
  std::streambuf* old = std::cerr.rdbuf(text.rdbuf());
  ~capture_cerr() { std::cerr.rdbuf(old); }
};

// Variables of every dtype and synchronization, mirrored over two CPUs (one is not).
struct model {
  Runtime rt;
  MirroredStrategy strategy{rt, {"CPU:0", "CPU:1"}};
  std::map<std::string, Variable> variables;

  model() {
    auto scope = strategy.scope();
    variables.emplace("kernel", Variable(Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}), "kernel"));
    variables.emplace("scale", Variable(Tensor::scalar<double>(0.25), "scale"));
    variables.emplace("counts", Variable(Tensor::from_vector<std::int32_t>({1, -2, 3, -4}), "counts"));
    variables.emplace("ids", Variable(Tensor::from_vector<std::int64_t>({10, 20, 30, 40}, {2, 2}), "ids"));
    variables.emplace("empty", Variable(Tensor::zeros({0, 3}), "empty"));
    variables.emplace("total", Variable(Tensor::scalar<float>(0.0f), "total", VariableSynchronization::on_read,
                                        VariableAggregation::sum));
    variables.emplace("avg", Variable(Tensor::from_vector<double>({0, 0}), "avg", VariableSynchronization::on_read,
                                      VariableAggregation::mean));
    variables.emplace("single", Variable(Tensor::from_vector<std::int64_t>({5}), "single",
                                         VariableSynchronization::none));
    // Each replica's own values for the on_read variables.
    variables.at("total").set_component(0, Tensor::scalar<float>(1.5f));
    variables.at("total").set_component(1, Tensor::scalar<float>(4.5f));
    variables.at("avg").set_component(0, Tensor::from_vector<double>({1, 10}));
    variables.at("avg").set_component(1, Tensor::from_vector<double>({3, 30}));
  }

  // Gives every variable other values.
  void scramble() {
    auto scope = strategy.scope();
    for (auto& [name, v] : variables) {
      std::vector<Tensor> c = v.components();
      for (std::size_t r = 0; r < c.size(); ++r) {
        v.set_component(static_cast<int>(r), v.dtype() == DType::f32 || v.dtype() == DType::f64
                                                 ? c[r] * Scalar(3) + Scalar(1)
                                                 : c[r] * Scalar(7) - Scalar(2));
      }
    }
  }

  // What restoring the values saved from the constructor's state must give, component by component.
  void check_restored() {
    auto scope = strategy.scope();
    auto& v = variables;
    for (const char* name : {"kernel", "scale", "counts", "ids", "empty"}) {
      REQUIRE(v.at(name).components().size() == 2);
    }
    for (const Tensor& t : v.at("kernel").components()) CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
    for (const Tensor& t : v.at("kernel").components()) CHECK(t.shape() == Shape{2, 3});
    for (const Tensor& t : v.at("scale").components()) CHECK(t.item<double>() == 0.25);
    for (const Tensor& t : v.at("counts").components()) CHECK(t.to_vector<std::int32_t>() == std::vector<std::int32_t>{1, -2, 3, -4});
    for (const Tensor& t : v.at("ids").components()) CHECK(t.to_vector<std::int64_t>() == std::vector<std::int64_t>{10, 20, 30, 40});
    for (const Tensor& t : v.at("empty").components()) CHECK(t.shape() == Shape{0, 3});
    CHECK(v.at("kernel").components()[1].device().to_string() == "CPU:1");
    // on_read SUM: the saved sum (6) split over the replicas, so that it sums back.
    for (const Tensor& t : v.at("total").components()) CHECK(t.item<float>() == 3.0f);
    CHECK(v.at("total").value().item<float>() == 6.0f);
    // on_read MEAN: the saved mean in every component.
    for (const Tensor& t : v.at("avg").components()) CHECK(t.to_vector<double>() == std::vector<double>{2, 20});
    REQUIRE(v.at("single").components().size() == 1);
    CHECK(v.at("single").value().to_vector<std::int64_t>() == std::vector<std::int64_t>{5});
  }
};

}  // namespace

TEST_CASE("save and restore round-trip variables of every dtype, mirrored over CPU:0 and CPU:1") {
  temp_dir dir;
  model m;
  Checkpoint ckpt(m.variables);
  ckpt.set_step(7);
  std::string path;
  {
    auto scope = m.strategy.scope();
    path = ckpt.save(dir.file("model"));
  }
  CHECK(path == dir.file("model-1.ckpt"));
  CHECK(fs::exists(path));
  m.scramble();
  ckpt.set_step(0);
  ckpt.restore(path);
  CHECK(ckpt.step() == 7);
  m.check_restored();
}

TEST_CASE("save and restore work outside the strategy's scope too, with the same values") {
  temp_dir dir;
  model m;
  Checkpoint ckpt(m.variables);
  ckpt.set_step(11);
  const std::string path = ckpt.save(dir.file("outside"));  // no scope open: components combined here
  m.scramble();
  Checkpoint other(m.variables);
  other.restore(path);
  CHECK(other.step() == 11);
  m.check_restored();

  // The same bytes as a save made inside the scope.
  {
    auto scope = m.strategy.scope();
    Checkpoint(m.variables).save(dir.file("inside"));
  }
  Checkpoint(m.variables).save(dir.file("outside2"));
  CHECK(read_bytes(dir.file("inside-1.ckpt")) == read_bytes(dir.file("outside2-1.ckpt")));
}

TEST_CASE("save numbers its files as TensorFlow does, restore takes what save returned and latest_checkpoint finds it") {
  temp_dir dir;
  model m;
  Checkpoint ckpt(m.variables);
  CHECK(ckpt.save_counter() == 0);
  ckpt.set_step(1);
  const std::string first = ckpt.save(dir.file("run/model"));  // the directory is created
  CHECK(first == dir.file("run/model-1.ckpt"));
  CHECK(ckpt.save_counter() == 1);
  CHECK(latest_checkpoint(dir.file("run")) == first);
  ckpt.set_step(2);
  const std::string second = ckpt.save(dir.file("run/model"));
  CHECK(second == dir.file("run/model-2.ckpt"));
  CHECK(ckpt.save_counter() == 2);
  CHECK(latest_checkpoint(dir.file("run")) == second);

  // restore(the path save returned), and TensorFlow's form of it without ".ckpt".
  m.scramble();
  Checkpoint restored(m.variables);
  restored.restore(second);
  CHECK(restored.step() == 2);
  m.check_restored();
  m.scramble();
  restored.restore(dir.file("run/model-1"));
  CHECK(restored.step() == 1);
  m.check_restored();

  // The prefix itself names no file: the error names the file save wrote.
  const std::string msg = checkpoint_error_of([&] { restored.restore(dir.file("run/model")); });
  CHECK(contains(msg, "checkpoint " + dir.file("run/model") + ": no such file"));
  CHECK(contains(msg, "the highest being " + second));

  // A new Checkpoint (a later run) goes on after the numbers on disk, never over them.
  Checkpoint later(m.variables);
  CHECK(later.save(dir.file("run/model")) == dir.file("run/model-3.ckpt"));
  CHECK(later.save_counter() == 3);
  CHECK(latest_checkpoint(dir.file("run")) == dir.file("run/model-3.ckpt"));
  // Another prefix's numbers are its own ("model-a" is not "model"), and the file written last is
  // the latest, whatever its number (model-3's time is set back: both may share a clock tick).
  CHECK(Checkpoint(m.variables).save(dir.file("run/model-a")) == dir.file("run/model-a-1.ckpt"));
  fs::last_write_time(dir.file("run/model-3.ckpt"),
                      fs::last_write_time(dir.file("run/model-a-1.ckpt")) - std::chrono::seconds(10));
  CHECK(latest_checkpoint(dir.file("run")) == dir.file("run/model-a-1.ckpt"));

  // write: the prefix itself, no number, the counter unchanged.
  CHECK(later.write(dir.file("run/final")) == dir.file("run/final.ckpt"));
  CHECK(later.save_counter() == 3);
  CHECK(latest_checkpoint(dir.file("run")) == dir.file("run/model-a-1.ckpt"));  // "final" has no number

  // CheckpointManager's files are found too; nothing in a missing or empty directory.
  CheckpointManager manager(Checkpoint(m.variables), dir.file("managed"), 2);
  const std::string managed = manager.save(40);
  CHECK(latest_checkpoint(dir.file("managed")) == managed);
  CHECK_FALSE(latest_checkpoint(dir.file("nothing-here")).has_value());
  fs::create_directories(dir.file("empty"));
  CHECK_FALSE(latest_checkpoint(dir.file("empty")).has_value());
}

TEST_CASE("damaged files are CheckpointErrors naming the file, and the variables are unchanged") {
  temp_dir dir;
  model m;
  Checkpoint ckpt(m.variables);
  const std::string good = ckpt.save(dir.file("good"));
  const std::vector<unsigned char> bytes = read_bytes(good);
  m.scramble();
  const snapshot before = take(ckpt);
  const std::string bad = dir.file("bad.ckpt");
  auto restore_bad = [&] { return checkpoint_error_of([&] { ckpt.restore(bad); }); };

  SUBCASE("truncated") {
    write_bytes(bad, std::vector<unsigned char>(bytes.begin(), bytes.end() - 9));
    CHECK(contains(restore_bad(), "checkpoint " + bad + ": truncated: its header says " + std::to_string(bytes.size()) +
                                      " bytes, the file has " + std::to_string(bytes.size() - 9)));
  }
  SUBCASE("a flipped byte in tensor data names the tensor") {
    // The kernel's floats 1..6 are stored in place; flip a bit of the 5.0f.
    std::vector<unsigned char> flipped = bytes;
    const float five = 5.0f;
    auto at = std::search(flipped.begin(), flipped.end(), reinterpret_cast<const unsigned char*>(&five),
                          reinterpret_cast<const unsigned char*>(&five) + 4);
    REQUIRE(at != flipped.end());
    at[1] ^= 0x01;
    write_bytes(bad, flipped);
    CHECK(contains(restore_bad(), "checkpoint " + bad + ": tensor 'kernel' fails its checksum"));
  }
  SUBCASE("a flipped byte in the header") {
    std::vector<unsigned char> flipped = bytes;
    flipped[17] ^= 0x40;  // the message size
    write_bytes(bad, flipped);
    CHECK(contains(restore_bad(), "checkpoint " + bad + ": corrupt header"));
    flipped = bytes;
    const std::string name = "counts";
    auto at = std::search(flipped.begin(), flipped.end(), name.begin(), name.end());
    REQUIRE(at != flipped.end());
    *at = 'C';  // a variable's name
    write_bytes(bad, flipped);
    CHECK(contains(restore_bad(), "checkpoint " + bad + ": corrupt header: the checksum of its metadata"));
  }
  SUBCASE("random bytes") {
    std::mt19937 rng(11);
    std::vector<unsigned char> noise(bytes.size());
    for (auto& b : noise) b = static_cast<unsigned char>(rng());
    write_bytes(bad, noise);
    CHECK(contains(restore_bad(), "checkpoint " + bad + ": not a troupe checkpoint"));
  }
  SUBCASE("an empty file") {
    write_bytes(bad, {});
    CHECK(restore_bad() == "checkpoint " + bad + ": empty file (0 bytes), not a troupe checkpoint");
  }
  SUBCASE("a missing file") {
    CHECK(contains(restore_bad(), "checkpoint " + bad + ": cannot open it: No such file or directory"));
  }
  CHECK(same(before, take(ckpt)));
}

TEST_CASE("a checkpoint that does not match the variables is refused and changes nothing") {
  temp_dir dir;
  Variable a(Tensor::from_vector<float>({1, 2}), "a");
  Variable b(Tensor::from_vector<float>({3, 4, 5}), "b");
  const std::string path = Checkpoint({{"a", a}, {"b", b}}).save(dir.file("ab"));
  a.assign(Tensor::from_vector<float>({-1, -1}));

  Variable wrong_dtype(Tensor::from_vector<double>({0, 0, 0}), "b");
  Checkpoint by_dtype({{"a", a}, {"b", wrong_dtype}});
  CHECK(checkpoint_error_of([&] { by_dtype.restore(path); }) ==
        "checkpoint " + path + ": variable 'b' is float64 [3], the file holds it as float32 [3]");

  Variable wrong_shape(Tensor::zeros({3, 1}), "b");
  Checkpoint by_shape({{"a", a}, {"b", wrong_shape}});
  CHECK(checkpoint_error_of([&] { by_shape.restore(path); }) ==
        "checkpoint " + path + ": variable 'b' is float32 [3, 1], the file holds it as float32 [3]");

  Variable c(Tensor::zeros({1}), "c");
  Checkpoint missing({{"a", a}, {"c", c}});
  CHECK(checkpoint_error_of([&] { missing.restore(path); }) ==
        "checkpoint " + path + ": no variable 'c' in the file (it holds 'a', 'b')");

  // 'a' sorts first and matched each time, yet none of the failed restores assigned it.
  CHECK(a.value().to_vector<float>() == std::vector<float>{-1, -1});
  CHECK(wrong_dtype.value().to_vector<double>() == std::vector<double>{0, 0, 0});

  // A file holding more than the checkpoint asks for is fine: the rest is ignored.
  Checkpoint({{"a", a}}).restore(path);
  CHECK(a.value().to_vector<float>() == std::vector<float>{1, 2});
}

TEST_CASE("Checkpoint refuses duplicate names and saving inside a replica function") {
  Variable a(Tensor::scalar<float>(1.0f));
  Checkpoint ckpt({{"a", a}});
  CHECK(message_of([&] { ckpt.add("a", a); }) == "Checkpoint::add: a variable named 'a' is already present");
  CHECK_THROWS_AS(ckpt.add({{"b", a}, {"a", a}}), std::invalid_argument);
  CHECK(ckpt.variables().size() == 1);  // the map was checked before anything was added
  ckpt.add({{"b", a}, {"c", a}});
  CHECK(ckpt.variables().size() == 3);

  temp_dir dir;
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  std::string msg = message_of([&] { s.run([&] { ckpt.save(dir.file("x")); }); });
  CHECK(contains(msg, "Checkpoint::save: call it in cross-replica context"));
  CHECK_FALSE(fs::exists(dir.file("x-1.ckpt")));
  CHECK(ckpt.save_counter() == 0);
}

TEST_CASE("CheckpointManager keeps the last K checkpoints, ordered by step") {
  temp_dir dir;
  Variable v(Tensor::scalar<std::int64_t>(0), "v");
  CheckpointManager manager(Checkpoint({{"v", v}}), dir.file("run"), 3);  // created by the first save
  CHECK(manager.latest_checkpoint() == std::nullopt);
  CHECK(manager.checkpoints().empty());
  for (std::int64_t step : {1, 2, 5, 9, 10, 12}) {
    v.assign(Tensor::scalar<std::int64_t>(step * 100));
    CHECK(manager.save(step) == dir.file("run/ckpt-" + std::to_string(step) + ".ckpt"));
  }
  // Numeric order: ckpt-10 is newer than ckpt-9.
  CHECK(manager.checkpoints() ==
        std::vector<std::string>{dir.file("run/ckpt-9.ckpt"), dir.file("run/ckpt-10.ckpt"), dir.file("run/ckpt-12.ckpt")});
  CHECK(manager.latest_checkpoint() == dir.file("run/ckpt-12.ckpt"));
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.file("run"))) ++files;
  CHECK(files == 3);

  v.assign(Tensor::scalar<std::int64_t>(-1));
  CHECK(manager.restore_or_initialize() == 12);
  CHECK(v.value().item<std::int64_t>() == 1200);
  CHECK(manager.checkpoint().step() == 12);

  CHECK_THROWS_AS(CheckpointManager(Checkpoint({{"v", v}}), dir.file("run"), 0), std::invalid_argument);
  CHECK_THROWS_AS(manager.save(-1), std::invalid_argument);
}

TEST_CASE("an application's log sink receives the damaged-checkpoint warning - the level filters it") {
  temp_dir dir;
  Variable w(Tensor::from_vector<float>({0, 0}), "w");
  CheckpointManager manager(Checkpoint({{"w", w}}), dir.path.string(), 5);
  manager.save(1);
  manager.save(2);
  write_bytes(dir.file("ckpt-2.ckpt"), {});
  struct record {
    LogLevel level;
    std::string message;
  };
  std::vector<record> got;
  set_log_sink([&](LogLevel level, std::string_view message) { got.push_back({level, std::string(message)}); });
  set_log_level(LogLevel::warning);
  std::string err_text;
  {
    capture_cerr err;
    CHECK(manager.restore_or_initialize() == 1);
    set_log_level(LogLevel::error);  // warnings dropped
    CHECK(manager.restore_or_initialize() == 1);
    set_log_level(LogLevel::warning);
    set_log_sink([](LogLevel, std::string_view) { throw std::runtime_error("a sink that throws"); });
    CHECK(manager.restore_or_initialize() == 1);  // its exception does not reach troupe's caller
    err_text = err.text.str();
  }
  set_log_sink(nullptr);
  REQUIRE(got.size() == 1);
  CHECK(got[0].level == LogLevel::warning);
  CHECK(got[0].message ==
        "CheckpointManager: skipping a damaged checkpoint, checkpoint " + dir.file("ckpt-2.ckpt") +
            ": empty file (0 bytes), not a troupe checkpoint; trying an older one");
  CHECK(err_text.empty());  // nothing went to stderr while the application's sink was set
  CHECK(parse_log_level("debug") == LogLevel::debug);
  CHECK(contains(message_of([] { parse_log_level("loud"); }), "\"loud\" is not one of debug, info, warning, error, off"));
}

TEST_CASE("restore_or_initialize skips a corrupted newest checkpoint and restores the previous one") {
  temp_dir dir;
  Variable w(Tensor::from_vector<float>({0, 0, 0}), "w");
  CheckpointManager manager(Checkpoint({{"w", w}}), dir.path.string(), 5);
  CHECK(manager.restore_or_initialize() == std::nullopt);  // nothing yet: keep the initial values
  CHECK(w.value().to_vector<float>() == std::vector<float>{0, 0, 0});
  for (int step = 1; step <= 3; ++step) {
    w.assign(Tensor::full({3}, step, DType::f32));
    manager.save(step);
  }
  // Damage the newest two: one truncated, one with a flipped data byte.
  const std::string newest = dir.file("ckpt-3.ckpt");
  const std::string second = dir.file("ckpt-2.ckpt");
  std::vector<unsigned char> bytes = read_bytes(newest);
  bytes.resize(bytes.size() / 2);
  write_bytes(newest, bytes);
  bytes = read_bytes(second);
  bytes[bytes.size() - 5] ^= 0x80;
  write_bytes(second, bytes);

  w.assign(Tensor::full({3}, 99, DType::f32));
  std::optional<std::int64_t> step;
  std::string log;
  {
    capture_cerr err;
    step = manager.restore_or_initialize();
    log = err.text.str();
  }
  CHECK(step == 1);
  CHECK(w.value().to_vector<float>() == std::vector<float>{1, 1, 1});
  CHECK(contains(log, "skipping a damaged checkpoint, checkpoint " + newest + ": truncated"));
  CHECK(contains(log, "skipping a damaged checkpoint, checkpoint " + second + ": tensor 'w' fails its checksum"));
  CHECK_FALSE(contains(log, "ckpt-1.ckpt"));

  // With every checkpoint damaged, nothing is silently re-initialised.
  write_bytes(dir.file("ckpt-1.ckpt"), {});
  std::string msg;
  {
    capture_cerr err;
    msg = checkpoint_error_of([&] { manager.restore_or_initialize(); });
  }
  CHECK(contains(msg, "none of the 3 checkpoints in " + dir.path.string() + " reads back intact"));
  CHECK(contains(msg, dir.file("ckpt-1.ckpt") + ": empty file"));
  CHECK(w.value().to_vector<float>() == std::vector<float>{1, 1, 1});
}

TEST_CASE("an interrupted save never shadows a good checkpoint") {
  temp_dir dir;
  Variable w(Tensor::scalar<double>(4.0), "w");
  CheckpointManager manager(Checkpoint({{"w", w}}), dir.path.string(), 2);
  manager.save(5);
  // What a crash in the middle of saving step 6 leaves: a partial temporary file.
  const std::string stray = dir.file("ckpt-6.ckpt.tmp-12345-0");
  std::vector<unsigned char> partial = read_bytes(dir.file("ckpt-5.ckpt"));
  partial.resize(partial.size() / 3);
  write_bytes(stray, partial);

  CHECK(manager.latest_checkpoint() == dir.file("ckpt-5.ckpt"));
  CHECK(manager.checkpoints().size() == 1);
  w.assign(Tensor::scalar<double>(-1.0));
  CHECK(manager.restore_or_initialize() == 5);
  CHECK(w.value().item<double>() == 4.0);

  // Later saves neither count nor delete it.
  manager.save(6);
  manager.save(7);
  CHECK(manager.checkpoints() == std::vector<std::string>{dir.file("ckpt-6.ckpt"), dir.file("ckpt-7.ckpt")});
  CHECK(fs::exists(stray));
}

TEST_CASE("inspect_checkpoint lists names, dtypes, shapes and checksum status") {
  temp_dir dir;
  Variable a(Tensor::from_vector<std::int32_t>({1, 2, 3, 4}, {2, 2}), "a");
  Variable b(Tensor::scalar<double>(2.5), "b");
  Checkpoint ckpt({{"a", a}, {"b", b}});
  ckpt.set_step(31);
  const std::string path = ckpt.save(dir.file("i"));
  CheckpointInfo info = inspect_checkpoint(path);
  CHECK(info.step == 31);
  CHECK(info.file_bytes == fs::file_size(path));
  REQUIRE(info.entries.size() == 2);
  CHECK(info.entries[0].name == "a");
  CHECK(info.entries[0].dtype == DType::i32);
  CHECK(info.entries[0].shape == Shape{2, 2});
  CHECK(info.entries[0].nbytes == 16);
  CHECK(info.entries[0].checksum_ok);
  CHECK(info.entries[1].dtype == DType::f64);

  std::vector<unsigned char> bytes = read_bytes(path);
  bytes.back() ^= 1;  // b's last byte
  write_bytes(path, bytes);
  info = inspect_checkpoint(path);
  CHECK(info.entries[0].checksum_ok);
  CHECK_FALSE(info.entries[1].checksum_ok);
  CHECK_THROWS_AS(inspect_checkpoint(dir.file("nothing.ckpt")), CheckpointError);
}

}  // namespace TROUPE_TEST_FILE
