#include "troupe/actors/dispatch_state.hpp"

#include <stdexcept>

namespace troupe::actors {

dispatch_state::dispatch_state(int workers, int window)
    : up_(static_cast<std::size_t>(workers), false),
      in_flight_(static_cast<std::size_t>(workers)),
      window_(window) {
  if (workers < 0 || window < 1) {
    throw std::invalid_argument("dispatch_state: " + std::to_string(workers) + " workers and window " +
                                std::to_string(window) + " (expected workers >= 0, window >= 1)");
  }
}

void dispatch_state::set_window(int window) {
  if (window < 1) throw std::invalid_argument("dispatch_state: window " + std::to_string(window) + " (expected >= 1)");
  window_ = window;
}

void dispatch_state::enqueue(std::uint64_t id) { queue_.push_back(id); }

void dispatch_state::on_worker_up(int w) { up_.at(static_cast<std::size_t>(w)) = true; }

std::vector<std::uint64_t> dispatch_state::on_worker_lost(int w, bool requeue) {
  const auto i = static_cast<std::size_t>(w);
  if (!up_.at(i)) return {};
  up_[i] = false;
  ++lost_;
  std::vector<std::uint64_t> back(in_flight_[i].begin(), in_flight_[i].end());
  in_flight_[i].clear();
  if (!requeue) return back;
  // To the front, oldest first: they were scheduled before anything still queued.
  for (auto it = back.rbegin(); it != back.rend(); ++it) queue_.push_front(*it);
  retried_ += back.size();
  return back;
}

std::vector<std::uint64_t> dispatch_state::cancel_queued() {
  std::vector<std::uint64_t> out(queue_.begin(), queue_.end());
  queue_.clear();
  return out;
}

bool dispatch_state::on_finished(int w, std::uint64_t id) {
  const auto i = static_cast<std::size_t>(w);
  if (i >= in_flight_.size()) return false;
  return in_flight_[i].erase(id) == 1;
}

std::vector<std::pair<int, std::uint64_t>> dispatch_state::assign() {
  std::vector<std::pair<int, std::uint64_t>> out;
  const std::size_t n = up_.size();
  while (!queue_.empty()) {
    std::size_t best = n;
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t w = (next_ + k) % n;
      if (!up_[w] || in_flight_[w].size() >= static_cast<std::size_t>(window_)) continue;
      if (best == n || in_flight_[w].size() < in_flight_[best].size()) best = w;
    }
    if (best == n) break;
    const auto id = queue_.front();
    queue_.pop_front();
    in_flight_[best].insert(id);
    out.emplace_back(static_cast<int>(best), id);
    next_ = (best + 1) % n;
  }
  return out;
}

int dispatch_state::workers_up() const noexcept {
  int n = 0;
  for (bool u : up_) n += u ? 1 : 0;
  return n;
}

std::vector<std::size_t> dispatch_state::in_flight_by_worker() const {
  std::vector<std::size_t> out;
  out.reserve(in_flight_.size());
  for (const auto& s : in_flight_) out.push_back(s.size());
  return out;
}

std::size_t dispatch_state::in_flight() const noexcept {
  std::size_t n = 0;
  for (const auto& s : in_flight_) n += s.size();
  return n;
}

}  // namespace troupe::actors
