// Every TROUPE_* environment variable troupe reads, read here and nowhere else.
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "distribute/strategies/elastic_membership.hpp"
#include "env.hpp"
#include "troupe/actors/liveness_policy.hpp"
#include "troupe/base/parse_number.hpp"
#include "troupe/base/quote.hpp"
#include "troupe/distribute/actor_cluster.hpp"
#include "troupe/distribute/multi_worker_strategy.hpp"
#include "troupe/distribute/parameter_server_strategy.hpp"
#include "troupe/distribute/server.hpp"
#include "troupe/log.hpp"
#include "troupe/runtime.hpp"

namespace troupe {
namespace detail {

int env_int(const char* name, int fallback, int min, int max) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  const std::optional<long long> parsed = base::parse_int(v);
  const std::string range = std::to_string(min) + ".." + std::to_string(max);
  if (!parsed) {
    throw std::invalid_argument(std::string(name) + "=" + base::quoted(v) + " is not a number in " + range);
  }
  const long long x = *parsed;
  if (x < min || x > max) {
    throw std::invalid_argument(std::string(name) + "=" + std::to_string(x) + " is outside " + range +
                                (x < 0 ? " (a negative value is never valid)" : ""));
  }
  return static_cast<int>(x);
}

namespace {

// The public options' heartbeat defaults are the liveness policy's (a public header names no
// actors type, so they are spelled there too, and checked to agree here).
static_assert(distribute::MultiWorkerOptions::default_heartbeat_interval == actors::liveness_policy::default_interval);
static_assert(distribute::MultiWorkerOptions::default_missed_heartbeats == actors::liveness_policy::default_missed);

// TROUPE_HEARTBEAT_MS, for both cluster stacks, in the liveness policy's range.
std::chrono::milliseconds heartbeat_interval_from_environment() {
  using policy = actors::liveness_policy;
  return std::chrono::milliseconds(env_int("TROUPE_HEARTBEAT_MS", static_cast<int>(policy::default_interval.count()),
                                           static_cast<int>(policy::min_interval.count()),
                                           static_cast<int>(policy::max_interval.count())));
}

[[noreturn]] void bad_setting(const std::string& owner, const std::string& field, long long value,
                              const std::string& unit, const std::string& expected) {
  throw std::invalid_argument(owner + ": " + field + " is " + std::to_string(value) + unit + " (expected " + expected +
                              ")");
}

}  // namespace

void check_runtime_options(const RuntimeOptions& o) {
  // -1 (0 for scheduler_threads) takes the environment's value; nothing else below it means anything.
  if (o.scheduler_threads < 0 || o.scheduler_threads > 1024) {
    bad_setting("RuntimeOptions", "scheduler_threads", o.scheduler_threads, "",
                "0 for TROUPE_SCHEDULER_THREADS, or 1..1024");
  }
  if (o.spin_us < -1 || o.spin_us > 10'000'000) {
    bad_setting("RuntimeOptions", "spin_us", o.spin_us, " us", "-1 for TROUPE_SPIN_US, or 0..10000000");
  }
  if (o.collective_timeout_ms < -1 || o.collective_timeout_ms > 86'400'000) {
    bad_setting("RuntimeOptions", "collective_timeout_ms", o.collective_timeout_ms, " ms",
                "-1 for TROUPE_COLLECTIVE_TIMEOUT_MS, 0 for no bound, or 1..86400000");
  }
  if (o.gradient_bucket_bytes < -2 || o.gradient_bucket_bytes > (1 << 30)) {
    bad_setting("RuntimeOptions", "gradient_bucket_bytes", o.gradient_bucket_bytes, " bytes",
                "-1 for TROUPE_GRADIENT_BUCKET_BYTES, -2 for automatic, 0 for one all-reduce after the backward pass, "
                "or 1..1073741824");
  }
  if (o.flight_recorder_entries != -1 && o.flight_recorder_entries != 0 &&
      (o.flight_recorder_entries < 16 || o.flight_recorder_entries > 10'000'000)) {
    bad_setting("RuntimeOptions", "flight_recorder_entries", o.flight_recorder_entries, " entries",
                "-1 for TROUPE_FLIGHT_RECORDER_ENTRIES, 0 for off, or 16..10000000");
  }
  if (o.flight_recorder_dump_at_exit < -1 || o.flight_recorder_dump_at_exit > 1) {
    bad_setting("RuntimeOptions", "flight_recorder_dump_at_exit", o.flight_recorder_dump_at_exit, "",
                "-1 for TROUPE_FLIGHT_RECORDER_DUMP_AT_EXIT, 0 or 1");
  }
}

void check_multi_worker_options(const distribute::CommunicationOptions& options,
                                const distribute::MultiWorkerOptions& settings) {
  if (options.timeout.count() < 0 || options.timeout.count() > 86'400'000) {
    bad_setting("CommunicationOptions", "timeout", options.timeout.count(), " ms",
                "0 for RuntimeOptions::collective_timeout_ms, or 1..86400000");
  }
  if (settings.start_timeout.count() < 1 || settings.start_timeout.count() > 86'400'000) {
    bad_setting("MultiWorkerOptions", "start_timeout", settings.start_timeout.count(), " ms", "1..86400000");
  }
  actors::liveness_policy{settings.heartbeat_interval, settings.missed_heartbeats}.check("MultiWorkerOptions");
  if (settings.stall_warning < std::chrono::seconds(1) || settings.stall_warning > std::chrono::hours(24 * 7)) {
    bad_setting("MultiWorkerOptions", "stall_warning", settings.stall_warning.count(), " ms", "1000..604800000");
  }
  if (settings.stall_shutdown.count() != 0 &&
      (settings.stall_shutdown < std::chrono::seconds(1) || settings.stall_shutdown > std::chrono::hours(24 * 7))) {
    bad_setting("MultiWorkerOptions", "stall_shutdown", settings.stall_shutdown.count(), " ms",
                "0 for never, or 1000..604800000");
  }
  if (settings.devices_per_worker < 0 || settings.devices_per_worker > 1024) {
    bad_setting("MultiWorkerOptions", "devices_per_worker", settings.devices_per_worker, "",
                "0 for the default, or 1..1024");
  }
  check_elastic_options(settings);
}

void check_elastic_options(const distribute::MultiWorkerOptions& settings) {
  if (settings.min_workers < 1 || settings.min_workers > 65536) {
    bad_setting("MultiWorkerOptions", "min_workers", settings.min_workers, "", "1..65536");
  }
  if (settings.max_workers != 0 && (settings.max_workers < settings.min_workers || settings.max_workers > 65536)) {
    bad_setting("MultiWorkerOptions", "max_workers", settings.max_workers, "",
                "0 for the cluster's size at start, or min_workers (" + std::to_string(settings.min_workers) +
                ")..65536");
  }
  if (settings.commit_every_steps < 1 || settings.commit_every_steps > 1'000'000) {
    bad_setting("MultiWorkerOptions", "commit_every_steps", settings.commit_every_steps, " steps", "1..1000000");
  }
}

void check_elastic_size(const distribute::MultiWorkerOptions& settings, int workers) {
  if (!settings.elastic) return;
  if (settings.min_workers > workers) {
    throw std::invalid_argument("MultiWorkerMirroredStrategy: MultiWorkerOptions::min_workers (TROUPE_MIN_WORKERS) is " +
                                std::to_string(settings.min_workers) + " but the cluster has " +
                                std::to_string(workers) + " worker(s) (expected 1.." + std::to_string(workers) + ")");
  }
  if (settings.max_workers != 0 && settings.max_workers < workers) {
    throw std::invalid_argument("MultiWorkerMirroredStrategy: MultiWorkerOptions::max_workers (TROUPE_MAX_WORKERS) is " +
                                std::to_string(settings.max_workers) + " but the cluster has " +
                                std::to_string(workers) + " worker(s) at start (expected 0, or " +
                                std::to_string(workers) + "..65536)");
  }
}

void check_coordinator_options(const distribute::ClusterCoordinatorOptions& options) {
  if (options.closures_per_worker < 1) {
    bad_setting("ClusterCoordinatorOptions", "closures_per_worker", options.closures_per_worker, "", "1 or more");
  }
  actors::liveness_policy{options.heartbeat_interval, options.missed_heartbeats}.check("ClusterCoordinatorOptions");
  if (options.stall_warning < std::chrono::seconds(1) || options.stall_warning > std::chrono::hours(24 * 7)) {
    bad_setting("ClusterCoordinatorOptions", "stall_warning", options.stall_warning.count(), " ms", "1000..604800000");
  }
  if (options.stall_shutdown.count() != 0 &&
      (options.stall_shutdown < std::chrono::seconds(1) || options.stall_shutdown > std::chrono::hours(24 * 7))) {
    bad_setting("ClusterCoordinatorOptions", "stall_shutdown", options.stall_shutdown.count(), " ms",
                "0 for never, or 1000..604800000");
  }
  if (options.ps_restart_wait.count() != 0 &&
      (options.ps_restart_wait < std::chrono::seconds(1) || options.ps_restart_wait > std::chrono::hours(24))) {
    bad_setting("ClusterCoordinatorOptions", "ps_restart_wait", options.ps_restart_wait.count(), " ms",
                "0 for a lost ps task ending the training, or 1000..86400000");
  }
}

namespace {

// A switch: unset or empty is `fallback`, "1" on, "0" off; anything else ("yes", "true") is
// refused, naming the variable, rather than read as off.
bool env_switch(const char* name, bool fallback, const char* meaning) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  if (std::strcmp(v, "1") == 0) return true;
  if (std::strcmp(v, "0") == 0) return false;
  throw std::invalid_argument(std::string(name) + "=\"" + v + "\" is not 0 or 1 (1 " + meaning + ")");
}

}  // namespace

bool force_cpu_from_environment() { return env_switch("TROUPE_FORCE_CPU", false, "hides GPUs from troupe"); }

}  // namespace detail

namespace distribute::detail {
bool join_from_environment() {
  return troupe::detail::env_switch("TROUPE_JOIN", false, "joins a running elastic cluster instead of starting one");
}
}  // namespace distribute::detail

namespace detail {

const char* cpu_path_from_environment() { return std::getenv("TROUPE_CPU"); }

int intra_op_threads_from_environment() { return env_int("TROUPE_INTRA_OP_THREADS", 0, 0, 64); }

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
  o.gradient_bucket_bytes =
      detail::env_int("TROUPE_GRADIENT_BUCKET_BYTES", automatic_gradient_bucket_bytes, 0, 1 << 30);
  o.flight_recorder_entries = detail::env_int("TROUPE_FLIGHT_RECORDER_ENTRIES", default_flight_recorder_entries, 0,
                                             10'000'000);
  if (o.flight_recorder_entries > 0 && o.flight_recorder_entries < 16) {
    throw std::invalid_argument("TROUPE_FLIGHT_RECORDER_ENTRIES=" + std::to_string(o.flight_recorder_entries) +
                                " is too small a ring (expected 0 for off, or 16..10000000)");
  }
  if (const char* dir = std::getenv("TROUPE_FLIGHT_RECORDER_DIR")) o.flight_recorder_dir = dir;
  o.flight_recorder_dump_at_exit =
      detail::env_switch("TROUPE_FLIGHT_RECORDER_DUMP_AT_EXIT", false, "writes a flight recorder dump at exit") ? 1 : 0;
  if (const char* level = std::getenv("TROUPE_LOG_LEVEL"); level != nullptr && *level != '\0') {
    try {
      parse_log_level(level);
    } catch (const std::invalid_argument&) {
      throw std::invalid_argument(std::string("TROUPE_LOG_LEVEL=\"") + level +
                                  "\" is not a log level (expected debug, info, warning, error or off)");
    }
  }
  // Read where GPUs are counted; checked here too, so that a program on CPU devices does not
  // pass over a malformed value.
  (void)detail::force_cpu_from_environment();
  return o;
}

namespace distribute {

MultiWorkerOptions MultiWorkerOptions::from_environment() {
  MultiWorkerOptions o;
  o.start_timeout = std::chrono::milliseconds(
      troupe::detail::env_int("TROUPE_START_TIMEOUT_MS", static_cast<int>(default_start_timeout.count()), 1, 86'400'000));
  o.heartbeat_interval = troupe::detail::heartbeat_interval_from_environment();
  o.devices_per_worker = troupe::detail::env_int("TROUPE_DEVICES_PER_WORKER", 0, 1, 1024);
  o.missed_heartbeats = troupe::detail::env_int("TROUPE_MISSED_HEARTBEATS", default_missed_heartbeats,
                                                actors::liveness_policy::min_missed,
                                                actors::liveness_policy::max_missed);
  o.stall_warning = std::chrono::seconds(
      troupe::detail::env_int("TROUPE_STALL_WARNING_S", static_cast<int>(default_stall_warning.count()), 1, 604'800));
  o.stall_shutdown = std::chrono::seconds(troupe::detail::env_int("TROUPE_STALL_SHUTDOWN_S", 0, 0, 604'800));
  o.restart_count = troupe::detail::env_int("TROUPE_RESTART_COUNT", 0, 0, 1'000'000);
  if (const char* token = std::getenv("TROUPE_CLUSTER_TOKEN")) o.cluster_token = token;
  o.insecure = troupe::detail::env_switch("TROUPE_INSECURE", o.insecure,
                                         "lets a cluster beyond loopback start without a token");
  o.elastic = troupe::detail::env_switch("TROUPE_ELASTIC", o.elastic, "turns on elastic membership");
  o.min_workers = troupe::detail::env_int("TROUPE_MIN_WORKERS", o.min_workers, 1, 65536);
  o.max_workers = troupe::detail::env_int("TROUPE_MAX_WORKERS", o.max_workers, 0, 65536);
  o.commit_every_steps = troupe::detail::env_int("TROUPE_COMMIT_EVERY_STEPS", o.commit_every_steps, 1, 1'000'000);
  if (o.max_workers != 0 && o.max_workers < o.min_workers) {
    throw std::invalid_argument("TROUPE_MAX_WORKERS=" + std::to_string(o.max_workers) + " is below TROUPE_MIN_WORKERS=" +
                                std::to_string(o.min_workers) + " (expected 0, or " + std::to_string(o.min_workers) +
                                "..65536)");
  }
  return o;
}

ServerOptions ServerOptions::from_environment() {
  const auto mw = MultiWorkerOptions::from_environment();
  ServerOptions o;
  o.cluster_token = mw.cluster_token;
  o.insecure = mw.insecure;
  o.peer_timeout = mw.start_timeout;
  o.data_port = static_cast<std::uint16_t>(troupe::detail::env_int("TROUPE_PS_DATA_PORT", 0, 0, 65535));
  return o;
}

ActorClusterOptions ActorClusterOptions::from_environment() {
  const auto mw = MultiWorkerOptions::from_environment();
  ActorClusterOptions o;
  o.cluster_token = mw.cluster_token;
  o.insecure = mw.insecure;
  o.connect_timeout = mw.start_timeout;
  o.heartbeat_interval = troupe::detail::heartbeat_interval_from_environment();
  o.missed_heartbeats = troupe::detail::env_int("TROUPE_MISSED_HEARTBEATS", o.missed_heartbeats,
                                                actors::liveness_policy::min_missed,
                                                actors::liveness_policy::max_missed);
  o.data_connections = troupe::detail::env_switch("TROUPE_ACTOR_DATA_CONNECTIONS", o.data_connections,
                                                  "sends actors' messages over direct data connections");
  return o;
}

ClusterCoordinatorOptions ClusterCoordinatorOptions::from_environment() {
  ClusterCoordinatorOptions o;
  o.heartbeat_interval = troupe::detail::heartbeat_interval_from_environment();
  o.missed_heartbeats = troupe::detail::env_int("TROUPE_MISSED_HEARTBEATS", o.missed_heartbeats,
                                                actors::liveness_policy::min_missed,
                                                actors::liveness_policy::max_missed);
  o.stall_warning = std::chrono::seconds(troupe::detail::env_int(
      "TROUPE_STALL_WARNING_S", static_cast<int>(MultiWorkerOptions::default_stall_warning.count()), 1, 604'800));
  o.stall_shutdown = std::chrono::seconds(troupe::detail::env_int("TROUPE_STALL_SHUTDOWN_S", 0, 0, 604'800));
  o.ps_restart_wait = std::chrono::seconds(troupe::detail::env_int("TROUPE_PS_RESTART_WAIT_S", 0, 0, 86'400));
  return o;
}

}  // namespace distribute
}  // namespace troupe
