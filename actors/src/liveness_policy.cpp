#include "troupe/actors/liveness_policy.hpp"

#include <stdexcept>

namespace troupe::actors {

std::optional<std::string> liveness_policy::problem(const std::string& owner) const {
  if (interval < min_interval || interval > max_interval) {
    return owner + ": heartbeat_interval is " + std::to_string(interval.count()) + " ms (expected " +
           std::to_string(min_interval.count()) + ".." + std::to_string(max_interval.count()) + ")";
  }
  if (missed < min_missed || missed > max_missed) {
    return owner + ": missed_heartbeats is " + std::to_string(missed) + " (expected " + std::to_string(min_missed) +
           ".." + std::to_string(max_missed) + ")";
  }
  return std::nullopt;
}

void liveness_policy::check(const std::string& owner) const {
  if (auto bad = problem(owner)) throw std::invalid_argument(*bad);
}

}  // namespace troupe::actors
