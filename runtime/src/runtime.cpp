#include "troupe/runtime.hpp"

#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "env.hpp"
#include "gpu_probe.hpp"
#include "middleman.hpp"
#include "troupe/log.hpp"

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

void require_middleman(Runtime& runtime, const std::string& operation) {
  if (runtime.system().has_middleman()) return;
  throw std::invalid_argument(operation +
                              ": the actor system has no middleman, and workers meet through it; load it in the "
                              "application's config before creating the system: "
                              "config.load<caf::io::middleman>() (link CAF's io library, troupe::caf)");
}

}  // namespace detail

RuntimeOptions RuntimeOptions::from_environment() {
  RuntimeOptions o;
  o.scheduler_threads = detail::env_int("TROUPE_SCHEDULER_THREADS", 2, 1, 1024);
  o.spin_us = detail::env_int("TROUPE_SPIN_US", 50, 0, 10'000'000);
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

struct Runtime::Impl {
  explicit Impl(RuntimeOptions o) : options(resolve(o)) {
    config.set("scheduler.max-threads", static_cast<std::int64_t>(options.scheduler_threads));
    config.load<caf::io::middleman>();  // multi-worker rendezvous goes through it
    owned = std::make_unique<caf::actor_system>(config);
    system = owned.get();
  }
  Impl(caf::actor_system& sys) : options(RuntimeOptions::from_environment()), system(&sys) {}

  static RuntimeOptions resolve(RuntimeOptions o) {
    RuntimeOptions env = RuntimeOptions::from_environment();
    if (o.scheduler_threads <= 0) o.scheduler_threads = env.scheduler_threads;
    if (o.spin_us < 0) o.spin_us = env.spin_us;
    return o;
  }

  RuntimeOptions options;
  caf::actor_system_config config;
  std::unique_ptr<caf::actor_system> owned;
  caf::actor_system* system = nullptr;
};

Runtime::Runtime() : Runtime(RuntimeOptions{}) {}
Runtime::Runtime(RuntimeOptions options) : impl_(std::make_unique<Impl>(options)) {}
Runtime::Runtime(caf::actor_system& system) : impl_(std::make_unique<Impl>(system)) {}
Runtime::~Runtime() = default;

caf::actor_system& Runtime::system() { return *impl_->system; }
const RuntimeOptions& Runtime::options() const { return impl_->options; }

int Runtime::gpu_count() { return detail::cuda_device_count(); }

}  // namespace troupe
