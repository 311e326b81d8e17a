// troupe-worker: a daemon that serves one task of a cluster (a worker, which runs the functions a
// ClusterCoordinator schedules, or a ps task, which holds variable shards; either hosts the actors
// an ActorCluster spawns there) for programs that come later. Functions and actor types come from
// shared libraries that define TROUPE_MODULE.
//
//   troupe-worker --task worker:0 --module ./libsteps.so            # cluster from TF_CONFIG
//   troupe-worker --task ps:0 --cluster '{"worker": ["h1:2222"], "ps": ["h2:2222"]}' --data-port 2223
//
// It prints one line when it is ready and one per peer that connects, leaves or is lost; SIGTERM
// (or SIGINT) stops it cleanly, or exits 1 when that takes more than 30 s.
#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

#include "command_line.hpp"
#include "troupe/base/parse_number.hpp"
#include "troupe/troupe.hpp"

namespace td = troupe::distribute;

namespace {

// The INDEX of "TYPE:INDEX", when it is a number in 0..1000000.
std::optional<int> task_index(const std::string& task) {
  const auto colon = task.find(':');
  if (colon == std::string::npos) return std::nullopt;
  const std::optional<long long> index = troupe::base::parse_int(std::string_view(task).substr(colon + 1));
  if (!index || *index < 0 || *index > 1'000'000) return std::nullopt;
  return static_cast<int>(*index);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Serves one task (worker or ps) of a troupe cluster.", "troupe-worker"};
  std::string task;
  std::string cluster;
  std::vector<std::string> modules;
  app.add_option("--task", task, "TYPE:INDEX, e.g. worker:0 or ps:1 (default: TF_CONFIG's task)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            const auto colon = v.find(':');
            if (colon == 0 || colon == std::string::npos || !task_index(v)) {
              return "\"" + v + "\" is not TYPE:INDEX (e.g. worker:0, an index in 0..1000000)";
            }
            return {};
          },
          "TYPE:INDEX"));
  app.add_option("--cluster", cluster,
                 "the cluster as TF_CONFIG's \"cluster\" value (default: TF_CONFIG's cluster)");
  app.add_option("--module", modules, "a shared library whose TROUPE_MODULE registers functions (repeatable)");
  int data_port = -1;
  app.add_option("--data-port", data_port,
                 "ps tasks: the port for the variables' bytes (default: TROUPE_PS_DATA_PORT, else a free one)")
      ->check(CLI::Range(0, 65535));
  if (const std::optional<int> status = troupe::tools::parse_command_line(app, argc, argv)) return *status;

  // Every thread started from here on (the actor system's) leaves SIGTERM and SIGINT to the one
  // thread that waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  std::mutex out;
  auto say = [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(out);
    std::cout << "troupe-worker: " << line << std::endl;
  };
  try {
    std::string type;
    int index = 0;
    td::ClusterSpec spec;
    if (!cluster.empty() || !task.empty()) {
      const char* env = std::getenv("TF_CONFIG");
      std::string cluster_json = cluster;
      if (cluster_json.empty()) {
        if (env == nullptr || *env == '\0') throw std::invalid_argument("--task needs --cluster or TF_CONFIG");
        cluster_json = td::TFConfigClusterResolver(env).cluster_spec().as_json();
      }
      if (task.empty()) throw std::invalid_argument("--cluster needs --task TYPE:INDEX (e.g. worker:0)");
      type = task.substr(0, task.find(':'));  // --task was checked when parsed
      index = *task_index(task);
      // The resolver checks the cluster and the task as TF_CONFIG would.
      td::TFConfigClusterResolver r("{\"cluster\": " + cluster_json + ", \"task\": {\"type\": \"" + type +
                                    "\", \"index\": " + std::to_string(index) + "}}");
      spec = r.cluster_spec();
    } else {
      td::TFConfigClusterResolver r;
      spec = r.cluster_spec();
      type = r.task_type();
      index = r.task_id();
    }
    td::FunctionRegistry functions;
    for (const auto& m : modules) functions.load_module(m);
    std::string names;
    for (const auto& n : functions.names()) names += (names.empty() ? "" : ", ") + n;
    std::string types;
    for (const auto& n : functions.actor_types()) types += (types.empty() ? "" : ", ") + n;

    troupe::Runtime runtime;
    auto options = td::ServerOptions::from_environment();
    if (data_port >= 0) options.data_port = static_cast<std::uint16_t>(data_port);
    options.log = say;
    td::Server server(runtime, spec, type, index, std::move(functions), options);
    say("ready " + server.task() + " on " + server.target() + " (functions: " + (names.empty() ? "none" : names) +
        "; actor types: " + (types.empty() ? "none" : types) + ")");

    std::thread waiter([&] {
      int sig = 0;
      sigwait(&stop_signals, &sig);
      say(std::string("stopping on ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT"));
      // The signals stay blocked, so nothing else could end a stop that hangs (a peer that never
      // answers while the actor system shuts down): it gets 30 s, then the process exits.
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::seconds(30));
        std::fputs("troupe-worker: not stopped 30 s after the signal; exiting\n", stderr);
        std::_Exit(1);
      }).detach();
      server.stop();
    });
    server.join();
    // The waiter is still in sigwait when join returned another way: wake it.
    pthread_kill(waiter.native_handle(), SIGTERM);
    waiter.join();
    say("stopped " + server.task());
  } catch (const std::system_error& e) {
    // Its port is held by another process: 98, the status troupe-launch starts a cluster of ports
    // it picked again on (docs/reference.md).
    std::cerr << "troupe-worker: " << e.what() << std::endl;
    return e.code() == std::errc::address_in_use ? 98 : 1;
  } catch (const std::exception& e) {
    std::cerr << "troupe-worker: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
