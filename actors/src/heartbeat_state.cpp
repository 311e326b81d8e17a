#include "troupe/actors/heartbeat_state.hpp"

#include <stdexcept>
#include <string>

namespace troupe::actors {

heartbeat_state::heartbeat_state(int peers, std::chrono::milliseconds interval, int missed)
    : interval_(interval),
      missed_(missed),
      watched_(static_cast<std::size_t>(peers < 0 ? 0 : peers), false),
      overdue_(watched_.size(), false),
      last_(watched_.size()) {
  if (peers < 0 || interval.count() < 1 || missed < 1) {
    throw std::invalid_argument("heartbeat_state: " + std::to_string(peers) + " peers, heartbeat_interval " +
                                std::to_string(interval.count()) + " ms, missed_heartbeats " + std::to_string(missed) +
                                " (expected peers >= 0, heartbeat_interval >= 1 ms, missed_heartbeats >= 1)");
  }
}

void heartbeat_state::watch(int p, clock::time_point now) {
  const auto i = static_cast<std::size_t>(p);
  watched_.at(i) = true;
  overdue_[i] = false;
  last_[i] = now;
  if (!checked_ || now > *checked_) checked_ = now;  // the pause rule counts from here
}

void heartbeat_state::forget(int p) {
  const auto i = static_cast<std::size_t>(p);
  watched_.at(i) = false;
  overdue_[i] = false;
}

bool heartbeat_state::beat(int p, clock::time_point now) {
  const auto i = static_cast<std::size_t>(p);
  if (!watched_.at(i)) return false;
  if (now > last_[i]) last_[i] = now;
  const bool back = overdue_[i];
  overdue_[i] = false;
  return back;
}

std::vector<int> heartbeat_state::overdue(clock::time_point now) {
  std::vector<int> out;
  // Expected every interval: a gap of two is this process not running, not its peers' silence.
  const bool paused = checked_ && now - *checked_ > 2 * interval_;
  if (!checked_ || now > *checked_) checked_ = now;
  if (paused) {
    for (std::size_t i = 0; i < watched_.size(); ++i) {
      if (watched_[i] && !overdue_[i]) last_[i] = now;
    }
    return out;
  }
  for (std::size_t i = 0; i < watched_.size(); ++i) {
    if (!watched_[i] || overdue_[i]) continue;
    if (now - last_[i] > limit()) {
      overdue_[i] = true;
      out.push_back(static_cast<int>(i));
    }
  }
  return out;
}

}  // namespace troupe::actors
