#include "troupe/runtime.hpp"

#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "cpu/kernels.hpp"
#include "env.hpp"
#include "gpu_probe.hpp"

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

}  // namespace detail

RuntimeOptions RuntimeOptions::from_environment() {
  RuntimeOptions o;
  o.scheduler_threads = detail::env_int("TROUPE_SCHEDULER_THREADS", 2, 1, 1024);
  o.spin_us = detail::env_int("TROUPE_SPIN_US", 50, 0, 10'000'000);
  return o;
}

struct Runtime::Impl {
  explicit Impl(RuntimeOptions o) : options(resolve(o)) {
    detail::cpu::announce();
    config.set("scheduler.max-threads", static_cast<std::int64_t>(options.scheduler_threads));
    config.load<caf::io::middleman>();  // multi-worker rendezvous goes through it
    owned = std::make_unique<caf::actor_system>(config);
    system = owned.get();
  }
  Impl(caf::actor_system& sys) : options(RuntimeOptions::from_environment()), system(&sys) { detail::cpu::announce(); }

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

std::string Runtime::cpu_kernel_path() { return detail::cpu::isa_name(detail::cpu::kernels().path); }

}  // namespace troupe
