#include "troupe/monitor.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>

#include "distribute/strategies/step_profile.hpp"
#include "distribute/collectives/worker_group.hpp"
#include "monitor/assets.hpp"
#include "monitor/http_server.hpp"
#include "troupe/actors/cluster_health.hpp"
#include "troupe/actors/metrics_stream.hpp"
#include "troupe/distribute/strategy.hpp"
#include "troupe/nn/callback.hpp"
#include "troupe/nn/model.hpp"
#include "troupe/nn/optimizers.hpp"
#include "troupe/runtime.hpp"

namespace troupe {
namespace {

using distribute::detail::profile_now_ns;
using distribute::detail::StepProfile;

// The dashboard's commands, as they travel in the chief's row of the step-boundary exchange.
enum Command : int { none = 0, pause = 1, resume = 2, set_learning_rate = 3, checkpoint = 4, stop = 5, trace = 6 };

// A command as the training thread takes it: more says whether others wait behind it.
struct Taken {
  int code = 0;
  double argument = 0;
  bool more = false;
};

const char* command_name(int c) {
  switch (c) {
    case pause: return "pause";
    case resume: return "resume";
    case set_learning_rate: return "learning_rate";
    case checkpoint: return "checkpoint";
    case stop: return "stop";
    case trace: return "trace";
    default: return "none";
  }
}

// The columns of one replica's row in the exchange. The chief's first replica carries the command.
enum Column : int {
  c_command,
  c_argument,
  c_worker,
  c_step,
  c_replica_loss,
  c_compute_ms,
  c_collective_ms,
  c_collective_bytes,
  c_collectives,
  c_input_ms,
  c_other_ms,
  c_samples_per_s,
  c_paused,
  c_more,  // the chief has more commands: every worker exchanges again at this boundary
  columns
};

constexpr std::size_t max_queued_commands = 64;
constexpr std::size_t max_own_failures = 64;
constexpr std::size_t max_trace_events = 4 << 20;
constexpr std::int64_t max_trace_steps = 100000;
const std::chrono::milliseconds paused_poll{100};

bool is_loopback(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address == "::1" || address == "localhost";
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// One complete event ("ph":"X") of the Chrome trace.
struct TraceEvent {
  const char* name;
  int pid;   // worker
  int tid;   // 0: the worker's training thread; 1 + r: local replica r
  std::int64_t ts_ns;
  std::int64_t dur_ns;
  std::int64_t step;
  std::int64_t bytes;     // collectives: bytes, else -1
  std::int64_t sequence;  // collectives: sequence number, else -1
  int replica;            // global replica id, or -1
};

// A failure of the monitor's own (a trace it cannot write), shown among the cluster's events.
struct OwnFailure {
  std::chrono::system_clock::time_point wall;
  std::int64_t at_ns;  // profile_now_ns()
  std::string text;
};

std::int64_t unix_ms(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

double ms_between(actors::cluster_health::clock::time_point from, actors::cluster_health::clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

}  // namespace

struct Monitor::Impl {
  Impl(distribute::Strategy& s, nn::Optimizer* opt, MonitorOptions o)
      : strategy(s),
        optimizer(opt),
        options(std::move(o)),
        backend(s.backend()),
        profile(static_cast<int>(s.backend().devices().size())) {}

  distribute::Strategy& strategy;
  nn::Optimizer* optimizer;
  MonitorOptions options;
  distribute::detail::StrategyBackend& backend;
  StepProfile profile;
  int worker = 0;
  int workers = 1;
  int local_replicas = 1;
  int replicas_in_sync = 1;
  std::ostream* log = nullptr;
  std::unique_ptr<actors::metrics_stream> stream;
  std::unique_ptr<detail::HttpServer> server;
  int subscription = 0;
  std::int64_t t0_ns = 0;
  std::int64_t last_boundary_ns = 0;
  std::function<void(std::int64_t)> save;
  std::vector<double> shares;  // this worker's replicas' loss shares of the step
  bool have_shares = false;
  std::vector<double> rows;    // the exchange, reused
  // The step being built at a boundary, its vectors sized once: a step allocates nothing.
  actors::step_event scratch;

  // With callback(): fit's TrainingControl while fit runs (under mutex), which the dashboard's
  // controls go to; before, they wait in `commands`. A trace asked for waits in trace_request.
  bool callback_mode = false;
  nn::TrainingControl* control = nullptr;
  std::int64_t trace_request = 0;
  double shown_learning_rate = NAN;

  // The dashboard's requests, from the HTTP thread to the training thread.
  std::mutex mutex;
  std::condition_variable command_ready;
  std::deque<std::pair<int, double>> commands;

  // What /api/state shows (under mutex).
  actors::step_event last;
  std::atomic<bool> paused{false};
  std::atomic<bool> stopped{false};
  std::vector<std::int64_t> heard_ns;  // when each worker's row last arrived
  std::deque<OwnFailure> failures;     // the newest max_own_failures
  // The cluster's health as the chief's control plane records it; null for one process.
  actors::cluster_health* health = nullptr;
  std::string trace_status = "idle";
  std::string trace_written;

  // Tracing (training thread only, but trace_written/status under mutex).
  std::string trace_path;
  std::int64_t trace_first = -1;  // steps trace_first..trace_last (inclusive) are recorded
  std::int64_t trace_last = -1;
  std::vector<TraceEvent> trace_events;
  std::int64_t trace_recorded_last = -1;

  void say(const std::string& line) {
    if (log) *log << line << std::endl;
  }

  std::string worker_trace_path(const std::string& base) const {
    return worker == 0 ? base : base + ".worker-" + std::to_string(worker);
  }

  void start_trace(std::int64_t first_step, std::int64_t last_step, const std::string& base) {
    trace_path = worker_trace_path(base);
    trace_first = first_step;
    trace_last = last_step;
    trace_events.clear();
    std::lock_guard<std::mutex> lock(mutex);
    trace_status = "recording steps " + std::to_string(first_step) + ".." + std::to_string(last_step);
  }

  void record_trace(std::int64_t step, std::int64_t boundary_ns, std::int64_t input_start_ns, std::int64_t input_ns) {
    trace_recorded_last = step;
    if (trace_events.size() + 4 + static_cast<std::size_t>(local_replicas) * 40 > max_trace_events) return;
    const int first_replica = backend.first_replica_id();
    trace_events.push_back({"step", worker, 0, last_boundary_ns, boundary_ns - last_boundary_ns, step, -1, -1, -1});
    if (input_ns > 0) {
      trace_events.push_back({"input wait", worker, 0, input_start_ns, input_ns, step, -1, -1, -1});
    }
    for (int r = 0; r < local_replicas; ++r) {
      const auto& rec = profile.replica(r);
      trace_events.push_back({"replica step", worker, 1 + r, rec.start_ns, rec.end_ns - rec.start_ns, step, -1, -1,
                              first_replica + r});
      const int n = std::min(rec.collectives, distribute::detail::ReplicaStepRecord::max_recorded);
      for (int i = 0; i < n; ++i) {
        const auto& c = rec.records[static_cast<std::size_t>(i)];
        trace_events.push_back({distribute::detail::collective_kind_name(c.kind), worker, 1 + r, c.start_ns,
                                c.duration_ns, step, static_cast<std::int64_t>(c.bytes),
                                static_cast<std::int64_t>(c.sequence), first_replica + r});
      }
    }
  }

  void write_trace() {
    std::ostringstream out;
    out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    out << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << worker << ",\"args\":{\"name\":\"worker " << worker
        << "\"}},\n";
    out << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << worker << ",\"tid\":0,\"args\":{\"name\":\"worker "
        << worker << " steps\"}}";
    for (int r = 0; r < local_replicas; ++r) {
      out << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << worker << ",\"tid\":" << 1 + r
          << ",\"args\":{\"name\":\"replica " << backend.first_replica_id() + r << " ("
          << backend.devices()[static_cast<std::size_t>(r)].to_string() << ")\"}}";
    }
    char ts[64];
    for (const TraceEvent& e : trace_events) {
      std::snprintf(ts, sizeof ts, "%.3f,\"dur\":%.3f", static_cast<double>(e.ts_ns - t0_ns) / 1e3,
                    static_cast<double>(e.dur_ns) / 1e3);
      out << ",\n{\"name\":\"" << e.name << "\",\"cat\":\"" << (e.bytes >= 0 ? "collective" : "step")
          << "\",\"ph\":\"X\",\"pid\":" << e.pid << ",\"tid\":" << e.tid << ",\"ts\":" << ts
          << ",\"args\":{\"step\":" << e.step;
      if (e.replica >= 0) out << ",\"replica\":" << e.replica;
      if (e.bytes >= 0) out << ",\"op\":\"" << e.name << "\",\"bytes\":" << e.bytes << ",\"sequence\":" << e.sequence;
      out << "}}";
    }
    out << "\n]}\n";
    const std::string tmp = trace_path + ".tmp";
    {
      std::ofstream file(tmp, std::ios::trunc | std::ios::binary);
      file << out.str();
      if (!file.flush()) {
        std::lock_guard<std::mutex> lock(mutex);
        trace_status = "failed: cannot write " + tmp;
        if (failures.size() == max_own_failures) failures.pop_front();
        failures.push_back({std::chrono::system_clock::now(), profile_now_ns(), "trace: cannot write " + tmp});
        return;
      }
    }
    std::rename(tmp.c_str(), trace_path.c_str());
    say("trace of steps " + std::to_string(trace_first) + ".." + std::to_string(trace_recorded_last) + " written to " +
        trace_path + " (" + std::to_string(trace_events.size()) + " events)");
    trace_events.clear();
    trace_events.shrink_to_fit();
    std::lock_guard<std::mutex> lock(mutex);
    trace_status = "written";
    trace_written = trace_path;
    trace_first = trace_last = -1;
  }

  Taken take_command() {
    std::lock_guard<std::mutex> lock(mutex);
    return take_locked();
  }
  Taken take_locked() {
    if (commands.empty()) return {};
    Taken t{commands.front().first, commands.front().second, false};
    commands.pop_front();
    t.more = !commands.empty();
    return t;
  }

  // Every worker's row: the chief's command travels to all, the timings to the chief. A sum of
  // rows that are zero except one's own is exact: every worker reads the same table.
  Taken exchange(Taken command, std::int64_t step,
                                  const actors::worker_metrics& mine, actors::step_event& event) {
    const int first = backend.first_replica_id();
    std::fill(rows.begin(), rows.end(), 0.0);
    for (int r = 0; r < local_replicas; ++r) {
      double* row = &rows[static_cast<std::size_t>((first + r) * columns)];
      const auto& rec = profile.replica(r);
      if (worker == 0 && r == 0) {
        row[c_command] = command.code;
        row[c_argument] = command.argument;
        row[c_more] = command.more ? 1.0 : 0.0;
      }
      row[c_worker] = worker;
      row[c_step] = static_cast<double>(step);
      row[c_replica_loss] = have_shares ? shares[static_cast<std::size_t>(r)] * replicas_in_sync : NAN;
      row[c_compute_ms] = static_cast<double>(rec.end_ns - rec.start_ns - rec.collective_ns) / 1e6;
      row[c_collective_ms] = static_cast<double>(rec.collective_ns) / 1e6;
      row[c_collective_bytes] = static_cast<double>(rec.collective_bytes);
      row[c_collectives] = rec.collectives;
      row[c_input_ms] = mine.input_ms;
      row[c_other_ms] = mine.other_ms;
      row[c_samples_per_s] = mine.samples_per_s;
      row[c_paused] = paused ? 1.0 : 0.0;
    }
    const Tensor table = backend.workers().sum(
        Tensor::from_vector(rows, {static_cast<std::int64_t>(replicas_in_sync), static_cast<std::int64_t>(columns)}));
    const std::vector<double> all = table.to_vector<double>();
    const int per_worker = local_replicas;
    event.replica_loss.assign(static_cast<std::size_t>(replicas_in_sync), NAN);
    event.workers.assign(static_cast<std::size_t>(workers), actors::worker_metrics{});
    const std::int64_t now = profile_now_ns();
    for (int g = 0; g < replicas_in_sync; ++g) {
      const double* row = &all[static_cast<std::size_t>(g * columns)];
      event.replica_loss[static_cast<std::size_t>(g)] = row[c_replica_loss];
      actors::worker_metrics& w = event.workers[static_cast<std::size_t>(g / per_worker)];
      w.worker = g / per_worker;
      w.step = static_cast<std::int64_t>(row[c_step]);
      w.compute_ms = std::max(w.compute_ms, row[c_compute_ms]);
      w.all_reduce_ms = std::max(w.all_reduce_ms, row[c_collective_ms]);
      w.all_reduce_bytes = static_cast<std::uint64_t>(row[c_collective_bytes]);
      w.collectives = static_cast<int>(row[c_collectives]);
      w.input_ms = row[c_input_ms];
      w.other_ms = row[c_other_ms];
      w.samples_per_s = row[c_samples_per_s];
      w.paused = row[c_paused] != 0.0;
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      std::fill(heard_ns.begin(), heard_ns.end(), now);
    }
    return {static_cast<int>(all[c_command]), all[c_argument], all[c_more] != 0.0};
  }

  // Applies a command after `step`, identically on every worker.
  void apply(const Taken& command, std::int64_t step) {
    const int c = command.code;
    const double value = command.argument;
    if (c == none) return;
    if (c == pause && !paused) {
      paused = true;
      say("paused after step " + std::to_string(step));
    } else if (c == resume && paused) {
      paused = false;
      say("resumed after step " + std::to_string(step));
    } else if (c == set_learning_rate && optimizer && std::isfinite(value) && value > 0) {
      optimizer->set_learning_rate(static_cast<float>(value));
      std::ostringstream line;
      line << "learning rate " << static_cast<float>(value) << " from step " << step + 1;
      say(line.str());
    } else if (c == checkpoint || c == stop) {
      if (save) {
        save(step);
        say("checkpoint saved at step " + std::to_string(step));
      } else if (c == checkpoint) {
        say("checkpoint asked for at step " + std::to_string(step) + ", but this trainer has no checkpoint directory");
      }
      if (c == stop) {
        stopped = true;
        paused = false;
        say("stopped after step " + std::to_string(step));
      }
    } else if (c == trace) {
      const auto n = static_cast<std::int64_t>(value);
      start_trace(step + 1, step + std::clamp<std::int64_t>(n, 1, max_trace_steps),
                  options.trace_file.empty() ? "troupe-trace.json" : options.trace_file);
    }
    std::lock_guard<std::mutex> lock(mutex);
    last.paused = paused;
  }

  // The step boundary's hand-over: a copy into /api/state's `last` (its vectors keep their
  // storage) and into the stream's ring, which the stream drains on its own timer. No message, no
  // allocation and no wakeup per step; `now` (a pause, a stop) asks the stream to push at once.
  void publish(const actors::step_event& e, bool now) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      last = e;
      last.paused = paused;
    }
    if (!stream) return;
    stream->push(e);
    if (now) stream->flush_now();
  }
  // Fresh scalars for the next step's event; its vectors keep their storage.
  actors::step_event& next_event() {
    actors::step_event& e = scratch;
    e.step = 0;
    e.time_s = e.loss = e.learning_rate = e.samples_per_s = 0;
    e.paused = false;
    e.replica_loss.clear();
    e.workers.clear();
    return e;
  }

  // What /api/state says about the cluster: per worker its heartbeat as the chief's control
  // plane saw it, and the failures (the control plane's events and the monitor's own), newest
  // first. Under mutex.
  std::string state_json() {
    std::lock_guard<std::mutex> lock(mutex);
    std::string out = "{\"step\":" + std::to_string(last.step) + ",\"paused\":" + (paused ? "true" : "false") +
                      ",\"stopped\":" + (stopped ? "true" : "false") +
                      ",\"learning_rate\":" + json_number(last.learning_rate) +
                      ",\"loss\":" + json_number(last.loss) + ",\"samples_per_s\":" + json_number(last.samples_per_s) +
                      ",\"time_s\":" + json_number(last.time_s) + ",\"pending_commands\":" +
                      std::to_string(commands.size()) + ",\"replicas_in_sync\":" + std::to_string(replicas_in_sync) +
                      ",\"workers\":[";
    const std::int64_t now = profile_now_ns();
    const auto steady_now = actors::cluster_health::clock::now();
    actors::cluster_snapshot cluster;
    if (health) cluster = health->snapshot(steady_now);
    for (int w = 0; w < workers; ++w) {
      if (w) out += ',';
      out += "{\"worker\":" + std::to_string(w) + ",\"replicas\":[";
      for (int r = 0; r < local_replicas; ++r) {
        if (r) out += ',';
        out += std::to_string(w * local_replicas + r);
      }
      out += "],\"devices\":[";
      for (int r = 0; r < local_replicas; ++r) {
        if (r) out += ',';
        out += json_string(backend.devices()[static_cast<std::size_t>(r)].to_string());
      }
      out += "]";
      if (static_cast<std::size_t>(w) < last.workers.size()) {
        const auto& m = last.workers[static_cast<std::size_t>(w)];
        out += ",\"step\":" + std::to_string(m.step) + ",\"paused\":" + (m.paused ? "true" : "false");
      }
      out += ",\"report_age_ms\":" + json_number(static_cast<double>(now - heard_ns[static_cast<std::size_t>(w)]) / 1e6);
      if (cluster.watching && static_cast<std::size_t>(w) < cluster.workers.size()) {
        const auto& h = cluster.workers[static_cast<std::size_t>(w)];
        out += ",\"task\":" + json_string(h.task) + ",\"state\":\"" + actors::to_string(h.state) +
               "\",\"heartbeat_age_ms\":" + json_number(ms_between(h.last_beat, steady_now)) +
               ",\"heard\":" + (h.heard ? "true" : "false");
      } else {
        out += ",\"state\":" + std::string(health ? "\"starting\"" : "\"alive\"") + ",\"heartbeat_age_ms\":null";
      }
      out += "}";
    }
    out += "],\"replica_loss\":[";
    for (std::size_t i = 0; i < last.replica_loss.size(); ++i) {
      if (i) out += ',';
      out += json_number(last.replica_loss[i]);
    }
    out += "],\"cluster\":{\"watching\":" + std::string(cluster.watching ? "true" : "false") +
           ",\"heartbeat_interval_ms\":" + std::to_string(cluster.interval.count()) +
           ",\"late_after_ms\":" + std::to_string(cluster.interval.count() * cluster.late_after_intervals) +
           ",\"incarnation\":" + json_string(cluster.incarnation) +
           ",\"restart_count\":" + std::to_string(cluster.restart_count) +
           ",\"events_total\":" + std::to_string(cluster.events_total) + "},\"failures\":[";
    // Both lists are newest first: merged by wall time.
    std::size_t a = 0;
    auto b = failures.rbegin();
    bool first = true;
    while (a < cluster.events.size() || b != failures.rend()) {
      if (!first) out += ',';
      first = false;
      if (b == failures.rend() || (a < cluster.events.size() && cluster.events[a].wall >= b->wall)) {
        const actors::cluster_event& e = cluster.events[a++];
        out += "{\"sequence\":" + std::to_string(e.sequence) + ",\"kind\":\"" + actors::to_string(e.kind) +
               "\",\"time_unix_ms\":" + std::to_string(unix_ms(e.wall)) +
               ",\"age_ms\":" + json_number(ms_between(e.at, steady_now)) + ",\"worker\":" +
               (e.rank >= 0 ? std::to_string(e.rank) : std::string("null")) + ",\"address\":" +
               (e.address.empty() ? std::string("null") : json_string(e.address)) +
               ",\"text\":" + json_string(e.text) + "}";
      } else {
        out += "{\"kind\":\"monitor\",\"time_unix_ms\":" + std::to_string(unix_ms(b->wall)) +
               ",\"age_ms\":" + json_number(static_cast<double>(now - b->at_ns) / 1e6) +
               ",\"worker\":" + std::to_string(worker) + ",\"address\":null,\"text\":" + json_string(b->text) + "}";
        ++b;
      }
    }
    out += "],\"trace\":{\"status\":" + json_string(trace_status) + ",\"file\":" + json_string(trace_written) + "}}";
    return out;
  }

  static detail::HttpResponse error(int status, const std::string& message) {
    return {status, "application/json", "{\"error\":" + json_string(message) + "}"};
  }

  // A dashboard command as a request to fit (under mutex): fit agrees on it at a step boundary.
  void forward_locked(int command, double value) {
    switch (command) {
      case pause: control->pause(); break;
      case resume: control->resume(); break;
      case set_learning_rate: control->set_learning_rate(value); break;
      case checkpoint: control->request_checkpoint(); break;
      case stop:
        control->request_checkpoint();
        control->request_stop(Monitor::dashboard_stop_reason);
        break;
      default: break;
    }
  }

  detail::HttpResponse enqueue(int command, double value) {
    std::lock_guard<std::mutex> lock(mutex);
    if (stopped) return {409, "application/json", "{\"error\":\"the training has stopped\"}"};
    if (callback_mode && command == trace) {
      trace_request = static_cast<std::int64_t>(value);
    } else if (control != nullptr) {
      forward_locked(command, value);
    } else if (commands.size() >= max_queued_commands) {
      return {503, "application/json", "{\"error\":\"too many commands waiting for the next step boundary\"}"};
    } else {
      commands.emplace_back(command, value);
    }
    command_ready.notify_all();
    return {200, "application/json",
            std::string("{\"ok\":true,\"command\":\"") + command_name(command) +
                "\",\"applies\":\"at the next step boundary, on every worker\"}"};
  }

  detail::HttpResponse handle(const detail::HttpRequest& r) {
    using detail::HttpResponse;
    if (r.method == "GET") {
      if (r.path == "/" || r.path == "/index.html") {
        return {200, "text/html; charset=utf-8", std::string(detail::dashboard_html())};
      }
      if (r.path == "/chart.js") return {200, "application/javascript", std::string(detail::chart_js())};
      if (r.path == "/api/state") return {200, "application/json", state_json()};
      if (r.path == "/api/history") {
        std::string h = stream->history_json(std::chrono::seconds(5));
        if (h.empty()) return {503, "application/json", "{\"error\":\"the metrics stream did not answer\"}"};
        return {200, "application/json", std::move(h)};
      }
      if (r.path == "/api/trace") {
        std::string path;
        {
          std::lock_guard<std::mutex> lock(mutex);
          path = trace_written;
        }
        if (path.empty()) {
          return {404, "application/json",
                  "{\"error\":\"no trace written yet: POST /api/trace?steps=N records the next N steps\"}"};
        }
        std::ifstream in(path, std::ios::binary);
        std::string body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        return {200, "application/json", std::move(body)};
      }
    } else if (r.method == "POST") {
      if (r.path == "/api/pause") return enqueue(pause, 0);
      if (r.path == "/api/resume") return enqueue(resume, 0);
      if (r.path == "/api/checkpoint") return enqueue(checkpoint, 0);
      if (r.path == "/api/stop") return enqueue(stop, 0);
      if (r.path == "/api/learning_rate") {
        const std::string text = detail::query_value(r.query, "value");
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v <= 0 || v > 1e6) {
          return error(400, "learning_rate: value \"" + text.substr(0, 64) +
                                "\" is not a positive number (e.g. /api/learning_rate?value=0.001)");
        }
        if (!optimizer) return {409, "application/json", "{\"error\":\"this trainer has no optimizer to steer\"}"};
        return enqueue(set_learning_rate, v);
      }
      if (r.path == "/api/trace") {
        const std::string text = detail::query_value(r.query, "steps");
        char* end = nullptr;
        const long long n = text.empty() ? 100 : std::strtoll(text.c_str(), &end, 10);
        if ((!text.empty() && end != text.c_str() + text.size()) || n < 1 || n > max_trace_steps) {
          return error(400, "trace: steps \"" + text.substr(0, 64) + "\" is not a number in 1.." +
                                std::to_string(max_trace_steps));
        }
        return enqueue(trace, static_cast<double>(n));
      }
    } else {
      return {405, "application/json", "{\"error\":\"method not allowed: use GET or POST\"}"};
    }
    return error(404, "no such page: " + r.path.substr(0, 64));
  }
};

Monitor::Monitor(distribute::Strategy& strategy, nn::Optimizer* optimizer, MonitorOptions options)
    : impl_(std::make_unique<Impl>(strategy, optimizer, std::move(options))) {
  Impl& m = *impl_;
  const MonitorOptions& o = m.options;
  Runtime* rt = m.backend.runtime();
  if (!rt) throw std::invalid_argument("Monitor: the default strategy has no runtime to run a metrics stream in");
  if (o.dashboard_port < -1 || o.dashboard_port > 65535) {
    throw std::invalid_argument("Monitor: dashboard_port " + std::to_string(o.dashboard_port) +
                                " is out of range (expected -1 for none, 0 for any free port, or 1..65535)");
  }
  if (o.dashboard_port >= 0 && !is_loopback(o.dashboard_address) && o.dashboard_token.empty()) {
    throw std::invalid_argument("Monitor: the dashboard would listen on " + o.dashboard_address +
                                " without a token; set a dashboard token (anyone who reaches the port could steer "
                                "the training), or bind 127.0.0.1");
  }
  if (!o.trace_file.empty() && (o.trace_first_step < 1 || o.trace_last_step < o.trace_first_step)) {
    throw std::invalid_argument("Monitor: trace steps " + std::to_string(o.trace_first_step) + ":" +
                                std::to_string(o.trace_last_step) + " are not a range A:B with 1 <= A <= B");
  }
  m.worker = m.backend.workers().rank();
  m.workers = m.backend.workers().size();
  m.local_replicas = static_cast<int>(m.backend.devices().size());
  m.replicas_in_sync = m.backend.num_replicas_in_sync();
  m.heard_ns.assign(static_cast<std::size_t>(m.workers), profile_now_ns());
  m.health = m.backend.workers().health();
  m.rows.assign(static_cast<std::size_t>(m.replicas_in_sync) * columns, 0.0);
  m.shares.assign(static_cast<std::size_t>(m.local_replicas), 0.0);
  m.log = o.log ? o.log : (m.worker == 0 ? &std::cout : nullptr);
  m.t0_ns = m.last_boundary_ns = profile_now_ns();
  m.last.learning_rate = optimizer ? optimizer->learning_rate() : NAN;
  m.last.loss = NAN;
  m.scratch.replica_loss.reserve(static_cast<std::size_t>(m.replicas_in_sync));
  m.scratch.workers.reserve(static_cast<std::size_t>(m.workers));
  if (!o.trace_file.empty()) m.start_trace(o.trace_first_step, o.trace_last_step, o.trace_file);
  if (o.dashboard_port >= 0 && m.worker == 0) {
    // The stream, its thread and its history exist where a dashboard reads them: a worker that
    // serves none (or a run only traced) keeps no history that nobody would read.
    m.stream = std::make_unique<actors::metrics_stream>(rt->system(), o.history_capacity, o.push_interval,
                                                        static_cast<std::size_t>(m.replicas_in_sync),
                                                        static_cast<std::size_t>(m.workers));
    Impl* self = &m;
    m.server = std::make_unique<detail::HttpServer>(o.dashboard_address, o.dashboard_port, o.dashboard_token,
                                                    [self](const detail::HttpRequest& r) { return self->handle(r); });
    detail::HttpServer* server = m.server.get();
    m.subscription = m.stream->subscribe([server](const std::string& json) { server->push(json); },
                                         [server] { return server->has_listeners(); });
    m.say("dashboard: " + dashboard_url());
  }
  m.backend.set_step_profile(&m.profile);
}

Monitor::~Monitor() {
  Impl& m = *impl_;
  m.backend.set_step_profile(nullptr);
  if (m.stream) m.stream->flush_now();
  // Training ended inside the traced range: what was recorded is written.
  try {
    if (m.trace_first >= 0 && !m.trace_events.empty()) m.write_trace();
  } catch (...) {
    // A trace that cannot be written must not end the program from a destructor.
  }
  if (m.server) m.stream->unsubscribe(m.subscription);
  m.server.reset();
  m.stream.reset();
}

void Monitor::set_checkpoint_function(std::function<void(std::int64_t)> save) { impl_->save = std::move(save); }

void Monitor::record_replica_losses(const std::vector<Tensor>& shares) {
  Impl& m = *impl_;
  if (shares.size() != m.shares.size()) {
    throw std::invalid_argument("Monitor::record_replica_losses: " + std::to_string(shares.size()) +
                                " losses for " + std::to_string(m.shares.size()) + " local replicas");
  }
  for (std::size_t i = 0; i < shares.size(); ++i) {
    const Tensor host = shares[i].to(Device());
    m.shares[i] = host.dtype() == DType::f64 ? host.item<double>() : static_cast<double>(host.item<float>());
  }
  m.have_shares = true;
}

StepDecision Monitor::on_step_end(std::int64_t step, double loss) {
  Impl& m = *impl_;
  const std::int64_t now = profile_now_ns();
  std::int64_t input_start = 0;
  const std::int64_t input_ns = m.profile.take_input_wait(&input_start);
  const double step_ms = static_cast<double>(now - m.last_boundary_ns) / 1e6;

  actors::step_event& e = m.next_event();
  e.step = step;
  e.time_s = static_cast<double>(now - m.t0_ns) / 1e9;
  e.loss = loss;
  e.learning_rate = m.optimizer ? m.optimizer->learning_rate() : NAN;
  const double per_second = step_ms > 0 ? 1e3 / step_ms : 0.0;
  e.samples_per_s = m.options.global_batch_size > 0 ? per_second * static_cast<double>(m.options.global_batch_size)
                                                    : per_second;

  actors::worker_metrics mine;
  mine.worker = m.worker;
  mine.step = step;
  mine.input_ms = static_cast<double>(input_ns) / 1e6;
  double span_ms = 0;
  for (int r = 0; r < m.local_replicas; ++r) {
    const auto& rec = m.profile.replica(r);
    span_ms = std::max(span_ms, static_cast<double>(rec.end_ns - rec.start_ns) / 1e6);
    mine.compute_ms = std::max(mine.compute_ms, static_cast<double>(rec.end_ns - rec.start_ns - rec.collective_ns) / 1e6);
    mine.all_reduce_ms = std::max(mine.all_reduce_ms, static_cast<double>(rec.collective_ns) / 1e6);
    mine.all_reduce_bytes = rec.collective_bytes;
    mine.collectives = rec.collectives;
  }
  mine.other_ms = std::max(0.0, step_ms - mine.input_ms - span_ms);
  mine.samples_per_s = e.samples_per_s;
  mine.paused = m.paused;

  if (m.trace_first >= 0 && step >= m.trace_first && step <= m.trace_last) {
    m.record_trace(step, now, input_start, input_ns);
    if (step == m.trace_last) m.write_trace();
  }

  Taken command = m.worker == 0 ? m.take_command() : Taken{};
  if (m.workers > 1) {
    command = m.exchange(command, step, mine, e);
  } else {
    e.workers.assign(1, mine);
    {
      std::lock_guard<std::mutex> lock(m.mutex);
      m.heard_ns[0] = now;
    }
    if (m.have_shares) {
      e.replica_loss.resize(m.shares.size());
      for (std::size_t i = 0; i < m.shares.size(); ++i) e.replica_loss[i] = m.shares[i] * m.replicas_in_sync;
    }
  }
  m.have_shares = false;
  m.apply(command, step);
  // Several commands arrived during the step: all of them apply at this boundary, in order.
  while (command.more && !m.stopped) {
    command = m.worker == 0 ? m.take_command() : Taken{};
    if (m.workers > 1) {
      actors::step_event again = e;
      command = m.exchange(command, step, mine, again);
    }
    m.apply(command, step);
  }
  e.paused = m.paused;
  e.workers[static_cast<std::size_t>(m.worker)].paused = m.paused;
  e.learning_rate = m.optimizer ? m.optimizer->learning_rate() : NAN;
  // A step that changed the state (paused, stopped) is shown at once.
  const bool changed = m.paused || m.stopped || command.code != none;
  m.publish(e, changed);

  // Paused: every worker waits here; the chief polls for commands, and every poll is one more
  // exchange so that all workers leave the pause after the same step.
  while (m.paused && !m.stopped) {
    Taken c;
    if (m.worker == 0) {
      std::unique_lock<std::mutex> lock(m.mutex);
      m.command_ready.wait_for(lock, paused_poll, [&] { return !m.commands.empty(); });
      c = m.take_locked();
    }
    if (m.workers > 1) {
      actors::step_event idle = m.last;
      mine.paused = true;
      c = m.exchange(c, step, mine, idle);
      std::lock_guard<std::mutex> lock(m.mutex);
      m.last.workers = idle.workers;
    } else {
      std::lock_guard<std::mutex> lock(m.mutex);
      m.heard_ns[0] = profile_now_ns();
    }
    m.apply(c, step);
    std::lock_guard<std::mutex> lock(m.mutex);
    if (!m.last.workers.empty()) m.last.workers[static_cast<std::size_t>(m.worker)].paused = m.paused;
  }
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    m.last.learning_rate = m.optimizer ? m.optimizer->learning_rate() : NAN;
  }
  m.profile.take_input_wait(nullptr);
  m.last_boundary_ns = profile_now_ns();
  return m.stopped ? StepDecision::stop : StepDecision::proceed;
}

int Monitor::dashboard_port() const noexcept { return impl_->server ? impl_->server->port() : -1; }

std::string Monitor::dashboard_url() const {
  if (!impl_->server) return {};
  const std::string& a = impl_->options.dashboard_address;
  const std::string host = a.find(':') != std::string::npos ? "[" + a + "]" : a;
  std::string url = "http://" + host + ":" + std::to_string(impl_->server->port()) + "/";
  if (!impl_->options.dashboard_token.empty()) url += "?token=" + impl_->options.dashboard_token;
  return url;
}

bool Monitor::stopped() const noexcept { return impl_->stopped; }

std::string Monitor::trace_written() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->trace_written;
}

// The monitor inside Model::fit: each step comes from fit's logs, and the dashboard's controls go
// to fit's TrainingControl, which every worker agrees on in the step's own reduction.
class Monitor::FitCallback : public nn::Callback {
 public:
  explicit FitCallback(Monitor::Impl& m) : m_(m) {}

  void on_train_begin(nn::Logs&) override {
    nn::TrainingControl& control = model().control();
    {
      std::lock_guard<std::mutex> lock(m_.mutex);
      m_.control = &control;
      // Commands given before training began go to fit now, in order.
      while (!m_.commands.empty()) {
        m_.forward_locked(m_.commands.front().first, m_.commands.front().second);
        m_.commands.pop_front();
      }
    }
    m_.shown_learning_rate = m_.optimizer ? m_.optimizer->learning_rate() : NAN;
    m_.last_boundary_ns = profile_now_ns();
    // The names read at every step, made once.
    replica_keys_.clear();
    for (int g = 0; g < m_.replicas_in_sync; ++g) replica_keys_.push_back("loss/replica_" + std::to_string(g));
    part_keys_.clear();
    for (int w = 0; w < m_.workers; ++w) {
      const std::string prefix = w == m_.worker ? "time/" : "worker_" + std::to_string(w) + "/time/";
      part_keys_.push_back({prefix + "input_ms", prefix + "compute_ms", prefix + "all_reduce_ms", prefix + "step_ms"});
    }
  }

  void on_train_batch_begin(std::int64_t, nn::Logs&) override {
    m_.profile.take_input_wait(nullptr);
    m_.last_boundary_ns = profile_now_ns();
  }

  void on_train_batch_end(std::int64_t, nn::Logs& logs) override {
    const std::int64_t now = profile_now_ns();
    const std::int64_t step = model().control().step();
    static const std::string loss_key = "loss", step_key = "time/step_ms";
    const auto get = [&logs](const std::string& name) {
      const auto it = logs.find(name);
      return it == logs.end() ? NAN : it->second;
    };
    std::int64_t input_start = 0;
    const std::int64_t input_ns = m_.profile.take_input_wait(&input_start);

    actors::step_event& e = m_.next_event();
    e.step = step;
    e.time_s = static_cast<double>(now - m_.t0_ns) / 1e9;
    e.loss = get(loss_key);
    e.learning_rate = m_.optimizer ? m_.optimizer->learning_rate() : NAN;
    const double step_ms = get(step_key);
    const double per_second = step_ms > 0 ? 1e3 / step_ms : 0.0;
    e.samples_per_s = m_.options.global_batch_size > 0
                          ? per_second * static_cast<double>(m_.options.global_batch_size)
                          : per_second;
    e.replica_loss.assign(static_cast<std::size_t>(m_.replicas_in_sync), NAN);
    for (int g = 0; g < m_.replicas_in_sync; ++g) {
      e.replica_loss[static_cast<std::size_t>(g)] = get(replica_keys_[static_cast<std::size_t>(g)]);
    }
    // This worker's parts of this step; every other worker's of the step before, as fit's
    // reduction carried them.
    e.workers.assign(static_cast<std::size_t>(m_.workers), actors::worker_metrics{});
    for (int w = 0; w < m_.workers; ++w) {
      actors::worker_metrics& x = e.workers[static_cast<std::size_t>(w)];
      const std::array<std::string, 4>& keys = part_keys_[static_cast<std::size_t>(w)];
      const auto part = [&](std::size_t i) {
        const double value = get(keys[i]);
        return std::isfinite(value) ? value : 0.0;
      };
      x.worker = w;
      x.step = step;
      x.input_ms = part(0);
      x.compute_ms = part(1);
      x.all_reduce_ms = part(2);
      const double whole = get(keys[3]);
      x.other_ms = std::isfinite(whole) ? std::max(0.0, whole - x.input_ms - x.compute_ms - x.all_reduce_ms) : 0.0;
      x.samples_per_s = e.samples_per_s;
    }
    actors::worker_metrics& mine = e.workers[static_cast<std::size_t>(m_.worker)];
    for (int r = 0; r < m_.local_replicas; ++r) {
      mine.all_reduce_bytes = m_.profile.replica(r).collective_bytes;
      mine.collectives = m_.profile.replica(r).collectives;
    }

    if (m_.trace_first >= 0 && step >= m_.trace_first && step <= m_.trace_last) {
      m_.record_trace(step, now, input_start, input_ns);
      if (step == m_.trace_last) m_.write_trace();
    }
    std::int64_t trace_steps = 0;
    {
      std::lock_guard<std::mutex> lock(m_.mutex);
      std::fill(m_.heard_ns.begin(), m_.heard_ns.end(), now);
      std::swap(trace_steps, m_.trace_request);
    }
    if (trace_steps > 0) {
      m_.start_trace(step + 1, step + std::clamp<std::int64_t>(trace_steps, 1, max_trace_steps),
                     m_.options.trace_file.empty() ? "troupe-trace.json" : m_.options.trace_file);
    }
    m_.publish(e, false);
  }

  void on_learning_rate(std::int64_t step, double learning_rate) override {
    std::ostringstream line;
    line << "learning rate " << static_cast<float>(learning_rate) << " from step " << step + 1;
    m_.say(line.str());
    std::lock_guard<std::mutex> lock(m_.mutex);
    m_.last.learning_rate = learning_rate;
  }

  void on_pause(std::int64_t step) override {
    if (m_.stream) m_.stream->flush_now();  // the steps before the pause reach the dashboard now
    m_.paused = true;
    m_.say("paused after step " + std::to_string(step));
    std::lock_guard<std::mutex> lock(m_.mutex);
    m_.last.paused = true;
    for (auto& w : m_.last.workers) w.paused = true;  // fit paused every worker after this step
  }

  void on_resume(std::int64_t step) override {
    m_.paused = false;
    m_.say("resumed after step " + std::to_string(step));
    std::lock_guard<std::mutex> lock(m_.mutex);
    m_.last.paused = false;
    for (auto& w : m_.last.workers) w.paused = false;
  }

  void on_checkpoint(std::int64_t step, nn::Logs&) override {
    m_.say("checkpoint requested at step " + std::to_string(step));
  }

  void on_train_end(nn::Logs&) override {
    nn::TrainingControl& control = model().control();
    if (m_.stream) m_.stream->flush_now();
    std::lock_guard<std::mutex> lock(m_.mutex);
    m_.control = nullptr;
    m_.paused = false;
    m_.last.paused = false;
    if (control.stopped_for(Monitor::dashboard_stop_reason)) {
      m_.stopped = true;
      m_.say("stopped after step " + std::to_string(control.step()));
    }
  }

 private:
  Monitor::Impl& m_;
  std::vector<std::string> replica_keys_;              // "loss/replica_<g>"
  std::vector<std::array<std::string, 4>> part_keys_;  // per worker: its input, compute, all-reduce, step
};

std::shared_ptr<nn::Callback> Monitor::callback() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->callback_mode = true;
  }
  return std::make_shared<FitCallback>(*impl_);
}

}  // namespace troupe
