#include "doctor/doctor.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

namespace troupe::doctor {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

[[noreturn]] void bad(const std::string& file, const std::string& field, const std::string& what) {
  throw dump_error(file + ": " + field + ": " + what);
}

const json& field(const json& object, const char* name, const std::string& file, const std::string& where) {
  const auto it = object.find(name);
  if (it == object.end()) bad(file, where + name, "missing");
  return *it;
}

std::int64_t get_int(const json& object, const char* name, const std::string& file, const std::string& where,
                     std::int64_t min, std::int64_t max, bool nullable = false, std::int64_t null_value = -1) {
  const json& v = field(object, name, file, where);
  if (nullable && v.is_null()) return null_value;
  if (!v.is_number_integer()) {
    bad(file, where + name, std::string("expected an integer") + (nullable ? " or null" : "") + ", got " + v.type_name());
  }
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(max)) {
    bad(file, where + name, std::to_string(v.get<std::uint64_t>()) + " is outside " + std::to_string(min) + ".." +
                                std::to_string(max));
  }
  const auto x = v.get<std::int64_t>();
  if (x < min || x > max) {
    bad(file, where + name, std::to_string(x) + " is outside " + std::to_string(min) + ".." + std::to_string(max));
  }
  return x;
}

std::string get_string(const json& object, const char* name, const std::string& file, const std::string& where,
                       bool nullable = false) {
  const json& v = field(object, name, file, where);
  if (nullable && v.is_null()) return {};
  if (!v.is_string()) {
    bad(file, where + name, std::string("expected a string") + (nullable ? " or null" : "") + ", got " + v.type_name());
  }
  return v.get<std::string>();
}

void one_of(const std::string& value, std::initializer_list<const char*> allowed, const std::string& file,
            const std::string& field_name) {
  for (const char* a : allowed) {
    if (value == a) return;
  }
  std::string list;
  for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
  bad(file, field_name, "\"" + value.substr(0, 64) + "\" is not one of " + list);
}

constexpr std::int64_t max_i64 = INT64_MAX;

std::string ms(std::int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(ns) / 1e6);
  return buf;
}

std::string list_ranks(const std::vector<std::int64_t>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

using key = std::pair<std::uint64_t, std::int64_t>;  // (step, collective)

std::string name_of(const entry& e) {
  return "step " + std::to_string(e.step) + " " + e.op + " #" + std::to_string(e.collective);
}

std::string shape_of(const entry& e) {
  return e.op + " " + (e.dtype.empty() ? "(no dtype)" : e.dtype) + " " + std::to_string(e.bytes) + " B";
}

}  // namespace

dump parse_dump(const std::string& text, const std::string& file) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    bad(file, "the file", std::string("not valid JSON (truncated or damaged?): ") + e.what());
  }
  if (!j.is_object()) bad(file, "the file", std::string("expected a JSON object, got ") + j.type_name());
  dump d;
  d.file = file;
  const std::string format = get_string(j, "format", file, "");
  if (format != "troupe-flight-recorder") {
    bad(file, "format", "\"" + format.substr(0, 64) + "\" (expected \"troupe-flight-recorder\")");
  }
  const std::int64_t version = get_int(j, "version", file, "", 0, max_i64);
  if (version != 1) bad(file, "version", std::to_string(version) + " (this troupe-doctor reads version 1)");
  d.world = get_int(j, "world", file, "", 1, 1 << 20);
  d.rank = get_int(j, "rank", file, "", 0, d.world - 1);
  d.task = get_string(j, "task", file, "");
  d.pid = get_int(j, "pid", file, "", 0, max_i64);
  d.reason = get_string(j, "reason", file, "");
  d.dumped_at_ns = get_int(j, "dumped_at_ns", file, "", 0, max_i64);
  d.capacity = static_cast<std::uint64_t>(get_int(j, "capacity", file, "", 1, 10'000'000));
  d.recorded = static_cast<std::uint64_t>(get_int(j, "recorded", file, "", 0, max_i64));
  const json& entries = field(j, "entries", file, "");
  if (!entries.is_array()) bad(file, "entries", std::string("expected an array, got ") + entries.type_name());
  if (entries.size() > d.capacity || entries.size() > d.recorded) {
    bad(file, "entries", std::to_string(entries.size()) + " entries, more than capacity " +
                             std::to_string(d.capacity) + " or recorded " + std::to_string(d.recorded));
  }
  d.entries.reserve(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const json& x = entries[i];
    const std::string where = "entries[" + std::to_string(i) + "].";
    if (!x.is_object()) bad(file, "entries[" + std::to_string(i) + "]", std::string("expected an object, got ") + x.type_name());
    entry e;
    e.id = static_cast<std::uint64_t>(get_int(x, "id", file, where, 0, max_i64));
    e.step = static_cast<std::uint64_t>(get_int(x, "step", file, where, 0, max_i64));
    e.collective = get_int(x, "collective", file, where, 0, max_i64, true, -1);
    e.op = get_string(x, "op", file, where);
    one_of(e.op, {"step", "all_reduce", "all_gather", "merge_call", "broadcast", "bucket_all_reduce", "membership"}, file,
           where + "op");
    e.dtype = get_string(x, "dtype", file, where, true);
    if (!e.dtype.empty()) {
      one_of(e.dtype, {"float32", "float64", "int32", "int64", "float16", "bfloat16"}, file, where + "dtype");
    }
    e.bytes = static_cast<std::uint64_t>(get_int(x, "bytes", file, where, 0, max_i64));
    e.group = get_string(x, "group", file, where);
    one_of(e.group, {"replicas", "workers", "nccl"}, file, where + "group");
    e.participants = get_int(x, "participants", file, where, 0, 65535);
    (void)get_int(x, "replica", file, where, 0, 65535, true, -1);
    e.state = get_string(x, "state", file, where);
    one_of(e.state, {"queued", "running", "done", "failed"}, file, where + "state");
    e.enqueue_ns = get_int(x, "enqueue_ns", file, where, 0, max_i64);
    e.start_ns = get_int(x, "start_ns", file, where, 0, max_i64, true, 0);
    e.end_ns = get_int(x, "end_ns", file, where, 0, max_i64, true, 0);
    e.peer = get_int(x, "peer", file, where, 0, 1 << 20, true, -1);
    e.label = get_string(x, "label", file, where);
    const bool step_like = e.op == "step" || e.op == "membership";
    if (step_like != (e.collective < 0)) {
      bad(file, where + "collective", step_like ? "a step's entry has a collective number"
                                                     : "a collective's entry has no collective number");
    }
    if (i > 0 && e.id <= d.entries.back().id) {
      bad(file, where + "id", std::to_string(e.id) + " after " + std::to_string(d.entries.back().id) +
                                  " (expected increasing ids)");
    }
    d.entries.push_back(std::move(e));
  }
  return d;
}

std::vector<dump> read_dumps(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw dump_error(dir + ": not a directory");
  std::vector<fs::path> files;
  for (const auto& item : fs::directory_iterator(dir, ec)) {
    const std::string name = item.path().filename().string();
    if (name.rfind("flight_recorder.", 0) == 0 && name.size() > 5 && name.substr(name.size() - 5) == ".json") {
      files.push_back(item.path());
    }
  }
  if (ec) throw dump_error(dir + ": cannot list: " + ec.message());
  if (files.empty()) {
    throw dump_error(dir + ": no flight recorder dump (flight_recorder.rank<R>.json) here: set "
                           "TROUPE_FLIGHT_RECORDER_DIR to this directory on every worker");
  }
  std::sort(files.begin(), files.end());
  std::vector<dump> out;
  for (const fs::path& p : files) {
    const auto size = fs::file_size(p, ec);
    if (ec) throw dump_error(p.string() + ": cannot read: " + ec.message());
    if (size > max_dump_bytes) {
      throw dump_error(p.string() + ": the file: " + std::to_string(size) + " bytes, more than a dump can be");
    }
    std::ifstream in(p, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in && !in.eof()) throw dump_error(p.string() + ": cannot read");
    out.push_back(parse_dump(text.str(), p.string()));
  }
  return out;
}

diagnosis diagnose(const std::vector<dump>& dumps_in, std::size_t table_steps) {
  diagnosis d;
  std::ostringstream out;
  if (dumps_in.empty()) throw dump_error("no dumps to compare");
  std::vector<const dump*> by_rank;
  const std::int64_t world = dumps_in.front().world;
  by_rank.assign(static_cast<std::size_t>(world), nullptr);
  for (const dump& x : dumps_in) {
    if (x.world != world) {
      throw dump_error(x.file + ": world: " + std::to_string(x.world) + ", but " + dumps_in.front().file + " says " +
                       std::to_string(world) + " (dumps of different clusters in one directory?)");
    }
    auto& slot = by_rank[static_cast<std::size_t>(x.rank)];
    if (slot != nullptr) {
      throw dump_error(x.file + ": rank: " + std::to_string(x.rank) + " again (" + slot->file + " has it too)");
    }
    slot = &x;
  }
  auto fault = [&](const std::string& line) {
    d.fault = true;
    d.faults.push_back(line);
    out << "fault: " << line << "\n";
  };
  out << dumps_in.size() << (dumps_in.size() == 1 ? " dump" : " dumps") << " of a cluster of " << world
      << (world == 1 ? " worker" : " workers") << "\n";
  std::vector<std::int64_t> missing;
  for (std::int64_t r = 0; r < world; ++r) {
    const dump* x = by_rank[static_cast<std::size_t>(r)];
    if (x == nullptr) {
      missing.push_back(r);
      continue;
    }
    out << "  rank " << r << " " << (x->task.empty() ? "(one process)" : x->task) << ": " << x->entries.size()
        << " entries of " << x->recorded << ", dumped for: " << x->reason.substr(0, 200) << "\n";
  }
  // Each rank's collectives across workers, by (step, collective).
  std::vector<std::map<key, const entry*>> ring(static_cast<std::size_t>(world));
  std::vector<key> first(static_cast<std::size_t>(world), key{0, 0});
  std::vector<bool> wrapped(static_cast<std::size_t>(world), false);
  std::set<key> all;
  for (std::int64_t r = 0; r < world; ++r) {
    const dump* x = by_rank[static_cast<std::size_t>(r)];
    if (x == nullptr) continue;
    for (const entry& e : x->entries) {
      if (e.group != "workers" || e.op == "membership") continue;
      ring[static_cast<std::size_t>(r)][{e.step, e.collective}] = &e;
      all.insert({e.step, e.collective});
    }
    auto& mine = ring[static_cast<std::size_t>(r)];
    wrapped[static_cast<std::size_t>(r)] = x->recorded > x->entries.size();
    if (!mine.empty()) first[static_cast<std::size_t>(r)] = mine.begin()->first;
  }
  if (!missing.empty()) {
    fault("no dump from " + list_ranks(missing) +
          " (it died before writing one, or wrote it elsewhere: every worker needs the same "
          "TROUPE_FLIGHT_RECORDER_DIR)");
  }
  // The first collective where the ranks part.
  for (const key& k : all) {
    std::vector<std::int64_t> in, out_ranks;
    for (std::int64_t r = 0; r < world; ++r) {
      if (by_rank[static_cast<std::size_t>(r)] == nullptr) continue;
      const auto& mine = ring[static_cast<std::size_t>(r)];
      if (mine.count(k)) {
        in.push_back(r);
      } else if (!(wrapped[static_cast<std::size_t>(r)] && k < first[static_cast<std::size_t>(r)])) {
        out_ranks.push_back(r);  // its record covers this collective, and it is not there
      }
    }
    if (in.empty()) continue;
    const entry& sample = *ring[static_cast<std::size_t>(in.front())].at(k);
    // Do the ranks that entered it agree on what it is?
    std::map<std::tuple<std::string, std::string, std::uint64_t>, std::vector<std::int64_t>> kinds;
    for (std::int64_t r : in) {
      const entry& e = *ring[static_cast<std::size_t>(r)].at(k);
      kinds[{e.op, e.dtype, e.bytes}].push_back(r);
    }
    if (kinds.size() > 1) {
      std::string what, sides;
      std::set<std::string> ops, dtypes;
      std::set<std::uint64_t> sizes;
      std::vector<std::vector<std::int64_t>> by_side;  // each side's ranks, the side of rank 0 first
      for (const auto& [kind, ranks] : kinds) {
        ops.insert(std::get<0>(kind));
        dtypes.insert(std::get<1>(kind));
        sizes.insert(std::get<2>(kind));
        by_side.push_back(ranks);
      }
      std::sort(by_side.begin(), by_side.end());
      for (const auto& ranks : by_side) {
        const entry& e = *ring[static_cast<std::size_t>(ranks.front())].at(k);
        sides += (sides.empty() ? "" : "; ") + shape_of(e) + " on " + list_ranks(ranks);
      }
      if (ops.size() > 1) what += "op";
      if (dtypes.size() > 1) what += std::string(what.empty() ? "" : ", ") + "dtype";
      if (sizes.size() > 1) what += std::string(what.empty() ? "" : ", ") + "bytes";
      fault("the workers disagree in step " + std::to_string(k.first) + " collective #" + std::to_string(k.second) +
            " (" + what + "): " + sides);
      break;
    }
    if (!out_ranks.empty()) {
      for (std::int64_t r : out_ranks) {
        const auto& mine = ring[static_cast<std::size_t>(r)];
        const auto later = mine.upper_bound(k);
        std::string where;
        if (mine.empty()) {
          where = "it recorded no collective across workers";
        } else if (later != mine.end()) {
          where = "it went on to " + name_of(*later->second) + " (" + later->second->state +
                  "): the order of collectives differs";
        } else {
          const entry& last = *mine.rbegin()->second;
          where = "its last was " + name_of(last) + " (" + last.state + ")";
          // Where the rank stands beyond its collectives: its last step entry.
          const dump& x = *by_rank[static_cast<std::size_t>(r)];
          for (auto it = x.entries.rbegin(); it != x.entries.rend(); ++it) {
            if (it->op == "step") {
              where += "; its last step entry is step " + std::to_string(it->step) + " (" + it->state + ")";
              break;
            }
          }
        }
        fault("rank " + std::to_string(r) + " never entered " + name_of(sample) + " (" + shape_of(sample) +
              "), in which " + list_ranks(in) + (in.size() == 1 ? " waits" : " wait") + "; " + where);
      }
      break;
    }
  }
  // Collectives that failed, each rank's last.
  for (std::int64_t r = 0; r < world; ++r) {
    if (by_rank[static_cast<std::size_t>(r)] == nullptr) continue;
    const auto& mine = ring[static_cast<std::size_t>(r)];
    for (auto it = mine.rbegin(); it != mine.rend(); ++it) {
      const entry& e = *it->second;
      if (e.state != "failed" && e.state != "running") continue;
      const std::string peer = e.peer >= 0 ? ", waiting on rank " + std::to_string(e.peer) : "";
      const std::string line = "rank " + std::to_string(r) + "'s " + name_of(e) + " " + e.state + peer;
      if (e.state == "failed") {
        fault(line);
      } else {
        out << "note: " << line << " when the dump was written\n";
      }
      break;
    }
  }
  // The slowest rank of each step: the last to enter its collectives, by how much in all.
  std::map<std::uint64_t, std::vector<std::int64_t>> late;  // step -> per rank, ns
  std::map<std::uint64_t, int> collectives;
  for (const key& k : all) {
    std::int64_t earliest = max_i64;
    bool every = true;
    for (std::int64_t r = 0; r < world && every; ++r) {
      const auto& mine = ring[static_cast<std::size_t>(r)];
      const auto it = mine.find(k);
      every = by_rank[static_cast<std::size_t>(r)] != nullptr && it != mine.end() && it->second->start_ns > 0;
      if (every) earliest = std::min(earliest, it->second->start_ns);
    }
    if (!every) continue;
    auto& row = late[k.first];
    row.resize(static_cast<std::size_t>(world), 0);
    ++collectives[k.first];
    for (std::int64_t r = 0; r < world; ++r) {
      row[static_cast<std::size_t>(r)] += ring[static_cast<std::size_t>(r)].at(k)->start_ns - earliest;
    }
  }
  if (!late.empty() && world > 1) {
    out << "slowest rank per step (the last to enter the step's collectives; late: by how much, in all):\n";
    out << "  step        collectives  slowest  late_ms\n";
    std::vector<int> slowest_count(static_cast<std::size_t>(world), 0);
    std::size_t shown = 0;
    const std::size_t skip = late.size() > table_steps ? late.size() - table_steps : 0;
    for (const auto& [step, row] : late) {
      const auto slowest = static_cast<std::int64_t>(std::max_element(row.begin(), row.end()) - row.begin());
      ++slowest_count[static_cast<std::size_t>(slowest)];
      if (shown++ < skip) continue;
      char buf[128];
      std::snprintf(buf, sizeof buf, "  %-10llu  %11d  %7lld  %7s\n", static_cast<unsigned long long>(step),
                    collectives[step], static_cast<long long>(slowest),
                    ms(row[static_cast<std::size_t>(slowest)]).c_str());
      out << buf;
    }
    if (skip > 0) out << "  (" << skip << " earlier steps not shown)\n";
    for (std::int64_t r = 0; r < world; ++r) {
      out << "  rank " << r << " was the slowest in " << slowest_count[static_cast<std::size_t>(r)] << " of "
          << late.size() << " steps\n";
    }
  }
  if (!d.fault) out << "no fault found: the ranks agree on every collective they recorded\n";
  d.text = out.str();
  return d;
}

}  // namespace troupe::doctor
