#include "troupe/runtime.hpp"

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "cpu/kernels.hpp"
#include "env.hpp"
#include "flight_recorder.hpp"
#include "caf/openssl/manager.hpp"
#include "gpu/gpu_probe.hpp"
#include "middleman.hpp"
#include "troupe/actors/rendezvous.hpp"
#include "troupe/log.hpp"

namespace troupe {
namespace detail {

void require_middleman(Runtime& runtime, const std::string& operation) {
  if (runtime.system().has_middleman()) return;
  throw std::invalid_argument(operation +
                              ": the actor system has no middleman, and workers meet through it; prepare the "
                              "application's config before creating the system: troupe::Runtime::configure(config) "
                              "(it loads caf::io::middleman; link CAF's io library, troupe::caf)");
}

}  // namespace detail

struct Runtime::Impl {
  explicit Impl(RuntimeOptions o) : options(resolve(o)) {
    detail::cpu::announce();
    config.set("scheduler.max-threads", static_cast<std::int64_t>(options.scheduler_threads));
    configure(config);
    owned = std::make_unique<caf::actor_system>(config);
    system = owned.get();
    start_recorder();
  }
  Impl(caf::actor_system& sys) : options(RuntimeOptions::from_environment()), system(&sys) {
    detail::cpu::announce();
    start_recorder();
  }
  ~Impl() {
    if (!recorder || options.flight_recorder_dump_at_exit != 1) return;
    if (recorder.use_count() > 1) return;  // another Runtime of the process still records
    try {
      const std::string path = recorder->write("exit");
      log(LogLevel::info, "flight recorder written to " + path + " (at exit)");
    } catch (const std::exception& e) {
      log(LogLevel::warning, std::string("flight recorder: at exit: ") + e.what());
    }
  }

  // The process's flight recorder: created by the first Runtime, shared by the later ones.
  void start_recorder() {
    if (options.flight_recorder_entries > 0) {
      recorder = detail::FlightRecorder::acquire(static_cast<std::size_t>(options.flight_recorder_entries),
                                                 options.flight_recorder_dir);
    }
  }

  static RuntimeOptions resolve(RuntimeOptions o) {
    detail::check_runtime_options(o);
    RuntimeOptions env = RuntimeOptions::from_environment();
    if (o.scheduler_threads <= 0) o.scheduler_threads = env.scheduler_threads;
    if (o.spin_us < 0) o.spin_us = env.spin_us;
    if (o.collective_timeout_ms < 0) o.collective_timeout_ms = env.collective_timeout_ms;
    if (o.gradient_bucket_bytes == -1) o.gradient_bucket_bytes = env.gradient_bucket_bytes;
    if (o.flight_recorder_entries < 0) o.flight_recorder_entries = env.flight_recorder_entries;
    if (o.flight_recorder_dir.empty()) o.flight_recorder_dir = env.flight_recorder_dir;
    if (o.flight_recorder_dump_at_exit < 0) o.flight_recorder_dump_at_exit = env.flight_recorder_dump_at_exit;
    return o;
  }

  RuntimeOptions options;
  caf::actor_system_config config;
  std::unique_ptr<caf::actor_system> owned;
  caf::actor_system* system = nullptr;
  std::shared_ptr<detail::FlightRecorder> recorder;  // null when off
};

Runtime::Runtime() : Runtime(RuntimeOptions{}) {}
Runtime::Runtime(RuntimeOptions options) : impl_(std::make_unique<Impl>(options)) {}
Runtime::Runtime(caf::actor_system& system) : impl_(std::make_unique<Impl>(system)) {}
Runtime::~Runtime() = default;

void Runtime::configure(caf::actor_system_config& config) {
  // An idle worker of CAF's work-stealing scheduler polls, then naps 50 us at a time (500 naps)
  // before it waits on its condition variable; a message that arrives meanwhile (from the
  // middleman's thread, or a caller's) waits for the nap to end, 50 to 100 us and more on a busy
  // host, at every hand-off of a remote request. Without the naps an idle worker waits on its
  // condition variable after its polls, and an arriving message wakes it at once (bench/README.md,
  // "Actors beside Ray"). An application's own setting is kept.
  if (!caf::get_if<caf::timespan>(&config, "work-stealing.moderate-sleep-duration")) {
    config.set("work-stealing.moderate-sleep-duration", caf::timespan{0});
  }
  config.load<caf::io::middleman>();  // multi-worker rendezvous goes through it
  config.load<caf::openssl::manager>();  // and, with a cluster token, through mutual TLS
  actors::add_rendezvous_types(config);
}

caf::actor_system& Runtime::system() { return *impl_->system; }
const RuntimeOptions& Runtime::options() const { return impl_->options; }

int Runtime::gpu_count() { return detail::cuda_device_count(); }

std::string Runtime::cpu_kernel_path() { return detail::cpu::isa_name(detail::cpu::kernels().path); }

}  // namespace troupe
