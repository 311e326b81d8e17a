// The chief of troupe's cluster tests: schedules functions of cluster_functions.cpp onto workers
// started by the test script, and checks what comes back. Prints "PASS <scenario>" lines; any
// mismatch exits 1 naming it.
#include <CLI/CLI.hpp>
#include <chrono>
#include <fstream>
#include <iostream>
#include <set>
#include <thread>

#include "troupe/troupe.hpp"

namespace td = troupe::distribute;
using troupe::Tensor;

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::cout << "FAILED: " << what << std::endl;
  std::exit(1);
}

void expect(bool ok, const std::string& what) {
  if (!ok) fail(what);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cluster test chief"};
  std::string mode = "basic";
  int closures = 200;
  int slow_ms = 20;
  std::string wait_file;
  app.add_option("--mode", mode, "basic, retry, rate or leave-early");
  app.add_option("--wait-file", wait_file, "leave-early: leaves once this file exists (at most 30 s)");
  app.add_option("--closures", closures);
  app.add_option("--slow-ms", slow_ms);
  CLI11_PARSE(app, argc, argv);
  try {
    troupe::Runtime rt;
    auto resolver = std::make_shared<td::TFConfigClusterResolver>();
    td::ParameterServerStrategy strategy(rt, resolver, std::make_shared<td::FixedShardsPartitioner>(2));
    td::ClusterCoordinatorOptions options;
    // leave-early: a worker that is down at the first try is not tried again while the chief runs.
    if (mode == "leave-early") options.reconnect_interval = std::chrono::seconds(60);
    td::ClusterCoordinator coordinator(strategy, options);
    if (mode == "basic") {
      // Results come back in order of scheduling, from both workers.
      std::vector<td::RemoteValue> values;
      for (int i = 0; i < closures; ++i) values.push_back(coordinator.schedule("add", float(i), 0.5f));
      coordinator.join();
      std::set<int> workers;
      for (int i = 0; i < closures; ++i) {
        auto r = coordinator.fetch(values[static_cast<std::size_t>(i)]);
        expect(r.size() == 2 && r[0].item<float>() == float(i) + 0.5f, "add " + std::to_string(i));
        workers.insert(r[1].item<std::int32_t>());
      }
      expect(coordinator.closures_done() == static_cast<std::uint64_t>(closures), "closures_done");
      std::cout << "PASS add: " << closures << " results, on workers";
      for (int w : workers) std::cout << " " << w;
      std::cout << std::endl;
      expect(workers.size() == static_cast<std::size_t>(strategy.num_workers()), "every worker ran closures");

      // An exception inside a function reaches join and fetch naming the worker and the cause.
      auto bad = coordinator.schedule("fail");
      auto e = error_of([&] { coordinator.join(); });
      expect(contains(e, "function 'fail' failed on /job:worker/replica:0/task:") &&
                 contains(e, "the step diverged (loss is nan)"),
             "join after fail: " + e);
      auto f = error_of([&] { bad.fetch(); });
      expect(contains(f, "the step diverged") && contains(f, "/job:worker/"), "fetch after fail: " + f);
      coordinator.join();  // raised once, as TensorFlow does
      std::cout << "PASS fail: " << e << std::endl;

      // A function no worker has is named, with the worker.
      coordinator.schedule("no_such_function");
      auto m = error_of([&] { coordinator.join(); });
      expect(contains(m, "function 'no_such_function' is not registered on /job:worker/replica:0/task:"),
             "missing function: " + m);
      std::cout << "PASS missing: " << m << std::endl;

      // Variables: sharded over the ps tasks, updated by the workers.
      strategy.create_variable("v", Tensor::from_vector<float>({0, 0, 0, 0, 0, 0}, {3, 2}));
      expect(strategy.variables().at(0).shards.size() == 2, "v has two shards");
      const int bumps = 10;
      for (int i = 0; i < bumps; ++i) {
        coordinator.schedule("bump", Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2}));
      }
      coordinator.join();
      auto v = strategy.read_variable("v").to_vector<float>();
      expect(v == std::vector<float>{10, 20, 30, 40, 50, 60}, "v after " + std::to_string(bumps) + " bumps: " +
                                                                 strategy.read_variable("v").to_string());
      std::cout << "PASS variables: " << strategy.read_variable("v").to_string() << std::endl;

      // Per-worker iterators: each worker reads its own dataset from the start.
      auto it = coordinator.create_per_worker_dataset("counting").make_iterator();
      std::vector<td::RemoteValue> taken;
      for (int i = 0; i < 6; ++i) taken.push_back(coordinator.schedule("take", it));
      coordinator.join();
      std::multiset<std::int64_t> seen;
      for (auto& t : taken) seen.insert(t.fetch().at(0).item<std::int64_t>());
      expect(seen.count(0) >= 1 && *seen.rbegin() < 6, "per-worker iterators");
      std::cout << "PASS per-worker dataset" << std::endl;
    } else if (mode == "retry") {
      // Slow closures, so some are in flight when the script kills a worker.
      std::vector<td::RemoteValue> values;
      for (int i = 0; i < closures; ++i) values.push_back(coordinator.schedule("slow", slow_ms, i));
      coordinator.join();
      for (int i = 0; i < closures; ++i) {
        expect(values[static_cast<std::size_t>(i)].fetch().at(0).item<int>() == i, "slow " + std::to_string(i));
      }
      std::cout << "result: closures=" << closures << " done=" << coordinator.closures_done()
                << " retried=" << coordinator.closures_retried() << " workers_lost=" << coordinator.workers_lost()
                << std::endl;
    } else if (mode == "rate") {
      for (int round = 0; round < 2; ++round) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < closures; ++i) coordinator.schedule("empty");
        coordinator.join();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::cout << "rate: " << closures << " empty closures in " << s << " s = " << closures / s
                  << " closures/s" << std::endl;
      }
    } else if (mode == "leave-early") {
      // The chief leaves while the script has started a worker it has not reached yet.
      std::cout << "waiting for " << wait_file << std::endl;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!std::ifstream(wait_file).good()) {
        expect(std::chrono::steady_clock::now() < deadline, "no " + wait_file + " within 30 s");
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      std::cout << "leaving with " << strategy.num_workers() << " workers in the cluster" << std::endl;
    } else {
      fail("unknown mode " + mode);
    }
  } catch (const std::exception& e) {
    std::cout << "chief error: " << e.what() << std::endl;
    return 2;
  }
  return 0;
}
