#include "troupe/actors/heartbeat_state.hpp"

#include <stdexcept>
#include <string>

namespace troupe::actors {

heartbeat_state::heartbeat_state(int peers, liveness_policy policy)
    : policy_(policy),
      watched_(static_cast<std::size_t>(peers < 0 ? 0 : peers), false),
      overdue_(watched_.size(), false),
      last_(watched_.size()) {
  if (peers < 0) throw std::invalid_argument("heartbeat_state: " + std::to_string(peers) + " peers (expected >= 0)");
  policy_.check("heartbeat_state");
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
  const bool paused = checked_ && policy_.paused(*checked_, now);
  if (!checked_ || now > *checked_) checked_ = now;
  if (paused) {
    for (std::size_t i = 0; i < watched_.size(); ++i) {
      if (watched_[i] && !overdue_[i]) last_[i] = now;
    }
    return out;
  }
  for (std::size_t i = 0; i < watched_.size(); ++i) {
    if (!watched_[i] || overdue_[i]) continue;
    if (policy_.silent_too_long(last_[i], now)) {
      overdue_[i] = true;
      out.push_back(static_cast<int>(i));
    }
  }
  return out;
}

}  // namespace troupe::actors
