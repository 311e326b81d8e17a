// Every TROUPE_* environment variable troupe reads, read here and nowhere else.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "env.hpp"
#include "troupe/distribute/multi_worker_strategy.hpp"
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

}  // namespace detail

RuntimeOptions RuntimeOptions::from_environment() {
  RuntimeOptions o;
  o.scheduler_threads = detail::env_int("TROUPE_SCHEDULER_THREADS", default_scheduler_threads, 1, 1024);
  o.spin_us = detail::env_int("TROUPE_SPIN_US", default_spin_us, 0, 10'000'000);
  o.collective_timeout_ms =
      detail::env_int("TROUPE_COLLECTIVE_TIMEOUT_MS", default_collective_timeout_ms, 0, 86'400'000);
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
  if (const char* insecure = std::getenv("TROUPE_INSECURE"); insecure != nullptr && *insecure != '\0') {
    if (std::strcmp(insecure, "1") != 0 && std::strcmp(insecure, "0") != 0) {
      throw std::invalid_argument(std::string("TROUPE_INSECURE=\"") + insecure + "\" is not 0 or 1");
    }
    o.insecure = std::strcmp(insecure, "1") == 0;
  }
  return o;
}

}  // namespace distribute
}  // namespace troupe
