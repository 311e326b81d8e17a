#include "troupe/actors/stall_inspector.hpp"

#include <algorithm>
#include <cstdio>

namespace troupe::actors {

namespace {

const char* dtype_name(std::int32_t code) {
  static const char* names[] = {"float32", "float64", "int32", "int64", "float16", "bfloat16"};
  if (code < 0 || code >= worker_position_limits::dtypes) return "no dtype";
  return names[code];
}

std::string tenths(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

std::chrono::milliseconds ms(std::int64_t v) { return std::chrono::milliseconds(v); }

}  // namespace

const char* to_string(worker_phase p) noexcept {
  switch (p) {
    case worker_phase::none: return "none";
    case worker_phase::input: return "input";
    case worker_phase::compute: return "compute";
    case worker_phase::collective: return "collective";
  }
  return "unknown";
}

const char* to_string(position_op op) noexcept {
  switch (op) {
    case position_op::none: return "";
    case position_op::all_reduce: return "all_reduce";
    case position_op::broadcast: return "broadcast";
    case position_op::all_gather: return "all_gather";
  }
  return "unknown";
}

std::string human_bytes(std::uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::optional<std::string> check_worker_position(const worker_position& p, int world) {
  using L = worker_position_limits;
  if (p.phase > worker_phase::collective) {
    return "phase " + std::to_string(static_cast<int>(p.phase)) + " (expected 0..3)";
  }
  if (p.step > L::max_step) return "step " + std::to_string(p.step) + " (expected at most 2^62)";
  if (p.collective < -1 || p.collective > L::max_collective) {
    return "collective " + std::to_string(p.collective) + " (expected -1..2^40)";
  }
  if (p.op > position_op::all_gather) return "op " + std::to_string(static_cast<int>(p.op)) + " (expected 0..3)";
  if (p.dtype < -1 || p.dtype >= L::dtypes) return "dtype " + std::to_string(p.dtype) + " (expected -1..5)";
  if (p.bytes > L::max_bytes) return "bytes " + std::to_string(p.bytes) + " (expected at most 2^50)";
  if (p.phase_ms < 0 || p.phase_ms > L::max_ms) return "phase_ms " + std::to_string(p.phase_ms) + " (expected 0..2^40)";
  if (p.ring_peer < -1 || p.ring_peer >= world) {
    return "ring_peer " + std::to_string(p.ring_peer) + " (expected -1.." + std::to_string(world - 1) + ")";
  }
  if (p.ring_idle_ms < -1 || p.ring_idle_ms > L::max_ms) {
    return "ring_idle_ms " + std::to_string(p.ring_idle_ms) + " (expected -1..2^40)";
  }
  if (p.ring_sent > L::max_step || p.ring_received > L::max_step) {
    return "ring_sent " + std::to_string(p.ring_sent) + " or ring_received " + std::to_string(p.ring_received) +
           " (expected at most 2^62)";
  }
  return std::nullopt;
}

void position_board::begin_step(std::uint64_t step) noexcept {
  step_.store(step, std::memory_order_relaxed);
  collective_.store(-1, std::memory_order_relaxed);
  since_ns_.store(clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  phase_.store(static_cast<std::uint8_t>(worker_phase::compute), std::memory_order_release);
}

void position_board::end_step() noexcept {
  since_ns_.store(clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  phase_.store(static_cast<std::uint8_t>(worker_phase::input), std::memory_order_release);
}

void position_board::begin_collective(std::uint64_t step, std::int64_t collective, position_op op, int dtype,
                                      std::uint64_t bytes) noexcept {
  step_.store(step, std::memory_order_relaxed);
  collective_.store(collective, std::memory_order_relaxed);
  op_.store(static_cast<std::uint8_t>(op), std::memory_order_relaxed);
  dtype_.store(dtype, std::memory_order_relaxed);
  bytes_.store(bytes, std::memory_order_relaxed);
  since_ns_.store(clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  phase_.store(static_cast<std::uint8_t>(worker_phase::collective), std::memory_order_release);
}

void position_board::end_collective() noexcept {
  since_ns_.store(clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  phase_.store(static_cast<std::uint8_t>(worker_phase::compute), std::memory_order_release);
}

void position_board::set_ring_probe(std::function<ring_progress()> probe) {
  std::lock_guard<std::mutex> lock(probe_mutex_);
  probe_ = std::move(probe);
}

worker_position position_board::read(clock::time_point now) const {
  worker_position p;
  p.phase = static_cast<worker_phase>(phase_.load(std::memory_order_acquire));
  p.step = step_.load(std::memory_order_relaxed);
  p.collective = p.phase == worker_phase::collective ? collective_.load(std::memory_order_relaxed) : -1;
  if (p.phase == worker_phase::collective) {
    p.op = static_cast<position_op>(op_.load(std::memory_order_relaxed));
    p.dtype = dtype_.load(std::memory_order_relaxed);
    p.bytes = bytes_.load(std::memory_order_relaxed);
  }
  const clock::time_point since{clock::duration(since_ns_.load(std::memory_order_relaxed))};
  if (p.phase != worker_phase::none) {
    p.phase_ms = std::clamp<std::int64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(now - since).count(), 0, worker_position_limits::max_ms);
  }
  if (p.phase == worker_phase::collective) {
    std::lock_guard<std::mutex> lock(probe_mutex_);
    if (probe_) {
      const ring_progress r = probe_();
      p.ring_peer = r.peer;
      p.ring_sent = r.sent;
      p.ring_received = r.received;
      if (r.last != clock::time_point{}) {
        // Progress before this collective began counts from its start.
        const auto last = std::max(r.last, since);
        p.ring_idle_ms = std::clamp<std::int64_t>(
            std::chrono::duration_cast<std::chrono::milliseconds>(now - last).count(), 0,
            worker_position_limits::max_ms);
      }
    }
  }
  return p;
}

stall_inspector::stall_inspector(int world, stall_options options)
    : options_(options), workers_(static_cast<std::size_t>(std::max(world, 0))) {}

void stall_inspector::position(int rank, const worker_position& p, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (rank < 0 || static_cast<std::size_t>(rank) >= workers_.size()) return;
  seen& s = workers_[static_cast<std::size_t>(rank)];
  if (s.known && now < s.at) return;  // an older beat than the one kept
  s.known = true;
  s.p = p;
  s.at = now;
}

void stall_inspector::add_worker() {
  std::lock_guard<std::mutex> lock(mutex_);
  workers_.emplace_back();
}

void stall_inspector::drop(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (rank >= 0 && static_cast<std::size_t>(rank) < workers_.size()) workers_[static_cast<std::size_t>(rank)].gone = true;
}

std::string stall_inspector::describe(clock::time_point now, std::chrono::milliseconds& longest) const {
  using std::chrono::duration_cast;
  using std::chrono::milliseconds;
  auto since_beat = [&](const seen& s) { return std::max(milliseconds(0), duration_cast<milliseconds>(now - s.at)); };
  auto in_phase = [&](const seen& s) { return ms(s.p.phase_ms) + since_beat(s); };
  // The collective: the one its longest waiter waits in, among the workers that still beat (a
  // silent worker's last position is only where it was); the silent ones when none beats.
  auto fresh = [&](const seen& s) { return since_beat(s) <= options_.late_after; };
  int key = -1;
  bool key_fresh = false;
  for (std::size_t r = 0; r < workers_.size(); ++r) {
    const seen& s = workers_[r];
    if (s.gone || !s.known || s.p.phase != worker_phase::collective) continue;
    const bool f = fresh(s);
    if (key < 0 || (f && !key_fresh) ||
        (f == key_fresh && in_phase(s) > in_phase(workers_[static_cast<std::size_t>(key)]))) {
      key = static_cast<int>(r);
      key_fresh = f;
    }
  }
  if (key < 0) return {};
  const seen& k = workers_[static_cast<std::size_t>(key)];
  longest = in_phase(k);
  if (longest <= options_.warning) return {};
  const worker_position& kp = k.p;
  std::vector<int> waiting, others;
  for (std::size_t r = 0; r < workers_.size(); ++r) {
    const seen& s = workers_[r];
    if (s.gone) continue;
    const bool same = s.known && s.p.phase == worker_phase::collective && s.p.step == kp.step &&
                      s.p.collective == kp.collective && (fresh(s) || !key_fresh);
    (same ? waiting : others).push_back(static_cast<int>(r));
  }
  std::string line = "stall: step " + std::to_string(kp.step) + " " + to_string(kp.op) + " #" +
                     std::to_string(kp.collective) + " (" + dtype_name(kp.dtype) + ", " + human_bytes(kp.bytes) +
                     "): " + (waiting.size() == 1 ? "worker " : "workers ");
  for (std::size_t i = 0; i < waiting.size(); ++i) line += (i ? ", " : "") + std::to_string(waiting[i]);
  line += " waiting " + whole_seconds(longest);
  for (int r : others) {
    const seen& s = workers_[static_cast<std::size_t>(r)];
    line += "; worker " + std::to_string(r);
    if (!s.known) {
      line += " sent no position yet";
      continue;
    }
    std::string where;
    switch (s.p.phase) {
      case worker_phase::none: where = "before its first step"; break;
      case worker_phase::input: where = "in input after step " + std::to_string(s.p.step); break;
      case worker_phase::compute: where = "in step " + std::to_string(s.p.step) + " compute"; break;
      case worker_phase::collective:
        where = "waiting in step " + std::to_string(s.p.step) + " " + to_string(s.p.op) + " #" +
                std::to_string(s.p.collective);
        break;
    }
    if (since_beat(s) > options_.late_after) {
      // Its heartbeats stopped: where it was is all that is known.
      line += " is silent: its last heartbeat, " + tenths(since_beat(s)) + " ago, had it " + where;
    } else {
      line += " is " + where + (s.p.phase == worker_phase::none ? "" : " since " + whole_seconds(in_phase(s))) +
              " (last heartbeat " + tenths(since_beat(s)) + " ago)";
    }
  }
  if (others.empty()) {
    // Every worker waits in the same collective: a link that moves nothing. One whose sender sent
    // bytes its receiver never got lost them on the way.
    // The ring runs through the workers still in, in id order (a joiner's id comes after those of
    // the members it joined).
    const int world = static_cast<int>(waiting.size());
    // A worker by its id, with its rank in the ring when a change of members made them differ
    // (a position names its ring neighbour by rank).
    auto named = [&](int id, int rank) {
      return "worker " + std::to_string(id) + (id != rank ? " (ring rank " + std::to_string(rank) + ")" : "");
    };
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      const int r = waiting[i];
      const int from = waiting[(i + waiting.size() - 1) % waiting.size()];
      const seen& receiver = workers_[static_cast<std::size_t>(r)];
      const seen& sender = workers_[static_cast<std::size_t>(from)];
      if (world < 2 || receiver.p.ring_idle_ms < 0 || sender.p.ring_idle_ms < 0) continue;
      if (sender.p.ring_sent > receiver.p.ring_received) {
        line += "; every worker waits in it: the ring link from " +
                named(from, static_cast<int>((i + waiting.size() - 1) % waiting.size())) + " to " +
                named(r, static_cast<int>(i)) + " lost " + std::to_string(sender.p.ring_sent - receiver.p.ring_received) +
                " bytes (sent, never received) and moved no byte for " +
                whole_seconds(ms(receiver.p.ring_idle_ms) + since_beat(receiver));
        return line;
      }
    }
    int to = -1;
    milliseconds idle{-1};
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      const seen& s = workers_[static_cast<std::size_t>(waiting[i])];
      if (s.p.ring_peer < 0 || s.p.ring_idle_ms < 0) continue;
      const milliseconds t = ms(s.p.ring_idle_ms) + since_beat(s);
      if (t > idle) {
        idle = t;
        to = static_cast<int>(i);
      }
    }
    line += "; every worker waits in it";
    if (to >= 0) {
      const int id = waiting[static_cast<std::size_t>(to)];
      const int peer = workers_[static_cast<std::size_t>(id)].p.ring_peer;
      // The neighbour it waits on is a rank of the ring, which runs through the waiting workers.
      const std::string from = peer < world ? named(waiting[static_cast<std::size_t>(peer)], peer)
                                            : "ring rank " + std::to_string(peer);
      line += ": the ring link from " + from + " to " + named(id, to) + " moved no byte for " + whole_seconds(idle);
    }
  }
  // A waiter whose heartbeats stopped is stopped or cut off itself.
  for (int r : waiting) {
    const seen& s = workers_[static_cast<std::size_t>(r)];
    if (since_beat(s) > options_.late_after) {
      line += "; worker " + std::to_string(r) + "'s last heartbeat was " + tenths(since_beat(s)) + " ago";
    }
  }
  return line;
}

stall_verdict stall_inspector::check(clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  stall_verdict v;
  std::chrono::milliseconds longest{0};
  const std::string line = describe(now, longest);
  if (line.empty()) {
    if (printed_) {
      v.cleared = true;
      v.line = "stall cleared: " + last_key_ + " completed; every worker moved on";
    }
    printed_ = false;
    current_.clear();
    return v;
  }
  v.stalled = true;
  v.line = line;
  current_ = line;
  // The collective named, without the waits: "step 812 all_reduce #3".
  last_key_ = line.substr(7, line.find(" (") - 7);
  if (!printed_ || now >= next_print_) {
    v.print = true;
    backoff_ = printed_ ? std::min(backoff_ * 2, stall_max_backoff) : std::max(options_.warning, std::chrono::milliseconds(1000));
    next_print_ = now + backoff_;
    printed_ = true;
  }
  if (options_.shutdown.count() > 0 && longest > options_.shutdown && !shut_) {
    shut_ = true;
    v.shutdown = true;
  }
  return v;
}

std::string stall_inspector::current() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_;
}

}  // namespace troupe::actors
