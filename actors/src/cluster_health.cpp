#include "troupe/actors/cluster_health.hpp"

#include <algorithm>

namespace troupe::actors {

const char* to_string(worker_state s) noexcept {
  switch (s) {
    case worker_state::alive: return "alive";
    case worker_state::late: return "late";
    case worker_state::lost: return "lost";
    case worker_state::left: return "left";
  }
  return "unknown";
}

const char* to_string(cluster_event_kind k) noexcept {
  switch (k) {
    case cluster_event_kind::worker_late: return "worker_late";
    case cluster_event_kind::worker_back: return "worker_back";
    case cluster_event_kind::worker_lost: return "worker_lost";
    case cluster_event_kind::fault_reported: return "fault_reported";
    case cluster_event_kind::connection_refused: return "connection_refused";
    case cluster_event_kind::collective_error: return "collective_error";
    case cluster_event_kind::stall: return "stall";
    case cluster_event_kind::stall_cleared: return "stall_cleared";
    case cluster_event_kind::membership_changed: return "membership_changed";
    case cluster_event_kind::worker_joined: return "worker_joined";
  }
  return "unknown";
}

cluster_health::cluster_health(std::size_t capacity) : capacity_(std::max<std::size_t>(capacity, 1)) {}

void cluster_health::start(std::vector<std::string> tasks, std::chrono::milliseconds interval,
                           int late_after_intervals, std::string incarnation, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  watching_ = true;
  interval_ = interval;
  late_after_ = std::max(late_after_intervals, 1);
  incarnation_ = std::move(incarnation);
  workers_.clear();
  ring_.clear();
  for (std::size_t r = 0; r < tasks.size(); ++r) {
    worker_health w;
    w.rank = static_cast<int>(r);
    w.task = std::move(tasks[r]);
    w.last_beat = now;
    workers_.push_back(std::move(w));
  }
}

void cluster_health::set_restart_count(int restarts) {
  std::lock_guard<std::mutex> lock(mutex_);
  restart_count_ = restarts;
}

void cluster_health::beat(int rank, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!watching_ || !known(rank)) return;
  worker_health& w = workers_[static_cast<std::size_t>(rank)];
  w.heard = true;
  w.last_beat = std::max(w.last_beat, now);
  if (w.state == worker_state::late || w.state == worker_state::lost) {
    const auto silent = w.state;
    w.state = worker_state::alive;
    record(cluster_event_kind::worker_back, rank, {},
           w.task + " beats again (it was " + to_string(silent) + ")", now);
  }
}

std::optional<std::string> cluster_health::report(int rank, const worker_report& r) {
  if (auto bad = check_worker_report(r)) return bad;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!watching_ || !known(rank)) return std::nullopt;
  worker_health& w = workers_[static_cast<std::size_t>(rank)];
  w.reported = true;
  w.report.cpu_percent = r.cpu_percent;
  w.report.rss_bytes = r.rss_bytes;
  if (!r.lines.empty()) {
    w.report.lines = r.lines;
    w.report.lines_total = r.lines_total;
  }
  return std::nullopt;
}

void cluster_health::lost(int rank, const std::string& reason, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (known(rank)) workers_[static_cast<std::size_t>(rank)].state = worker_state::lost;
  record(cluster_event_kind::worker_lost, rank, {}, reason, now);
}

void cluster_health::left(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (known(rank)) workers_[static_cast<std::size_t>(rank)].state = worker_state::left;
}

void cluster_health::fault(int rank, const std::string& what, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  record(cluster_event_kind::fault_reported, rank, {}, what, now);
}

void cluster_health::refused(const std::string& address, const std::string& reason, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  record(cluster_event_kind::connection_refused, -1, address.substr(0, 128), reason, now);
}

void cluster_health::collective_error(const std::string& what, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  record(cluster_event_kind::collective_error, -1, {}, what, now);
}

void cluster_health::membership_changed(const std::string& what, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  record(cluster_event_kind::membership_changed, -1, {}, what, now);
}

void cluster_health::membership_changed(membership_record change, const std::string& what, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  record(cluster_event_kind::membership_changed, -1, {}, what, now);
  change.wall = events_.back().wall;
  ring_ = change.ring;
  if (changes_.size() == capacity_) changes_.pop_front();
  changes_.push_back(std::move(change));
}

void cluster_health::add_worker(int id, std::string task, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!watching_ || id < 0 || known(id)) return;
  const std::string text = task + " joined as worker " + std::to_string(id);
  while (workers_.size() <= static_cast<std::size_t>(id)) {
    // Ids are given in order; one skipped (never admitted) stays a placeholder that left.
    worker_health w;
    w.rank = static_cast<int>(workers_.size());
    w.state = worker_state::left;
    w.last_beat = now;
    workers_.push_back(std::move(w));
  }
  worker_health& w = workers_[static_cast<std::size_t>(id)];
  w.task = std::move(task);
  w.state = worker_state::alive;
  record(cluster_event_kind::worker_joined, id, {}, text, now);
}

void cluster_health::stall(const std::string& line, bool event, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  const bool cleared = line.rfind("stall cleared", 0) == 0;
  stall_ = cleared ? std::string() : line.substr(0, max_text_bytes);
  if (event) record(cleared ? cluster_event_kind::stall_cleared : cluster_event_kind::stall, -1, {}, line, now);
}

void cluster_health::observe(clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  observe_locked(now);
}

void cluster_health::observe_locked(clock::time_point now) {
  if (!watching_) return;
  const auto late_after = interval_ * late_after_;
  for (worker_health& w : workers_) {
    if (w.state != worker_state::alive || now - w.last_beat <= late_after) continue;
    w.state = worker_state::late;
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - w.last_beat);
    record(cluster_event_kind::worker_late, w.rank, {},
           w.task + " sent no heartbeat for " + std::to_string(silent.count()) + " ms (more than " +
               std::to_string(late_after_) + " intervals of " + std::to_string(interval_.count()) + " ms)",
           now);
  }
}

cluster_snapshot cluster_health::snapshot(clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  observe_locked(now);
  cluster_snapshot s;
  s.watching = watching_;
  s.interval = interval_;
  s.late_after_intervals = late_after_;
  s.incarnation = incarnation_;
  s.restart_count = restart_count_;
  s.workers = workers_;
  s.ring = ring_;
  s.changes.assign(changes_.begin(), changes_.end());
  s.events.assign(events_.rbegin(), events_.rend());
  s.events_total = total_;
  s.stall = stall_;
  return s;
}

void cluster_health::record(cluster_event_kind kind, int rank, std::string address, const std::string& text,
                            clock::time_point now) {
  cluster_event e;
  e.sequence = ++total_;
  e.at = now;
  // The wall clock of `now`: the steady clock's distance from now, taken off the wall clock's now.
  e.wall = std::chrono::system_clock::now() -
           std::chrono::duration_cast<std::chrono::system_clock::duration>(clock::now() - now);
  e.kind = kind;
  e.rank = rank;
  e.step = step_.load(std::memory_order_relaxed);
  e.address = std::move(address);
  e.text = text.size() > max_text_bytes ? text.substr(0, max_text_bytes) + "..." : text;
  if (events_.size() == capacity_) events_.pop_front();
  events_.push_back(std::move(e));
}

}  // namespace troupe::actors
