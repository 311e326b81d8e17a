// troupe-doctor's reading of flight recorder dumps: made-up dumps of two or three ranks, each
// fault it must name, and the malformed or truncated files it must refuse naming the field.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "doctor/doctor.hpp"

using namespace troupe::doctor;
using nlohmann::ordered_json;

namespace {

struct made_entry {
  std::uint64_t step;
  std::int64_t collective;  // -1: a step
  std::string op = "all_reduce";
  std::string dtype = "float32";
  std::uint64_t bytes = 16;
  std::string state = "done";
  std::int64_t start_ns = 1000;
  std::int64_t peer = -1;
};

ordered_json make_dump(int rank, int world, const std::vector<made_entry>& entries) {
  ordered_json d;
  d["format"] = "troupe-flight-recorder";
  d["version"] = 1;
  d["rank"] = rank;
  d["world"] = world;
  d["task"] = "/job:worker/replica:0/task:" + std::to_string(rank);
  d["pid"] = 100 + rank;
  d["reason"] = "SIGUSR1";
  d["dumped_at_ns"] = 2000000000;
  d["capacity"] = 2000;
  d["recorded"] = entries.size();
  ordered_json list = ordered_json::array();
  std::uint64_t id = 0;
  for (const auto& m : entries) {
    ordered_json e;
    e["id"] = id++;
    e["step"] = m.step;
    e["collective"] = m.collective >= 0 ? ordered_json(m.collective) : ordered_json(nullptr);
    e["op"] = m.collective >= 0 ? m.op : "step";
    e["dtype"] = m.collective >= 0 ? ordered_json(m.dtype) : ordered_json(nullptr);
    e["bytes"] = m.collective >= 0 ? m.bytes : 0;
    e["group"] = m.collective >= 0 ? "workers" : "replicas";
    e["participants"] = world;
    e["replica"] = nullptr;
    e["state"] = m.state;
    e["enqueue_ns"] = m.start_ns;
    e["start_ns"] = m.start_ns;
    e["end_ns"] = m.state == "running" ? ordered_json(nullptr) : ordered_json(m.start_ns + 10);
    e["peer"] = m.peer >= 0 ? ordered_json(m.peer) : ordered_json(nullptr);
    e["label"] = "";
    list.push_back(e);
  }
  d["entries"] = list;
  return d;
}

dump parsed(const ordered_json& j, const std::string& file = "dump.json") { return parse_dump(j.dump(), file); }

// Two steps of two all-reduces each, the same on every rank; `late` ranks enter later.
std::vector<made_entry> healthy(std::int64_t late_ns = 0) {
  std::vector<made_entry> out;
  for (std::uint64_t step = 1; step <= 2; ++step) {
    out.push_back({step, -1});
    out.push_back({step, 0, "all_reduce", "float32", 16, "done", static_cast<std::int64_t>(step) * 1000000 + late_ns});
    out.push_back({step, 1, "all_reduce", "float32", 16, "done", static_cast<std::int64_t>(step) * 1000000 + 500 + late_ns});
  }
  return out;
}

std::string error_of(const std::string& text) {
  try {
    parse_dump(text, "flight_recorder.rank1.json");
  } catch (const dump_error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("troupe-doctor: ranks that agree are no fault, and the slowest rank of each step is named") {
  const auto d = diagnose({parsed(make_dump(0, 2, healthy())), parsed(make_dump(1, 2, healthy(3'000'000)))});
  CHECK_FALSE(d.fault);
  CHECK(d.text.find("no fault found") != std::string::npos);
  CHECK(d.text.find("rank 1 was the slowest in 2 of 2 steps") != std::string::npos);
  CHECK(d.text.find("  1                     2        1      6.0\n") != std::string::npos);
}

TEST_CASE("troupe-doctor: an elastic change's membership entry is read, and is no collective of the ring") {
  // Rank 0 recorded a change of members (failed: it fell back) after step 2; rank 1 did not.
  ordered_json zero = make_dump(0, 2, healthy());
  ordered_json change = zero["entries"].back();
  change["id"] = zero["entries"].size();
  change["step"] = 2;
  change["collective"] = nullptr;
  change["op"] = "membership";
  change["dtype"] = nullptr;
  change["bytes"] = 0;
  change["group"] = "workers";
  change["state"] = "failed";
  change["label"] = "elastic:worker_left";
  zero["entries"].push_back(change);
  zero["recorded"] = zero["entries"].size();
  const dump read = parsed(zero);
  REQUIRE(read.entries.size() == 7);
  CHECK(read.entries.back().op == "membership");
  CHECK(read.entries.back().collective == -1);
  const auto d = diagnose({read, parsed(make_dump(1, 2, healthy()))});
  CHECK_FALSE(d.fault);
  // With a collective number it is malformed, as a step's entry would be.
  change["collective"] = 3;
  zero["entries"].back() = change;
  CHECK_THROWS_AS(parsed(zero), dump_error);
}

TEST_CASE("troupe-doctor: a collective of another dtype is named with the ranks on each side") {
  auto other = healthy();
  other[5].dtype = "float64";  // step 2 collective #1
  other[5].bytes = 32;
  const auto d = diagnose({parsed(make_dump(0, 3, healthy())), parsed(make_dump(1, 3, other)),
                           parsed(make_dump(2, 3, healthy()))});
  CHECK(d.fault);
  REQUIRE(!d.faults.empty());
  CHECK(d.faults[0] == "the workers disagree in step 2 collective #1 (dtype, bytes): all_reduce float32 16 B on "
                       "ranks 0, 2; all_reduce float64 32 B on rank 1");
}

TEST_CASE("troupe-doctor: a rank that skipped a collective and went on is named, with where it went") {
  auto skipped = healthy();
  skipped.erase(skipped.begin() + 5);  // no step 2 collective #1
  skipped.push_back({3, -1, "step", "", 0, "failed"});
  skipped.push_back({3, 0, "all_reduce", "float32", 16, "failed", 3000000, 0});
  auto waiting = healthy();
  waiting[5].state = "failed";
  waiting[5].peer = 1;
  const auto d = diagnose({parsed(make_dump(0, 2, waiting)), parsed(make_dump(1, 2, skipped))});
  CHECK(d.fault);
  REQUIRE(d.faults.size() >= 1);
  CHECK(d.faults[0] == "rank 1 never entered step 2 all_reduce #1 (all_reduce float32 16 B), in which rank 0 waits; "
                       "it went on to step 3 all_reduce #0 (failed): the order of collectives differs");
  CHECK(d.text.find("fault: rank 0's step 2 all_reduce #1 failed, waiting on rank 1") != std::string::npos);
}

TEST_CASE("troupe-doctor: a rank that never reached the collective the others wait in, and a rank without a dump") {
  auto stuck = healthy();
  stuck.resize(5);  // step 2's step entry (running) and its collective #0 only
  stuck[3].state = "running";
  auto waiting = healthy();
  waiting[5].state = "running";
  const auto d = diagnose({parsed(make_dump(0, 3, waiting)), parsed(make_dump(1, 3, stuck))});
  CHECK(d.fault);
  REQUIRE(d.faults.size() >= 2);
  CHECK(d.faults[0] == "no dump from rank 2 (it died before writing one, or wrote it elsewhere: every worker needs "
                       "the same TROUPE_FLIGHT_RECORDER_DIR)");
  CHECK(d.faults[1].rfind("rank 1 never entered step 2 all_reduce #1 (all_reduce float32 16 B), in which rank 0 "
                          "waits; its last was step 2 all_reduce #0 (done)",
                          0) == 0);
}

TEST_CASE("troupe-doctor: malformed or truncated dumps are errors naming the file and the field") {
  const std::string good = make_dump(1, 2, healthy()).dump();
  CHECK(error_of(good.substr(0, good.size() / 2)).rfind("flight_recorder.rank1.json: the file: not valid JSON "
                                                        "(truncated or damaged?)",
                                                        0) == 0);
  CHECK(error_of("[1, 2]") == "flight_recorder.rank1.json: the file: expected a JSON object, got array");
  auto j = make_dump(1, 2, healthy());
  j["format"] = "something";
  CHECK(error_of(j.dump()) == "flight_recorder.rank1.json: format: \"something\" (expected \"troupe-flight-recorder\")");
  j = make_dump(1, 2, healthy());
  j["version"] = 2;
  CHECK(error_of(j.dump()) == "flight_recorder.rank1.json: version: 2 (this troupe-doctor reads version 1)");
  j = make_dump(1, 2, healthy());
  j["rank"] = 5;
  CHECK(error_of(j.dump()) == "flight_recorder.rank1.json: rank: 5 is outside 0..1");
  j = make_dump(1, 2, healthy());
  j["entries"][3].erase("bytes");
  CHECK(error_of(j.dump()) == "flight_recorder.rank1.json: entries[3].bytes: missing");
  j = make_dump(1, 2, healthy());
  j["entries"][2]["dtype"] = "float8";
  CHECK(error_of(j.dump()) == "flight_recorder.rank1.json: entries[2].dtype: \"float8\" is not one of float32, "
                              "float64, int32, int64, float16, bfloat16");
  j = make_dump(1, 2, healthy());
  j["entries"][1]["step"] = "two";
  CHECK(error_of(j.dump()) == "flight_recorder.rank1.json: entries[1].step: expected an integer, got string");
  j = make_dump(1, 2, healthy());
  j["entries"][1]["start_ns"] = -4;
  CHECK(error_of(j.dump()).rfind("flight_recorder.rank1.json: entries[1].start_ns: -4 is outside 0..", 0) == 0);
  j = make_dump(1, 2, healthy());
  j["recorded"] = 2;
  CHECK(error_of(j.dump()) == "flight_recorder.rank1.json: entries: 6 entries, more than capacity 2000 or recorded 2");
}

TEST_CASE("troupe-doctor: a directory is read whole, and two dumps of one rank are refused") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("troupe-doctor-test-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  CHECK_THROWS_WITH_AS(read_dumps(dir.string()), doctest::Contains("no flight recorder dump"), dump_error);
  std::ofstream(dir / "flight_recorder.rank0.json") << make_dump(0, 2, healthy()).dump();
  std::ofstream(dir / "flight_recorder.rank1.json") << make_dump(1, 2, healthy()).dump();
  std::ofstream(dir / "flight_recorder.rank1.json.partial") << "{";  // a writer's, ignored
  const auto dumps = read_dumps(dir.string());
  CHECK(dumps.size() == 2);
  CHECK_FALSE(diagnose(dumps).fault);
  std::ofstream(dir / "flight_recorder.pid77.json") << make_dump(1, 2, healthy()).dump();
  CHECK_THROWS_WITH_AS(diagnose(read_dumps(dir.string())), doctest::Contains("rank: 1 again"), dump_error);
  std::ofstream(dir / "flight_recorder.pid77.json") << make_dump(1, 2, healthy()).dump().substr(0, 100);
  CHECK_THROWS_WITH_AS(read_dumps(dir.string()), doctest::Contains("flight_recorder.pid77.json: the file: not valid JSON"),
                       dump_error);
  fs::remove_all(dir);
}
