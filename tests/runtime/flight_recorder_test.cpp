// The flight recorder: its ring (wrap-around, order, concurrent writers and readers, no torn
// entries), what strategies record into it, its dumps (a failed collective, SIGUSR1) and its
// settings.
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "flight_recorder.hpp"
#include "troupe/base/parse_number.hpp"
#include "test_util.hpp"
#include "troupe/troupe.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::detail::flight_collective;
using troupe::detail::flight_entry;
using troupe::detail::flight_group;
using troupe::detail::flight_op;
using troupe::detail::flight_state;
using troupe::detail::FlightRecorder;
using troupe::testing::contains;
using troupe::testing::cpus;
using troupe::testing::message_of;

namespace {

flight_collective numbered(std::uint64_t step, int replica) {
  flight_collective c;
  c.step = step;
  c.collective = static_cast<std::int64_t>(step % 1000);
  c.op = flight_op::all_reduce;
  c.group = flight_group::replicas;
  c.participants = 8;
  c.replica = replica;
  c.bytes = step * 7 + static_cast<std::uint64_t>(replica);  // a function of both: a torn entry shows
  c.has_dtype = true;
  c.dtype = base::scalar_type::f64;
  return c;
}

// A fresh directory under the temporary one, removed at the end.
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    path = std::filesystem::temp_directory_path() /
           ("troupe_fr_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("flight recorder: the ring keeps the last entries, oldest first, after wrapping") {
  FlightRecorder fr(16, "");
  for (std::uint64_t i = 0; i < 40; ++i) {
    const auto t = fr.begin(numbered(i, 0));
    CHECK(t == i);
    if (i % 2 == 0) fr.end(t, true);
  }
  CHECK(fr.recorded() == 40);
  const std::vector<flight_entry> kept = fr.entries();
  REQUIRE(kept.size() == 16);
  for (std::size_t k = 0; k < kept.size(); ++k) {
    const flight_entry& e = kept[k];
    CHECK(e.id == 24 + k);
    CHECK(e.step == 24 + k);
    CHECK(e.bytes == (24 + k) * 7);
    CHECK(e.op == flight_op::all_reduce);
    CHECK(e.dtype == base::scalar_type::f64);
    CHECK(e.participants == 8);
    CHECK(e.state == (e.id % 2 == 0 ? flight_state::done : flight_state::running));
    CHECK((e.end_ns > 0) == (e.id % 2 == 0));
    CHECK(e.start_ns >= e.enqueue_ns);
  }
  // An update of an entry the ring has moved past is dropped, not written over its successor.
  fr.end(3, false, 5);
  CHECK(fr.entries().front().id == 24);
  CHECK(fr.entries()[3].state == flight_state::running);  // id 27, untouched

  const auto dump = nlohmann::json::parse(fr.json("test"));
  CHECK(dump["format"] == "troupe-flight-recorder");
  CHECK(dump["version"] == 1);
  CHECK(dump["reason"] == "test");
  CHECK(dump["capacity"] == 16);
  CHECK(dump["recorded"] == 40);
  REQUIRE(dump["entries"].size() == 16);
  CHECK(dump["entries"][0]["id"] == 24);
  CHECK(dump["entries"][0]["dtype"] == "float64");
  CHECK(dump["entries"][0]["op"] == "all_reduce");
  CHECK(dump["entries"][0]["group"] == "replicas");
  CHECK(dump["entries"][0]["state"] == "done");
  CHECK(dump["entries"][1]["end_ns"].is_null());
  CHECK(dump["entries"][1]["peer"].is_null());
}

// The process's resident anonymous memory (RssAnon of /proc/self/status), in bytes: what a leak or
// a growing buffer adds to. (The whole RSS also counts file pages of the binary and its libraries,
// which the kernel maps in over time however little the process allocates.)
static std::int64_t resident_anonymous_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssAnon:", 0) != 0) continue;
    const auto digits = line.find_first_of("0123456789");
    const auto kb = base::parse_int(line.substr(digits, line.find(' ', digits) - digits));
    return kb ? *kb * 1024 : -1;
  }
  return -1;
}

TEST_CASE("flight recorder: 2000 entries wrap over 100k steps without growing the resident memory") {
  FlightRecorder fr(2000, "");
  auto step = [&](std::uint64_t i) {
    flight_collective s;
    s.step = i;
    s.op = flight_op::step;
    const auto t = fr.begin(s);
    const auto c = fr.begin(numbered(i, 0));
    fr.end(c, true);
    fr.end(t, true);
  };
  for (std::uint64_t i = 0; i < 4000; ++i) step(i);  // every slot written once: its pages are in
  const std::int64_t before = resident_anonymous_bytes();
  REQUIRE(before > 0);
  for (std::uint64_t i = 4000; i < 104'000; ++i) step(i);
  const std::int64_t after = resident_anonymous_bytes();
  CHECK(fr.recorded() == 208'000);
  const auto kept = fr.entries();
  REQUIRE(kept.size() == 2000);
  CHECK(kept.front().id == 206'000);
  CHECK(kept.back().step == 103'999);
  // The recorder allocates nothing after its slots; 64 KiB allows for the allocator's noise
  // (a recorder that kept every entry would add 100k x its slot's bytes).
  CHECK(after - before <= 64 * 1024);
}

TEST_CASE("flight recorder: a queued entry starts, then fails naming its peer") {
  FlightRecorder fr(16, "");
  const CallSiteLabel label("a label longer than thirty-one bytes is cut");
  const auto t = fr.enqueue(numbered(5, 1));
  flight_entry e = fr.entries().at(0);
  CHECK(e.state == flight_state::queued);
  CHECK(e.start_ns == 0);
  CHECK(std::string(e.label) == "a label longer than thirty-one ");
  fr.start(t);
  e = fr.entries().at(0);
  CHECK(e.state == flight_state::running);
  CHECK(e.start_ns >= e.enqueue_ns);
  fr.end(t, false, 3);
  e = fr.entries().at(0);
  CHECK(e.state == flight_state::failed);
  CHECK(e.peer == 3);
  CHECK(e.end_ns >= e.start_ns);
  CHECK(fr.failures() == 1);
}

TEST_CASE("flight recorder: concurrent writers lose nothing, and a racing reader sees no torn entry") {
  static constexpr int writers = 4;
  static constexpr std::uint64_t per_writer = 20000;
  static const char* const labels[writers] = {"writer-0", "writer-1", "writer-2", "writer-3"};
  auto check_whole = [](const flight_entry& e) {
    // Every field of an entry came from one record() call: the same writer, the same step.
    REQUIRE(e.replica >= 0);
    REQUIRE(e.replica < writers);
    CHECK(e.bytes == e.step * 7 + static_cast<std::uint64_t>(e.replica));
    CHECK(e.collective == static_cast<std::int64_t>(e.step % 1000));
    CHECK(std::string(e.label) == labels[e.replica]);
    CHECK(e.participants == 8);
    CHECK(e.state == flight_state::done);
  };
  SUBCASE("a ring large enough for everything") {
    FlightRecorder fr(writers * per_writer, "");
    std::vector<std::thread> threads;
    for (int w = 0; w < writers; ++w) {
      threads.emplace_back([&fr, w] {
        const CallSiteLabel label(labels[w]);
        for (std::uint64_t i = 0; i < per_writer; ++i) fr.end(fr.begin(numbered(i, w)), true);
      });
    }
    for (auto& t : threads) t.join();
    const auto kept = fr.entries();
    REQUIRE(kept.size() == writers * per_writer);
    std::vector<std::set<std::uint64_t>> seen(writers);
    for (std::size_t k = 0; k < kept.size(); ++k) {
      CHECK(kept[k].id == k);
      check_whole(kept[k]);
      seen[static_cast<std::size_t>(kept[k].replica)].insert(kept[k].step);
    }
    for (const auto& s : seen) CHECK(s.size() == per_writer);
  }
  SUBCASE("a small ring read while it is written") {
    FlightRecorder fr(64, "");
    std::atomic<bool> writing{true};
    std::atomic<std::uint64_t> read_entries{0};
    std::atomic<bool> reading{false};
    std::thread reader([&] {
      reading = true;
      while (writing.load()) {
        const auto kept = fr.entries();
        std::uint64_t last = 0;
        for (std::size_t k = 0; k < kept.size(); ++k) {
          if (k > 0) CHECK(kept[k].id > last);
          last = kept[k].id;
          if (kept[k].state == flight_state::done) check_whole(kept[k]);
          CHECK(kept[k].bytes == kept[k].step * 7 + static_cast<std::uint64_t>(kept[k].replica));
        }
        read_entries += kept.size();
      }
    });
    std::vector<std::thread> threads;
    for (int w = 0; w < writers; ++w) {
      // The writers start once the reader runs, and end once it has read entries, however a
      // loaded machine schedules the threads.
      threads.emplace_back([&fr, &reading, &read_entries, w] {
        while (!reading.load()) std::this_thread::yield();
        const CallSiteLabel label(labels[w]);
        for (std::uint64_t i = 0; i < per_writer; ++i) fr.end(fr.begin(numbered(i, w)), true);
        while (read_entries.load() == 0) std::this_thread::yield();
      });
    }
    for (auto& t : threads) t.join();
    writing = false;
    reader.join();
    CHECK(read_entries.load() > 0);
    CHECK(fr.recorded() == writers * per_writer);
    const auto kept = fr.entries();
    CHECK(kept.size() == 64);
    for (const auto& e : kept) check_whole(e);
  }
}

TEST_CASE("flight recorder: a strategy records its steps and collectives with the caller's label") {
  RuntimeOptions o;
  o.flight_recorder_entries = 256;
  Runtime rt(o);
  MirroredStrategy s(rt, cpus(2));
  {
    const CallSiteLabel label("my-loop");
    for (int step = 0; step < 3; ++step) {
      s.run([] {
        auto* ctx = get_replica_context();
        ctx->all_reduce(ReduceOp::sum, Tensor::full({4}, 1.0f));
        ctx->all_gather(Tensor::full({2, 3}, 2.0f), 0);
      });
    }
  }
  const auto dump = nlohmann::json::parse(flight_recorder_json("test"));
  CHECK(dump["rank"] == 0);
  CHECK(dump["world"] == 1);
  CHECK(dump["capacity"] == 256);
  int steps = 0, reduces = 0, gathers = 0;
  std::uint64_t last_step = 0;
  for (const auto& e : dump["entries"]) {
    CHECK(e["label"] == "my-loop");
    CHECK(e["state"] == "done");
    CHECK(e["end_ns"].get<std::int64_t>() >= e["start_ns"].get<std::int64_t>());
    if (e["op"] == "step") {
      ++steps;
      CHECK(e["step"].get<std::uint64_t>() == last_step + 1);
      last_step = e["step"].get<std::uint64_t>();
      CHECK(e["collective"].is_null());
      continue;
    }
    CHECK(e["step"] == last_step);
    CHECK(e["group"] == "replicas");
    CHECK(e["participants"] == 2);
    CHECK(e["dtype"] == "float32");
    if (e["op"] == "all_reduce") {
      ++reduces;
      CHECK(e["collective"] == 0);
      CHECK(e["bytes"] == 16);
    } else {
      CHECK(e["op"] == "all_gather");
      ++gathers;
      CHECK(e["collective"] == 1);
      CHECK(e["bytes"] == 24);
    }
  }
  CHECK(steps == 3);
  CHECK(reduces == 6);  // one per replica and step
  CHECK(gathers == 6);
}

TEST_CASE("flight recorder: a collective that fails writes the dump, which shows the failure") {
  temp_dir dir;
  RuntimeOptions o;
  o.flight_recorder_entries = 64;
  o.flight_recorder_dir = dir.path.string();
  Runtime rt(o);
  MirroredStrategy s(rt, cpus(2));
  s.run([] { get_replica_context()->all_reduce(ReduceOp::sum, Tensor::full({4}, 1.0f)); });
  const std::string message = message_of([&] {
    s.run([] {
      auto* ctx = get_replica_context();
      if (ctx->replica_id_in_sync_group() == 1) throw std::runtime_error("replica 1 gives up");
      ctx->all_reduce(ReduceOp::sum, Tensor::full({4}, 1.0f));
    });
  });
  CHECK(contains(message, "replica 1 gives up"));
  const auto file = dir.path / ("flight_recorder.pid" + std::to_string(::getpid()) + ".json");
  CHECK(contains(message, "(flight recorder: " + file.string() + ")"));
  REQUIRE(std::filesystem::exists(file));
  const auto dump = read_json(file);
  CHECK(contains(dump["reason"].get<std::string>(), "step 2 failed in a collective"));
  bool failed_reduce = false, failed_step = false;
  for (const auto& e : dump["entries"]) {
    if (e["step"] != 2) {
      CHECK(e["state"] == "done");
      continue;
    }
    if (e["op"] == "all_reduce" && e["state"] == "failed") failed_reduce = e["replica"] == 0;
    if (e["op"] == "step") failed_step = e["state"] == "failed";
  }
  CHECK(failed_reduce);
  CHECK(failed_step);
}

TEST_CASE("flight recorder: SIGUSR1 writes a dump from a thread of its own") {
  temp_dir dir;
  RuntimeOptions o;
  o.flight_recorder_entries = 64;
  o.flight_recorder_dir = dir.path.string();
  Runtime rt(o);
  MirroredStrategy s(rt, cpus(2));
  s.run([] { get_replica_context()->all_reduce(ReduceOp::sum, Tensor::full({4}, 1.0f)); });
  const auto file = dir.path / ("flight_recorder.pid" + std::to_string(::getpid()) + ".json");
  REQUIRE(!std::filesystem::exists(file));
  REQUIRE(std::raise(SIGUSR1) == 0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!std::filesystem::exists(file) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(std::filesystem::exists(file));
  const auto dump = read_json(file);
  CHECK(dump["reason"] == "SIGUSR1");
  CHECK(dump["entries"].size() == 3);  // the step and its two replicas' all-reduces
  // The step goes on after the dump.
  s.run([] { get_replica_context()->all_reduce(ReduceOp::sum, Tensor::full({4}, 1.0f)); });
  CHECK(nlohmann::json::parse(flight_recorder_json())["entries"].size() == 6);
}

TEST_CASE("flight recorder: settings are checked, and 0 turns it off") {
  RuntimeOptions o;
  o.flight_recorder_entries = 5;
  CHECK(contains(message_of([&] { Runtime rt(o); }), "flight_recorder_entries is 5"));
  o.flight_recorder_entries = -1;
  o.flight_recorder_dump_at_exit = 2;
  CHECK(contains(message_of([&] { Runtime rt(o); }), "flight_recorder_dump_at_exit is 2"));
  {
    troupe::testing::scoped_env env("TROUPE_FLIGHT_RECORDER_ENTRIES", "lots");
    const std::string m = message_of([] { RuntimeOptions::from_environment(); });
    CHECK(contains(m, "TROUPE_FLIGHT_RECORDER_ENTRIES="));
    CHECK(contains(m, "lots"));
  }
  {
    troupe::testing::scoped_env env("TROUPE_FLIGHT_RECORDER_ENTRIES", "8");
    CHECK(contains(message_of([] { RuntimeOptions::from_environment(); }), "TROUPE_FLIGHT_RECORDER_ENTRIES=8"));
  }
  {
    troupe::testing::scoped_env env("TROUPE_FLIGHT_RECORDER_DUMP_AT_EXIT", "yes");
    CHECK(contains(message_of([] { RuntimeOptions::from_environment(); }), "TROUPE_FLIGHT_RECORDER_DUMP_AT_EXIT"));
  }
  RuntimeOptions off;
  off.flight_recorder_entries = 0;
  Runtime rt(off);
  CHECK(FlightRecorder::process() == nullptr);
  CHECK(contains(message_of([] { flight_recorder_json(); }), "none in this process"));
}

TEST_CASE("flight recorder: the last Runtime writes a dump at exit when asked") {
  temp_dir dir;
  {
    RuntimeOptions o;
    o.flight_recorder_entries = 32;
    o.flight_recorder_dir = dir.path.string();
    o.flight_recorder_dump_at_exit = 1;
    Runtime rt(o);
    MirroredStrategy s(rt, cpus(2));
    s.run([] { get_replica_context()->all_reduce(ReduceOp::sum, Tensor::full({4}, 1.0f)); });
  }
  const auto file = dir.path / ("flight_recorder.pid" + std::to_string(::getpid()) + ".json");
  REQUIRE(std::filesystem::exists(file));
  const auto dump = read_json(file);
  CHECK(dump["reason"] == "exit");
  CHECK(dump["entries"].size() == 3);
}

}  // namespace TROUPE_TEST_FILE
