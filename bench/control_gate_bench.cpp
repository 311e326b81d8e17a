// What the control plane's gate costs: a control message's round trip, and a worker's connection
// to the chief (a fresh actor system each time, as at start-up), between two actor systems in
// one process over loopback, through CAF's own middleman (no gate), the gate without a token, and
// the gate with mutual TLS. Modes run side by side in one invocation, so that the load of the
// machine weighs on them alike; process_cpu_us (every thread of the process, per iteration) is
// the figure to compare on a busy machine.
//   BM_ControlRoundTrip/<mode>: one request and its answer (a 16-byte string each way), the
//     size of a heartbeat; mode 0 = CAF's middleman, 1 = gate, 2 = gate + TLS.
//   BM_ControlConnect/<mode>: a new actor system connects to the chief's agent and leaves.
//   BM_ControlCredentials: deriving the key and certificate into their memory files.
#include <benchmark/benchmark.h>

#include <time.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>

#include "../actors/src/control_gate.hpp"
#include "../actors/src/control_tls.hpp"
#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "caf/openssl/manager.hpp"

using namespace troupe::actors;
using namespace std::chrono_literals;

namespace {

const std::string token = "bench-token";

struct node {
  explicit node(int mode) {
    cfg.load<caf::io::middleman>();
    cfg.load<caf::openssl::manager>();
    system = std::make_unique<caf::actor_system>(cfg);
    if (mode == 2) {
      credentials = std::make_unique<control_credentials>(token);
      credentials->install(*system);
    }
    if (mode > 0) gate = std::make_unique<control_gate>(*system, mode == 2, gate_limits::for_cluster(2));
  }
  caf::expected<std::uint16_t> publish(const caf::actor& a) {
    if (gate) return gate->publish(a, 0, "127.0.0.1");
    return system->middleman().publish(a, 0, "127.0.0.1", true);
  }
  caf::expected<caf::actor> reach(std::uint16_t port) {
    if (gate) return gate->remote_actor("127.0.0.1", port, 5000ms);
    return system->middleman().remote_actor("127.0.0.1", port);
  }
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> system;
  std::unique_ptr<control_credentials> credentials;
  std::unique_ptr<control_gate> gate;
};

caf::behavior echo(caf::event_based_actor*) {
  return {[](const std::string& s) { return s; }};
}

// CPU time of the whole process (both actor systems, every thread), in microseconds: unlike
// wall time, it hardly depends on what else the machine runs.
double process_cpu_us() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

void count_cpu(benchmark::State& state, double start_us) {
  state.counters["process_cpu_us"] =
      benchmark::Counter(process_cpu_us() - start_us, benchmark::Counter::kAvgIterations);
}

const char* mode_name(int mode) { return mode == 0 ? "caf" : mode == 1 ? "gate" : "gate+tls"; }

void BM_ControlRoundTrip(benchmark::State& state) {
  const int mode = static_cast<int>(state.range(0));
  node chief(mode), worker(mode);
  auto agent = chief.system->spawn(echo);
  auto port = chief.publish(agent);
  if (!port) throw std::runtime_error("publish failed");
  auto remote = worker.reach(*port);
  if (!remote) throw std::runtime_error("connect failed: " + worker.system->render(remote.error()));
  caf::scoped_actor self{*worker.system};
  const std::string beat(16, 'b');
  const double cpu = process_cpu_us();
  for (auto _ : state) {
    bool ok = false;
    self->request(*remote, 5s, beat).receive([&](const std::string& s) { ok = s.size() == beat.size(); },
                                             [&](caf::error&) {});
    if (!ok) state.SkipWithError("no answer");
  }
  count_cpu(state, cpu);
  state.SetLabel(mode_name(mode));
  caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
}

void BM_ControlConnect(benchmark::State& state) {
  const int mode = static_cast<int>(state.range(0));
  node chief(mode);
  auto agent = chief.system->spawn(echo);
  auto port = chief.publish(agent);
  if (!port) throw std::runtime_error("publish failed");
  const double cpu = process_cpu_us();
  for (auto _ : state) {
    node worker(mode);
    auto remote = worker.reach(*port);
    if (!remote) state.SkipWithError("connect failed");
  }
  count_cpu(state, cpu);
  state.SetLabel(mode_name(mode));
  caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
}

void BM_ControlCredentials(benchmark::State& state) {
  for (auto _ : state) {
    control_credentials c(token);
    benchmark::DoNotOptimize(c.key());
  }
}

}  // namespace

BENCHMARK(BM_ControlRoundTrip)->DenseRange(0, 2)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ControlConnect)->DenseRange(0, 2)->UseRealTime()->Iterations(40)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ControlCredentials)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
