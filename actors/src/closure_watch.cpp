#include "troupe/actors/closure_watch.hpp"

#include "troupe/actors/stall_inspector.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace troupe::actors {

namespace {

void check_options(const closure_watch_options& o) {
  if (o.warning < std::chrono::milliseconds(1) || o.shutdown.count() < 0) {
    throw std::invalid_argument("closure_watch: warning " + std::to_string(o.warning.count()) + " ms, shutdown " +
                                std::to_string(o.shutdown.count()) +
                                " ms (expected a warning of 1 ms or more, a shutdown of 0 for never or more)");
  }
}

}  // namespace

closure_watch::closure_watch(std::vector<std::string> names, closure_watch_options options)
    : options_(options), names_(std::move(names)), workers_(names_.size()) {
  check_options(options);
}

void closure_watch::set_options(closure_watch_options options) {
  check_options(options);
  options_ = options;
}

closure_watch::worker& closure_watch::at(int w) {
  if (w < 0 || static_cast<std::size_t>(w) >= workers_.size()) {
    throw std::out_of_range("closure_watch: worker " + std::to_string(w) + " (expected 0.." +
                            std::to_string(static_cast<int>(workers_.size()) - 1) + ")");
  }
  return workers_[static_cast<std::size_t>(w)];
}

const closure_watch::worker& closure_watch::at(int w) const { return const_cast<closure_watch*>(this)->at(w); }

std::string closure_watch::describe(const held& h, const std::string& name, std::chrono::milliseconds running) {
  return "closure " + std::to_string(h.id) + " (function \"" + h.function + "\") has run on " + name + " for " +
         whole_seconds(running);
}

void closure_watch::sent(int w, std::uint64_t id, std::string function, clock::time_point now) {
  at(w).closures.push_back(held{id, std::move(function), now});
}

bool closure_watch::finished(int w, std::uint64_t id, clock::time_point now) {
  worker& k = at(w);
  if (k.aside && *k.aside == id) {
    k.aside.reset();
    k.last_end = now;
    return true;
  }
  auto it = std::find_if(k.closures.begin(), k.closures.end(), [&](const held& h) { return h.id == id; });
  if (it == k.closures.end()) return false;
  if (it == k.closures.begin()) {
    if (k.printed && k.reported == id) {
      const auto start = k.last_end ? std::max(it->sent, *k.last_end) : it->sent;
      cleared_.push_back("stall cleared: closure " + std::to_string(id) + " (function \"" + it->function +
                         "\") finished on " + names_[static_cast<std::size_t>(w)] + " after " +
                         whole_seconds(std::chrono::duration_cast<std::chrono::milliseconds>(now - start)));
    }
    k.last_end = now;
    k.printed = false;
    k.reported = 0;
    k.line.clear();
  }
  k.closures.erase(it);
  return false;
}

void closure_watch::worker_lost(int w) { at(w) = worker{}; }

void closure_watch::set_aside(int w, std::uint64_t id) {
  worker& k = at(w);
  k = worker{};
  k.aside = id;
}

bool closure_watch::aside(int w) const { return at(w).aside.has_value(); }

closure_watch_verdict closure_watch::check(clock::time_point now) {
  closure_watch_verdict v;
  v.lines = std::move(cleared_);
  cleared_.clear();
  for (std::size_t w = 0; w < workers_.size(); ++w) {
    worker& k = workers_[w];
    if (k.closures.empty()) continue;
    const held& h = k.closures.front();
    if (k.reported != h.id) {
      k.reported = h.id;
      k.printed = false;
      k.given_up = false;
      k.line.clear();
    }
    const auto start = k.last_end ? std::max(h.sent, *k.last_end) : h.sent;
    const auto running = std::max(std::chrono::milliseconds(0),
                                  std::chrono::duration_cast<std::chrono::milliseconds>(now - start));
    if (running <= options_.warning) continue;
    k.line = "stall: " + describe(h, names_[w], running);
    if (!k.printed || now >= k.next_print) {
      k.backoff = k.printed ? std::min(k.backoff * 2, stall_max_backoff) : options_.warning;
      k.next_print = now + k.backoff;
      k.printed = true;
      v.lines.push_back(k.line);
    }
    if (options_.shutdown.count() > 0 && running > options_.shutdown && !k.given_up) {
      k.given_up = true;
      v.give_up.push_back(closure_overdue{static_cast<int>(w), h.id, h.function, running});
    }
  }
  return v;
}

std::vector<std::string> closure_watch::current() const {
  std::vector<std::string> out;
  for (const auto& k : workers_) {
    if (!k.line.empty() && !k.closures.empty() && k.reported == k.closures.front().id) out.push_back(k.line);
  }
  return out;
}

}  // namespace troupe::actors
