// The dashboard's routes: the page and its assets, /api/state, /api/history, /api/trace,
// /api/flight_recorder, /api/ps_cluster, /api/actors, and the
// commands, which go to the training thread (or, with the fit callback, to fit's TrainingControl);
// an actor command waits for the application (Monitor::take_actor_commands).
#include <cmath>
#include <fstream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "flight_recorder.hpp"
#include "monitor/assets.hpp"
#include "monitor/monitor_impl.hpp"
#include "troupe/base/parse_number.hpp"
#include "troupe/base/quote.hpp"
#include "troupe/distribute/strategy.hpp"
#include "troupe/nn/callback.hpp"

namespace troupe {
namespace {

using json = nlohmann::ordered_json;
using distribute::detail::profile_now_ns;
using detail::HttpResponse;

// A number, or null when not finite (a diverging loss): JSON has no NaN.
std::int64_t unix_ms(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

double ms_between(actors::cluster_health::clock::time_point from, actors::cluster_health::clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// Text from the network (a fault report, a worker's lines) is checked where it arrives; a text cut
// inside a UTF-8 character still must not make a page unreadable, so an invalid byte shows as
// U+FFFD instead of throwing.
std::string dump(const json& body) { return body.dump(-1, ' ', false, json::error_handler_t::replace); }

HttpResponse answer(int status, const json& body) { return {status, "application/json", dump(body)}; }

// A number, or null when unknown (negative).
json known(double v) { return v >= 0 && std::isfinite(v) ? json(v) : json(nullptr); }
json known(std::int64_t v) { return v >= 0 ? json(v) : json(nullptr); }

HttpResponse error(int status, const std::string& message) { return answer(status, json{{"error", message}}); }

// Ring rank w's id among the cluster's workers: w until an elastic change, then what the last
// change made it; -1 for a rank the ring no longer has (it shrank).
int cluster_id(const actors::cluster_snapshot& cluster, int w) {
  if (cluster.ring.empty()) return w;
  return static_cast<std::size_t>(w) < cluster.ring.size() ? cluster.ring[static_cast<std::size_t>(w)] : -1;
}

}  // namespace

// What /api/state says: the last step, and about the cluster per worker its heartbeat as the
// chief's control plane saw it, and the failures (the control plane's events and the monitor's
// own), newest first.
std::string Monitor::Impl::state_json(const detail::HttpRequest& r) {
  // The page asks only for the epochs and marks it has not seen yet.
  const auto epochs_after = base::parse_int(detail::query_value(r.query, "epochs_after")).value_or(0);
  const auto marks_after = base::parse_int(detail::query_value(r.query, "marks_after")).value_or(0);
  const auto texts_after = base::parse_int(detail::query_value(r.query, "texts_after")).value_or(0);
  std::lock_guard<std::mutex> lock(mutex);
  const base::usage_sample usage = process_usage.sample();
  const std::int64_t now = profile_now_ns();
  const auto steady_now = actors::cluster_health::clock::now();
  actors::cluster_snapshot cluster;
  if (health) cluster = health->snapshot(steady_now);
  json out = {{"step", last.step},
              {"paused", paused.load()},
              {"stopped", stopped.load()},
              {"learning_rate", json_number(last.learning_rate)},
              {"loss", json_number(last.loss)},
              {"samples_per_s", json_number(last.samples_per_s)},
              {"time_s", json_number(last.time_s)},
              {"pending_commands", commands.size()},
              {"replicas_in_sync", replicas_in_sync},
              {"status", !end_status.empty() ? end_status : stopped ? "stopped" : paused ? "paused" : "running"},
              {"end_reason", end_reason},
              {"can_checkpoint", can_checkpoint_locked()}};
  out["progress"] = progress_json();
  out["metric_names"] = metric_names ? json(*metric_names) : json::array();
  json rows = json::array();
  for (int w = 0; w < workers; ++w) {
    const int id = cluster_id(cluster, w);
    if (id < 0) continue;  // an elastic cluster that went on with fewer workers
    json row = {{"worker", w}, {"id", id}};
    json replicas = json::array(), devices = json::array();
    for (int r = 0; r < local_replicas; ++r) {
      replicas.push_back(w * local_replicas + r);
      devices.push_back(backend.devices()[static_cast<std::size_t>(r)].to_string());
    }
    row["replicas"] = std::move(replicas);
    row["devices"] = std::move(devices);
    if (static_cast<std::size_t>(w) < last.workers.size()) {
      row["step"] = last.workers[static_cast<std::size_t>(w)].step;
      row["paused"] = last.workers[static_cast<std::size_t>(w)].paused;
    }
    row["report_age_ms"] = json_number(static_cast<double>(now - heard_ns[static_cast<std::size_t>(w)]) / 1e6);
    // CPU and memory: the serving process measures itself; every other worker's come with its
    // heartbeat (null until its first report).
    const bool from_cluster = cluster.watching && static_cast<std::size_t>(id) < cluster.workers.size();
    if (w == worker) {
      row["cpu_percent"] = known(usage.cpu_percent);
      row["rss_bytes"] = known(usage.rss_bytes);
      row["usage_from"] = "self";
    } else if (from_cluster && cluster.workers[static_cast<std::size_t>(id)].reported) {
      const actors::worker_report& report = cluster.workers[static_cast<std::size_t>(id)].report;
      row["cpu_percent"] = known(report.cpu_percent);
      row["rss_bytes"] = known(report.rss_bytes);
      row["usage_from"] = "heartbeat";
    } else {
      row["cpu_percent"] = nullptr;
      row["rss_bytes"] = nullptr;
      row["usage_from"] = nullptr;
    }
    if (from_cluster) {
      const auto& h = cluster.workers[static_cast<std::size_t>(id)];
      row["task"] = h.task;
      row["state"] = actors::to_string(h.state);
      row["heartbeat_age_ms"] = json_number(ms_between(h.last_beat, steady_now));
      row["heard"] = h.heard;
    } else if (health) {
      row["state"] = "starting";
      row["heartbeat_age_ms"] = nullptr;
    } else {
      // One process (or ParameterServerStrategy's chief, whose cluster is in ps_cluster): its task
      // is its own, and its heartbeat is its training thread's last report (a step boundary, or a
      // poll while paused).
      row["task"] = own_task;
      row["state"] = "alive";
      row["heartbeat_age_ms"] = row["report_age_ms"];
    }
    rows.push_back(std::move(row));
  }
  out["workers"] = std::move(rows);
  json losses = json::array();
  for (double l : last.replica_loss) losses.push_back(json_number(l));
  out["replica_loss"] = std::move(losses);
  out["cluster"] = {{"watching", cluster.watching},
                    {"heartbeat_interval_ms", cluster.interval.count()},
                    {"late_after_ms", cluster.interval.count() * cluster.late_after_intervals},
                    {"incarnation", cluster.incarnation},
                    {"restart_count", cluster.restart_count},
                    {"events_total", cluster.events_total},
                    {"stall", cluster.stall}};
  // Every worker the chief watched, by id: those of the start, then each one that joined; a lost
  // one stays, marked lost. `ring_rank` is its place in the ring as of the last change (null: an
  // elastic cluster went on without it).
  json members = json::array();
  for (const actors::worker_health& h : cluster.workers) {
    json ring_rank = nullptr;
    for (std::size_t r = 0; r < (cluster.ring.empty() ? cluster.workers.size() : cluster.ring.size()); ++r) {
      if (cluster_id(cluster, static_cast<int>(r)) == h.rank) {
        ring_rank = static_cast<int>(r);
      }
    }
    members.push_back({{"id", h.rank},
                       {"task", h.task},
                       {"state", actors::to_string(h.state)},
                       {"heard", h.heard},
                       {"heartbeat_age_ms", json_number(ms_between(h.last_beat, steady_now))},
                       {"ring_rank", ring_rank}});
  }
  out["cluster"]["members"] = std::move(members);
  // An elastic cluster's changes, oldest first: who left, who joined, the step, the pause.
  json changes = json::array();
  for (const actors::membership_record& c : cluster.changes) {
    changes.push_back({{"left", c.left},
                       {"joined", c.joined},
                       {"step", c.step},
                       {"paused_ms", c.paused_ms},
                       {"workers", c.workers},
                       {"generation", c.generation},
                       {"state_bytes", c.state_bytes},
                       {"leave", c.leave},
                       {"ring", c.ring},
                       {"time_unix_ms", unix_ms(c.wall)}});
  }
  out["cluster"]["changes"] = std::move(changes);
  // Both lists are newest first: merged by wall time.
  json merged = json::array();
  std::size_t a = 0;
  auto b = failures.rbegin();
  while (a < cluster.events.size() || b != failures.rend()) {
    if (b == failures.rend() || (a < cluster.events.size() && cluster.events[a].wall >= b->wall)) {
      const actors::cluster_event& e = cluster.events[a++];
      merged.push_back({{"sequence", e.sequence},
                        {"kind", actors::to_string(e.kind)},
                        {"time_unix_ms", unix_ms(e.wall)},
                        {"age_ms", json_number(ms_between(e.at, steady_now))},
                        {"worker", e.rank >= 0 ? json(e.rank) : json(nullptr)},
                        {"step", e.step >= 0 ? json(e.step) : json(nullptr)},
                        {"address", e.address.empty() ? json(nullptr) : json(e.address)},
                        {"text", e.text}});
    } else {
      merged.push_back({{"kind", "monitor"},
                        {"time_unix_ms", unix_ms(b->wall)},
                        {"age_ms", json_number(static_cast<double>(now - b->at_ns) / 1e6)},
                        {"worker", worker},
                        {"step", nullptr},
                        {"address", nullptr},
                        {"text", b->text}});
      ++b;
    }
  }
  out["failures"] = std::move(merged);
  out["trace"] = {{"status", trace_status}, {"file", trace_written}};
  json marks_out = json::array();
  for (const Mark& m : marks) {
    if (m.sequence <= static_cast<std::uint64_t>(std::max<long long>(0, marks_after))) continue;
    marks_out.push_back({{"sequence", m.sequence}, {"step", m.step}, {"time_s", m.time_s}, {"kind", m.kind},
                         {"text", m.text}});
  }
  out["marks"] = std::move(marks_out);
  json epochs_out = json::array();
  for (const EpochRecord& e : epoch_records) {
    if (e.epoch <= epochs_after) continue;
    json logs = json::object();
    for (const auto& [name, value] : e.logs) logs[name] = json_number(value);
    epochs_out.push_back({{"epoch", e.epoch}, {"step", e.step}, {"time_s", e.time_s}, {"logs", std::move(logs)}});
  }
  out["epochs"] = std::move(epochs_out);
  // The application's controls and text summaries (app_values.cpp).
  json controls_out = json::array();
  for (const AppControl& c : app_controls) {
    controls_out.push_back({{"name", c.spec.name}, {"value", c.value}, {"min", c.spec.min}, {"max", c.spec.max},
                            {"help", c.spec.help}, {"pending", c.pending ? json(*c.pending) : json(nullptr)}});
  }
  out["controls"] = std::move(controls_out);
  json texts_out = json::array();
  for (const TextRecord& t : texts) {
    if (t.sequence <= static_cast<std::uint64_t>(std::max<long long>(0, texts_after))) continue;
    texts_out.push_back({{"sequence", t.sequence}, {"tag", t.tag}, {"step", t.step}, {"time_s", t.time_s},
                         {"text", t.text}});
  }
  out["texts"] = std::move(texts_out);
  out["ps_cluster"] = ps_cluster_json();
  out["actors"] = actors_json();
  return dump(out);
}

// A parameter-server cluster as the chief's dispatcher records it: the closure queue, every
// worker's state and throughput, every ps task's bytes and update rate, the events newest first.
nlohmann::ordered_json Monitor::Impl::ps_cluster_json() const {
  if (!ps_board) return nullptr;
  const auto now = actors::ps_cluster_board::clock::now();
  const actors::ps_cluster_view v = ps_board->snapshot(now);
  json workers_out = json::array();
  for (const auto& w : v.workers) {
    workers_out.push_back({{"worker", w.index},
                           {"task", w.task},
                           {"state", actors::to_string(w.state)},
                           {"closures_done", w.done},
                           {"closures_failed", w.failed},
                           {"in_flight", w.in_flight},
                           {"closures_per_s", json_number(w.closures_per_s)},
                           {"samples", w.samples},
                           {"samples_per_s", json_number(w.samples_per_s)},
                           {"last_result_age_ms", known(w.last_result_age_ms)},
                           {"times_lost", w.times_lost}});
  }
  json ps_out = json::array();
  for (const auto& p : v.ps) {
    json row = {{"ps", p.index}, {"task", p.task}, {"state", p.lost ? "lost" : p.reported ? "up" : "starting"}};
    if (p.reported) {
      row["shards"] = p.counters.shards;
      row["bytes_held"] = p.counters.bytes_held;
      row["updates"] = p.counters.updates;
      row["bytes_in"] = p.counters.bytes_in;
      row["bytes_out"] = p.counters.bytes_out;
      row["updates_per_s"] = json_number(p.updates_per_s);
      row["bytes_in_per_s"] = json_number(p.bytes_in_per_s);
      row["bytes_out_per_s"] = json_number(p.bytes_out_per_s);
      row["report_age_ms"] = known(p.report_age_ms);
    } else {
      for (const char* k : {"shards", "bytes_held", "updates", "bytes_in", "bytes_out", "updates_per_s", "bytes_in_per_s",
                            "bytes_out_per_s", "report_age_ms"}) {
        row[k] = nullptr;
      }
    }
    ps_out.push_back(std::move(row));
  }
  json events_out = json::array();
  for (const auto& e : v.events) {
    events_out.push_back({{"sequence", e.sequence},
                          {"kind", actors::to_string(e.kind)},
                          {"time_unix_ms", unix_ms(e.wall)},
                          {"age_ms", json_number(std::chrono::duration<double, std::milli>(now - e.at).count())},
                          {"worker", e.worker >= 0 ? json(e.worker) : json(nullptr)},
                          {"ps", e.ps >= 0 ? json(e.ps) : json(nullptr)},
                          {"count", e.count},
                          {"step", e.step >= 0 ? json(e.step) : json(nullptr)},
                          {"text", e.text}});
  }
  return json{{"closures_per_s", json_number(v.closures_per_s)},
              {"queued", v.queued},
              {"in_flight", v.in_flight},
              {"scheduled", v.scheduled},
              {"done", v.done},
              {"failed", v.failed},
              {"retried", v.retried},
              {"cancelled", v.cancelled},
              {"workers_lost", v.workers_lost},
              {"workers", std::move(workers_out)},
              {"ps", std::move(ps_out)},
              {"events", std::move(events_out)},
              {"events_total", v.events_total}};
}

// Where the run is (under mutex): epoch, elapsed, ETA, and the wall clock it started at.
nlohmann::ordered_json Monitor::Impl::progress_json() const {
  const std::int64_t now = profile_now_ns();
  json p = {{"epoch", epoch >= 0 ? json(epoch + 1) : json(nullptr)},
            {"epochs", epochs > 0 ? json(epochs) : json(nullptr)},
            {"steps_per_epoch", steps_per_epoch > 0 ? json(steps_per_epoch) : json(nullptr)},
            {"start_unix_ms", unix_ms(start_wall)},
            {"elapsed_s", static_cast<double>(now - t0_ns) / 1e9}};
  const std::int64_t total = epochs > 0 && steps_per_epoch > 0 ? epochs * steps_per_epoch : -1;
  p["total_steps"] = total > 0 ? json(total) : json(nullptr);
  const std::int64_t done = last.step - first_step;
  const double running_s = static_cast<double>(now - begin_ns) / 1e9;
  if (total > 0 && done > 0 && begin_ns > 0 && end_status.empty()) {
    p["eta_s"] = std::max<double>(0.0, static_cast<double>(total - last.step) * running_s / static_cast<double>(done));
  } else {
    p["eta_s"] = nullptr;
  }
  return p;
}

// A dashboard command as a request to fit (under mutex): fit agrees on it at a step boundary.
void Monitor::Impl::forward_locked(int command, double value) {
  switch (command) {
    case detail::pause: control->pause(); break;
    case detail::resume: control->resume(); break;
    case detail::set_learning_rate: control->set_learning_rate(value); break;
    case detail::checkpoint: control->request_checkpoint(); break;
    case detail::stop:
      control->request_checkpoint();
      control->request_stop(Monitor::dashboard_stop_reason);
      break;
    case detail::stop_without_checkpoint: control->request_stop(Monitor::dashboard_stop_reason); break;
    default: break;
  }
}

HttpResponse Monitor::Impl::enqueue(int command, double value) {
  std::lock_guard<std::mutex> lock(mutex);
  if (stopped) return error(409, "the training has stopped");
  if (!end_status.empty()) return error(409, "the training has ended (" + end_status + ")");
  if (callback_mode && command == detail::trace) {
    trace_request = static_cast<std::int64_t>(value);
  } else if (control != nullptr) {
    forward_locked(command, value);
  } else if (commands.size() >= max_queued_commands) {
    return error(503, "too many commands waiting for the next step boundary");
  } else {
    commands.emplace_back(command, value);
  }
  command_ready.notify_all();
  return answer(200, json{{"ok", true},
                          {"command", detail::command_name(command)},
                          {"applies", "at the next step boundary, on every worker"}});
}

// The tab's icon: troupe's "t" on the header's colour.
constexpr const char* favicon_svg =
    "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 32 32\"><rect width=\"32\" height=\"32\" rx=\"6\" "
    "fill=\"#1f2937\"/><path d=\"M11 7v15a4 4 0 0 0 4 4h5M7 13h12\" stroke=\"#34d399\" stroke-width=\"4\" "
    "fill=\"none\" stroke-linecap=\"round\"/></svg>";

// The methods each path answers; a path not here is 404.
const char* allowed_methods(const std::string& path) {
  static const char* const get_only[] = {"/",           "/index.html", "/favicon.svg", "/favicon.ico",
                                         "/api/state",  "/api/history", "/api/events", "/api/logs",
                                         "/api/flight_recorder", "/api/ps_cluster", "/api/actors"};
  static const char* const post_only[] = {"/api/pause", "/api/resume", "/api/checkpoint", "/api/stop",
                                          "/api/learning_rate", "/api/control", "/api/actor_command"};
  for (const char* p : get_only) {
    if (path == p) return "GET";
  }
  if (detail::dashboard_script(path) != nullptr) return "GET";
  for (const char* p : post_only) {
    if (path == p) return "POST";
  }
  if (path == "/api/trace") return "GET, POST";
  return nullptr;
}

HttpResponse Monitor::Impl::handle(const detail::HttpRequest& r) {
  const char* allowed = allowed_methods(r.path);
  if (allowed == nullptr) return error(404, "no such page: " + r.path.substr(0, 64));
  if ((", " + std::string(allowed) + ",").find(" " + r.method + ",") == std::string::npos) {
    HttpResponse out = error(405, r.method.substr(0, 16) + " " + r.path + ": method not allowed (use " + allowed + ")");
    out.allow = allowed;
    return out;
  }
  if (r.method == "GET") return get(r);
  return post(r);
}

HttpResponse Monitor::Impl::get(const detail::HttpRequest& r) {
  if (r.path == "/" || r.path == "/index.html") {
    return {200, "text/html; charset=utf-8", std::string(detail::dashboard_html())};
  }
  if (const detail::DashboardScript* script = detail::dashboard_script(r.path)) {
    return {200, "application/javascript", std::string(script->body)};
  }
  if (r.path == "/favicon.svg" || r.path == "/favicon.ico") return {200, "image/svg+xml", favicon_svg};
  if (r.path == "/api/state") return {200, "application/json", state_json(r)};
  if (r.path == "/api/ps_cluster") {
    json ps = ps_cluster_json();
    if (ps.is_null()) {
      return error(404, "this run has no parameter-server cluster (ps_cluster is for ParameterServerStrategy's chief)");
    }
    return answer(200, ps);
  }
  if (r.path == "/api/actors") {
    json a;
    {
      std::lock_guard<std::mutex> lock(mutex);
      a = actors_json();
    }
    if (a.is_null()) {
      return error(404, "this run watches no actors (an ActorCluster reports them with ActorClusterOptions::on_event "
                        "= Monitor::actor_events())");
    }
    return answer(200, a);
  }
  if (r.path == "/api/flight_recorder") {
    // This process's last collectives and steps (docs/diagnosis.md has the format).
    const troupe::detail::FlightRecorder* recorder = troupe::detail::FlightRecorder::process();
    if (recorder == nullptr) {
      return error(404, "the flight recorder is off in this process (RuntimeOptions::flight_recorder_entries or "
                        "TROUPE_FLIGHT_RECORDER_ENTRIES is 0)");
    }
    return {200, "application/json", recorder->json("/api/flight_recorder")};
  }
  if (r.path == "/api/history") {
    std::string h = stream->history_json(std::chrono::seconds(5));
    if (h.empty()) return error(503, "the metrics stream did not answer");
    return {200, "application/json", std::move(h)};
  }
  if (r.path == "/api/logs") {
    const std::string text = detail::query_value(r.query, "worker");
    const auto w = text.empty() ? std::optional<long long>(worker) : base::parse_int(text);
    if (!w || *w < 0 || *w >= workers) {
      return error(400, "logs: worker \"" + text.substr(0, 64) + "\" is not a worker of this run (0.." +
                            std::to_string(workers - 1) + ")");
    }
    if (*w != worker) {
      // Another worker's: the last lines its heartbeat carried (checked where they arrived).
      const actors::cluster_snapshot cluster =
          health ? health->snapshot(actors::cluster_health::clock::now()) : actors::cluster_snapshot{};
      const int id = cluster_id(cluster, static_cast<int>(*w));
      if (!cluster.watching || id < 0 || static_cast<std::size_t>(id) >= cluster.workers.size()) {
        return error(404, "logs: worker " + std::to_string(*w) + " has sent no report yet");
      }
      const actors::worker_report& report = cluster.workers[static_cast<std::size_t>(id)].report;
      return answer(200, json{{"worker", *w},
                              {"lines", json(report.lines)},
                              {"lines_total", report.lines_total},
                              {"from", "heartbeat"}});
    }
    std::lock_guard<std::mutex> lock(mutex);
    return answer(200, json{{"worker", worker},
                            {"lines", json(std::vector<std::string>(log_lines.begin(), log_lines.end()))},
                            {"lines_total", log_lines_total},
                            {"from", "self"}});
  }
  // GET /api/trace: the last trace written.
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mutex);
    path = trace_written;
  }
  if (path.empty()) return error(404, "no trace written yet: POST /api/trace?steps=N records the next N steps");
  std::ifstream in(path, std::ios::binary);
  std::string body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return {200, "application/json", std::move(body)};
}

HttpResponse Monitor::Impl::post(const detail::HttpRequest& r) {
  if (r.path == "/api/pause") return enqueue(detail::pause, 0);
  if (r.path == "/api/resume") return enqueue(detail::resume, 0);
  if (r.path == "/api/checkpoint" || r.path == "/api/stop") {
    const bool stop = r.path == "/api/stop";
    const std::string with = detail::query_value(r.query, "checkpoint");
    if (stop && (with == "0" || with == "false")) return enqueue(detail::stop_without_checkpoint, 0);
    bool can = false;
    {
      std::lock_guard<std::mutex> lock(mutex);
      can = can_checkpoint_locked();
    }
    if (!can) {
      return error(409, std::string(stop ? "stop with a checkpoint" : "checkpoint") +
                            ": this trainer saves no checkpoints (start it with a checkpoint directory)" +
                            (stop ? "; POST /api/stop?checkpoint=0 stops without one" : ""));
    }
    return enqueue(stop ? detail::stop : detail::checkpoint, 0);
  }
  if (r.path == "/api/control") return set_control(r);
  if (r.path == "/api/actor_command") return actor_command(r);
  if (r.path == "/api/learning_rate") {
    const std::string text = detail::query_value(r.query, "value");
    const auto v = base::parse_double(text);
    if (!v || !std::isfinite(*v) || *v <= 0 || *v > 1e6) {
      return error(400, "learning_rate: value \"" + text.substr(0, 64) +
                            "\" is not a positive number (e.g. /api/learning_rate?value=0.001)");
    }
    if (!optimizer) return error(409, "this trainer has no optimizer to steer");
    return enqueue(detail::set_learning_rate, *v);
  }
  // POST /api/trace
  const std::string text = detail::query_value(r.query, "steps");
  const auto n = text.empty() ? std::optional<long long>(100) : base::parse_int(text);
  if (!n || *n < 1 || *n > max_trace_steps) {
    return error(400, "trace: steps \"" + text.substr(0, 64) + "\" is not a number in 1.." +
                          std::to_string(max_trace_steps));
  }
  return enqueue(detail::trace, static_cast<double>(*n));
}

// POST /api/control?name=N&value=X: one of the application's controls, from the next step boundary.
HttpResponse Monitor::Impl::set_control(const detail::HttpRequest& r) {
  const std::string name = detail::query_value(r.query, "name");
  const std::string text = detail::query_value(r.query, "value");
  std::lock_guard<std::mutex> lock(mutex);
  if (stopped) return error(409, "the training has stopped");
  if (!end_status.empty()) return error(409, "the training has ended (" + end_status + ")");
  AppControl* found = nullptr;
  std::string known;
  for (AppControl& c : app_controls) {
    if (c.spec.name == name) found = &c;
    known += (known.empty() ? "" : ", ") + c.spec.name;
  }
  if (found == nullptr) {
    return error(400, "control: no control named \"" + base::printable_line(name, 64) + "\" (this trainer has: " +
                          (known.empty() ? "none" : known) + ")");
  }
  const auto v = base::parse_double(text);
  const MonitorControl& spec = found->spec;
  if (!v || !std::isfinite(*v) || *v < spec.min || *v > spec.max) {
    std::ostringstream range;
    range << spec.min << ".." << spec.max;
    return error(400, "control " + spec.name + ": value \"" + base::printable_line(text, 64) +
                          "\" is not a number in " + range.str() + " (e.g. /api/control?name=" + spec.name +
                          "&value=" + json(found->value).dump() + ")");
  }
  found->pending = *v;
  controls_pending = true;
  return answer(200, json{{"ok", true},
                          {"command", "control"},
                          {"name", spec.name},
                          {"value", *v},
                          {"applies", "at the next step boundary, in the process serving this page"}});
}

// POST /api/actor_command?id=N&action=A: an action the application offers (add_actor_action) on
// one running actor of the Actors card, waiting for the application to take it at its boundary.
HttpResponse Monitor::Impl::actor_command(const detail::HttpRequest& r) {
  const std::string id_text = detail::query_value(r.query, "id");
  const std::string action = detail::query_value(r.query, "action");
  std::lock_guard<std::mutex> lock(mutex);
  if (stopped) return error(409, "the training has stopped");
  if (!end_status.empty()) return error(409, "the training has ended (" + end_status + ")");
  std::string offered;
  bool known_action = false;
  for (const ActorAction& a : actor_actions) {
    known_action |= a.name == action;
    offered += (offered.empty() ? "" : ", ") + a.name;
  }
  if (!known_action) {
    return error(400, "actor_command: no action named \"" + base::printable_line(action, 64) + "\" (this trainer offers: " +
                          (offered.empty() ? "none" : offered) + ")");
  }
  const auto id = base::parse_int(id_text);
  if (!id || *id < 0) {
    return error(400, "actor_command: id \"" + base::printable_line(id_text, 64) +
                          "\" is not an actor's id (a row's number, e.g. /api/actor_command?id=3&action=" + action + ")");
  }
  const actors::actor_row* row = nullptr;
  actors::actor_board_view board;
  if (actor_board) {
    board = actor_board->snapshot(actors::actor_board::clock::now());
    for (const actors::actor_row& a : board.rows) {
      if (a.id == static_cast<std::uint64_t>(*id)) row = &a;
    }
  }
  if (row == nullptr) {
    return error(400, "actor_command: no actor with id " + std::to_string(*id) +
                          " on the Actors card (a row's id; a respawned actor's row has its new one)");
  }
  const std::string who = row->label.empty() ? "actor #" + std::to_string(row->id) : row->label + " (#" + std::to_string(row->id) + ")";
  if (row->down) {
    return error(409, "actor_command: " + who + " is " + (row->stopped ? "stopped" : "down") +
                          ": actions are for running actors");
  }
  if (actor_commands.size() >= Monitor::max_pending_actor_commands) {
    return error(503, "too many actor commands waiting for the trainer to take them");
  }
  actor_commands.push_back({row->id, row->label, action});
  return answer(200, json{{"ok", true},
                          {"command", "actor_command"},
                          {"id", row->id},
                          {"label", row->label.empty() ? json(nullptr) : json(row->label)},
                          {"action", action},
                          {"applies", "when the trainer takes it, at its next boundary"}});
}

}  // namespace troupe
