// Every TROUPE_* environment variable troupe reads, read here and nowhere else.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "env.hpp"
#include "troupe/distribute/multi_worker_strategy.hpp"
#include "troupe/log.hpp"
#include "troupe/runtime.hpp"

namespace troupe {
namespace detail {

int env_int(const char* name, int fallback, int min, int max) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < min || x > max) {
    throw std::invalid_argument(std::string(name) + "=\"" + v + "\" is not a number in " + std::to_string(min) +
                                ".." + std::to_string(max));
  }
  return static_cast<int>(x);
}

bool force_cpu_from_environment() {
  const char* force_cpu = std::getenv("TROUPE_FORCE_CPU");
  return force_cpu != nullptr && std::strcmp(force_cpu, "1") == 0;
}

LogLevel log_level_from_environment() {
  const char* v = std::getenv("TROUPE_LOG_LEVEL");
  if (v == nullptr || *v == '\0') return LogLevel::warning;
  try {
    return parse_log_level(v);
  } catch (const std::invalid_argument&) {
    return LogLevel::warning;
  }
}

}  // namespace detail

RuntimeOptions RuntimeOptions::from_environment() {
  RuntimeOptions o;
  o.scheduler_threads = detail::env_int("TROUPE_SCHEDULER_THREADS", default_scheduler_threads, 1, 1024);
  o.spin_us = detail::env_int("TROUPE_SPIN_US", default_spin_us, 0, 10'000'000);
  o.collective_timeout_ms =
      detail::env_int("TROUPE_COLLECTIVE_TIMEOUT_MS", default_collective_timeout_ms, 0, 86'400'000);
  if (const char* level = std::getenv("TROUPE_LOG_LEVEL"); level != nullptr && *level != '\0') {
    try {
      parse_log_level(level);
    } catch (const std::invalid_argument&) {
      throw std::invalid_argument(std::string("TROUPE_LOG_LEVEL=\"") + level +
                                  "\" is not a log level (expected debug, info, warning, error or off)");
    }
  }
  return o;
}

namespace distribute {

MultiWorkerOptions MultiWorkerOptions::from_environment() {
  MultiWorkerOptions o;
  o.start_timeout = std::chrono::milliseconds(
      troupe::detail::env_int("TROUPE_START_TIMEOUT_MS", static_cast<int>(default_start_timeout.count()), 1, 86'400'000));
  o.heartbeat_interval = std::chrono::milliseconds(
      troupe::detail::env_int("TROUPE_HEARTBEAT_MS", static_cast<int>(default_heartbeat_interval.count()), 10, 600'000));
  o.devices_per_worker = troupe::detail::env_int("TROUPE_DEVICES_PER_WORKER", 0, 1, 1024);
  if (const char* token = std::getenv("TROUPE_CLUSTER_TOKEN")) o.cluster_token = token;
  return o;
}

}  // namespace distribute
}  // namespace troupe
