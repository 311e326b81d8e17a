#include "monitor/trace_writer.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

namespace troupe::detail {

using distribute::detail::ReplicaStepRecord;

TraceWriter::TraceWriter(int worker, int first_replica, std::vector<Device> devices, std::int64_t t0_ns)
    : worker_(worker), first_replica_(first_replica), devices_(std::move(devices)), t0_ns_(t0_ns) {}

std::string TraceWriter::path_for(const std::string& base) const {
  return worker_ == 0 ? base : base + ".worker-" + std::to_string(worker_);
}

void TraceWriter::start(std::int64_t first, std::int64_t last, const std::string& base) {
  path_ = path_for(base);
  first_ = first;
  last_ = last;
  events_.clear();
}

void TraceWriter::record(std::int64_t step, std::int64_t previous_ns, std::int64_t boundary_ns,
                         std::int64_t input_start_ns, std::int64_t input_ns,
                         const distribute::detail::StepProfile& profile) {
  recorded_last_ = step;
  const int replicas = static_cast<int>(devices_.size());
  if (events_.size() + 4 + static_cast<std::size_t>(replicas) * 40 > max_events) return;
  events_.push_back({"step", 0, previous_ns, boundary_ns - previous_ns, step, -1, -1, -1});
  if (input_ns > 0) events_.push_back({"input wait", 0, input_start_ns, input_ns, step, -1, -1, -1});
  for (int r = 0; r < replicas; ++r) {
    const auto& rec = profile.replica(r);
    events_.push_back({"replica step", 1 + r, rec.start_ns, rec.end_ns - rec.start_ns, step, -1, -1, first_replica_ + r});
    const int n = std::min(rec.collectives, ReplicaStepRecord::max_recorded);
    for (int i = 0; i < n; ++i) {
      const auto& c = rec.records[static_cast<std::size_t>(i)];
      events_.push_back({distribute::detail::collective_kind_name(c.kind), 1 + r, c.start_ns, c.duration_ns, step,
                         static_cast<std::int64_t>(c.bytes), static_cast<std::int64_t>(c.sequence),
                         first_replica_ + r});
    }
  }
}

TraceWriter::Written TraceWriter::write() {
  using json = nlohmann::ordered_json;
  json trace_events = json::array();
  trace_events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", worker_},
                          {"args", {{"name", "worker " + std::to_string(worker_)}}}});
  trace_events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", worker_}, {"tid", 0},
                          {"args", {{"name", "worker " + std::to_string(worker_) + " steps"}}}});
  for (std::size_t r = 0; r < devices_.size(); ++r) {
    trace_events.push_back(
        {{"name", "thread_name"}, {"ph", "M"}, {"pid", worker_}, {"tid", 1 + static_cast<int>(r)},
         {"args",
          {{"name", "replica " + std::to_string(first_replica_ + static_cast<int>(r)) + " (" +
                        devices_[r].to_string() + ")"}}}});
  }
  for (const Event& e : events_) {
    json args = {{"step", e.step}};
    if (e.replica >= 0) args["replica"] = e.replica;
    if (e.bytes >= 0) {
      args["op"] = e.name;
      args["bytes"] = e.bytes;
      args["sequence"] = e.sequence;
    }
    // Microseconds, as the format wants them, to the nanosecond.
    trace_events.push_back({{"name", e.name}, {"cat", e.bytes >= 0 ? "collective" : "step"}, {"ph", "X"},
                            {"pid", worker_}, {"tid", e.tid},
                            {"ts", static_cast<double>(e.ts_ns - t0_ns_) / 1e3},
                            {"dur", static_cast<double>(e.dur_ns) / 1e3}, {"args", std::move(args)}});
  }
  const json trace = {{"displayTimeUnit", "ms"}, {"traceEvents", std::move(trace_events)}};
  Written out;
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream file(tmp, std::ios::trunc | std::ios::binary);
    file << trace.dump() << '\n';
    if (!file.flush()) {
      out.path = tmp;
      return out;
    }
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    out.path = path_;
    return out;
  }
  out.ok = true;
  out.path = path_;
  out.summary = "trace of steps " + std::to_string(first_) + ".." + std::to_string(recorded_last_) + " written to " +
                path_ + " (" + std::to_string(events_.size()) + " events)";
  events_.clear();
  events_.shrink_to_fit();
  first_ = last_ = -1;
  return out;
}

}  // namespace troupe::detail
