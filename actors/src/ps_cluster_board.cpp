#include "troupe/actors/ps_cluster_board.hpp"

#include <algorithm>

namespace troupe::actors {

const char* to_string(ps_worker_state s) noexcept {
  switch (s) {
    case ps_worker_state::connecting: return "connecting";
    case ps_worker_state::idle: return "idle";
    case ps_worker_state::running: return "running";
    case ps_worker_state::set_aside: return "set_aside";
    case ps_worker_state::lost: return "lost";
  }
  return "unknown";
}

const char* to_string(ps_event_kind k) noexcept {
  switch (k) {
    case ps_event_kind::worker_lost: return "worker_lost";
    case ps_event_kind::worker_back: return "worker_back";
    case ps_event_kind::closures_retried: return "closures_retried";
    case ps_event_kind::closures_cancelled: return "closures_cancelled";
    case ps_event_kind::closure_failed: return "closure_failed";
    case ps_event_kind::stall: return "stall";
    case ps_event_kind::ps_lost: return "ps_lost";
    case ps_event_kind::ps_back: return "ps_back";
  }
  return "unknown";
}

namespace {

double ms_between(ps_cluster_board::clock::time_point from, ps_cluster_board::clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

}  // namespace

void ps_cluster_board::rate_samples::add(clock::time_point now, double value) {
  if (!started) {
    started = true;
    first = now;
    last = value;
  }
  // A count that went down restarted from 0 (a ps task restarted alone): all of it is new.
  const double delta = value >= last ? value - last : value;
  last = value;
  const auto start = clock::time_point{} + (now.time_since_epoch() / sample_every) * sample_every;
  if (buckets.empty() || buckets.back().first < start) {
    buckets.emplace_back(start, delta);
  } else {
    buckets.back().second += delta;
  }
  while (!buckets.empty() && buckets.front().first + sample_every <= now - rate_window) buckets.pop_front();
}

double ps_cluster_board::rate_samples::per_second(clock::time_point now) const {
  if (!started) return 0;
  double sum = 0;
  for (const auto& [start, increments] : buckets) {
    if (start + sample_every > now - rate_window) sum += increments;
  }
  const auto span = std::min<clock::duration>(rate_window, now - first);
  const double seconds = std::chrono::duration<double>(span).count();
  return seconds > 0 ? sum / seconds : 0.0;
}

ps_cluster_board::ps_cluster_board(std::vector<std::string> workers, std::vector<std::string> ps,
                                   std::size_t capacity)
    : capacity_(std::max<std::size_t>(1, capacity)) {
  for (auto& w : workers) {
    worker_entry e;
    e.task = std::move(w);
    workers_.push_back(std::move(e));
  }
  for (auto& p : ps) {
    ps_entry e;
    e.task = std::move(p);
    ps_.push_back(std::move(e));
  }
}

void ps_cluster_board::record(ps_event_kind kind, int worker, int ps, std::uint64_t count, const std::string& text,
                              clock::time_point now) {
  ps_event e;
  e.sequence = ++total_;
  e.at = now;
  e.wall = std::chrono::system_clock::now() -
           std::chrono::duration_cast<std::chrono::system_clock::duration>(clock::now() - now);
  e.kind = kind;
  e.worker = worker;
  e.ps = ps;
  e.count = count;
  e.text = text.substr(0, max_text_bytes);
  e.step = step_.load(std::memory_order_relaxed);
  if (events_.size() == capacity_) events_.pop_front();
  events_.push_back(std::move(e));
}

void ps_cluster_board::sample_locked(clock::time_point now) {
  done_rate_.add(now, static_cast<double>(done_));
  for (auto& w : workers_) {
    w.rate.add(now, static_cast<double>(w.done));
    w.sample_rate.add(now, static_cast<double>(w.samples));
  }
}

void ps_cluster_board::scheduled(clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++scheduled_;
  sample_locked(now);
}

void ps_cluster_board::set_queue(std::size_t queued, const std::vector<std::size_t>& in_flight) {
  std::lock_guard<std::mutex> lock(mutex_);
  queued_ = queued;
  for (std::size_t w = 0; w < workers_.size() && w < in_flight.size(); ++w) {
    worker_entry& e = workers_[w];
    e.in_flight = in_flight[w];
    if (e.state == ps_worker_state::idle || e.state == ps_worker_state::running) {
      e.state = e.in_flight > 0 ? ps_worker_state::running : ps_worker_state::idle;
    }
  }
}

void ps_cluster_board::worker_up(int w, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!known_worker(w)) return;
  worker_entry& e = workers_[static_cast<std::size_t>(w)];
  const bool back = e.state == ps_worker_state::lost || e.state == ps_worker_state::set_aside;
  e.state = e.in_flight > 0 ? ps_worker_state::running : ps_worker_state::idle;
  e.reached = true;
  sample_locked(now);
  if (back) record(ps_event_kind::worker_back, w, -1, 0, e.task + " takes closures again", now);
}

void ps_cluster_board::worker_lost(int w, const std::string& reason, std::uint64_t retried, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!known_worker(w)) return;
  worker_entry& e = workers_[static_cast<std::size_t>(w)];
  e.state = ps_worker_state::lost;
  e.in_flight = 0;
  ++e.times_lost;
  ++workers_lost_;
  record(ps_event_kind::worker_lost, w, -1, 0, "lost " + e.task + ": " + reason, now);
  if (retried > 0) {
    retried_ += retried;
    record(ps_event_kind::closures_retried, w, -1, retried,
           std::to_string(retried) + " closure(s) in flight on " + e.task + " queued again for the other workers", now);
  }
}

void ps_cluster_board::worker_set_aside(int w, const std::string& line, std::uint64_t retried, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!known_worker(w)) return;
  worker_entry& e = workers_[static_cast<std::size_t>(w)];
  e.state = ps_worker_state::set_aside;
  e.in_flight = 0;
  record(ps_event_kind::stall, w, -1, 0, line, now);
  if (retried > 0) {
    retried_ += retried;
    record(ps_event_kind::closures_retried, w, -1, retried,
           std::to_string(retried) + " closure(s) in flight on " + e.task + " queued again for the other workers", now);
  }
}

void ps_cluster_board::closure_done(int w, const std::string& error, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!known_worker(w)) return;
  worker_entry& e = workers_[static_cast<std::size_t>(w)];
  ++e.done;
  ++done_;
  e.has_result = true;
  e.last_result = now;
  if (!error.empty()) {
    ++e.failed;
    ++failed_;
    record(ps_event_kind::closure_failed, w, -1, 1, error, now);
  }
  sample_locked(now);
}

void ps_cluster_board::samples_done(int w, std::uint64_t samples, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!known_worker(w)) return;
  workers_[static_cast<std::size_t>(w)].samples += samples;
  sample_locked(now);
}

void ps_cluster_board::closures_cancelled(std::uint64_t n, clock::time_point now) {
  if (n == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  cancelled_ += n;
  record(ps_event_kind::closures_cancelled, -1, -1, n,
         std::to_string(n) + " closure(s) cancelled before they ran (a closure failed)", now);
}

void ps_cluster_board::stall(const std::string& line, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  record(ps_event_kind::stall, -1, -1, 0, line, now);
}

void ps_cluster_board::ps_report(int p, const ps_task_counters& counters, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (p < 0 || static_cast<std::size_t>(p) >= ps_.size()) return;
  ps_entry& e = ps_[static_cast<std::size_t>(p)];
  e.reported = true;
  e.counters = counters;
  e.last_report = now;
  e.updates.add(now, static_cast<double>(counters.updates));
  e.bytes_in.add(now, static_cast<double>(counters.bytes_in));
  e.bytes_out.add(now, static_cast<double>(counters.bytes_out));
}

void ps_cluster_board::ps_lost(int p, const std::string& reason, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (p < 0 || static_cast<std::size_t>(p) >= ps_.size()) return;
  ps_entry& e = ps_[static_cast<std::size_t>(p)];
  if (e.lost) return;
  e.lost = true;
  record(ps_event_kind::ps_lost, -1, p, 0, "lost " + e.task + ": " + reason, now);
}

void ps_cluster_board::ps_back(int p, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (p < 0 || static_cast<std::size_t>(p) >= ps_.size()) return;
  ps_entry& e = ps_[static_cast<std::size_t>(p)];
  if (!e.lost) return;
  e.lost = false;
  record(ps_event_kind::ps_back, -1, p, 0, e.task + " reached again (restarted)", now);
}

ps_cluster_view ps_cluster_board::snapshot(clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  sample_locked(now);
  ps_cluster_view v;
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    const worker_entry& e = workers_[i];
    ps_worker_view w;
    w.index = static_cast<int>(i);
    w.task = e.task;
    w.state = e.state;
    w.done = e.done;
    w.failed = e.failed;
    w.in_flight = e.in_flight;
    w.closures_per_s = e.rate.per_second(now);
    w.samples = e.samples;
    w.samples_per_s = e.sample_rate.per_second(now);
    w.last_result_age_ms = e.has_result ? ms_between(e.last_result, now) : -1;
    w.times_lost = e.times_lost;
    v.in_flight += e.in_flight;
    v.workers.push_back(std::move(w));
  }
  for (std::size_t i = 0; i < ps_.size(); ++i) {
    const ps_entry& e = ps_[i];
    ps_task_view p;
    p.index = static_cast<int>(i);
    p.task = e.task;
    p.lost = e.lost;
    p.reported = e.reported;
    p.counters = e.counters;
    if (e.reported) {
      // Rates as of the last report: a ps task that stopped reporting shows its age, not a fall.
      p.updates_per_s = e.updates.per_second(e.last_report);
      p.bytes_in_per_s = e.bytes_in.per_second(e.last_report);
      p.bytes_out_per_s = e.bytes_out.per_second(e.last_report);
      p.report_age_ms = ms_between(e.last_report, now);
    }
    v.ps.push_back(std::move(p));
  }
  v.queued = queued_;
  v.scheduled = scheduled_;
  v.done = done_;
  v.failed = failed_;
  v.retried = retried_;
  v.cancelled = cancelled_;
  v.workers_lost = workers_lost_;
  v.closures_per_s = done_rate_.per_second(now);
  v.events.assign(events_.rbegin(), events_.rend());
  v.events_total = total_;
  return v;
}

}  // namespace troupe::actors
