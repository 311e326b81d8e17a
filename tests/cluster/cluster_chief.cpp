// The chief of troupe's cluster tests: schedules functions of cluster_functions.cpp onto workers
// started by the test script, and checks what comes back. Prints "PASS <scenario>" lines; any
// mismatch exits 1 naming it.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
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

// Pseudo-random bits (NaN payloads and infinities included), the same for the same seed.
template <class T>
std::vector<T> bits(std::size_t n, std::uint64_t seed) {
  std::vector<T> v(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& e : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(&e, &x, sizeof e);
  }
  return v;
}
// Small integers as T, so that sums and differences are exact.
template <class T>
std::vector<T> small(std::size_t n, int seed) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(static_cast<int>((i * 7 + static_cast<std::size_t>(seed) * 13) % 201) - 100);
  return v;
}
template <class T>
bool same_bits(const Tensor& t, const std::vector<T>& want) {
  const auto got = t.to_vector<T>();
  return got.size() == want.size() && std::memcmp(got.data(), want.data(), want.size() * sizeof(T)) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cluster test chief"};
  std::string mode = "basic";
  int closures = 200;
  int slow_ms = 20;
  std::string wait_file;
  int heartbeat_ms = 0;
  int missed = 0;
  app.add_option("--mode", mode, "basic, cancel, retry, rate, stall or leave-early");
  app.add_option("--heartbeat-ms", heartbeat_ms, "ClusterCoordinatorOptions::heartbeat_interval (0: the default)");
  app.add_option("--missed", missed, "ClusterCoordinatorOptions::missed_heartbeats (0: the default)");
  app.add_option("--wait-file", wait_file, "leave-early: leaves once this file exists (at most 30 s)");
  std::string ckpt_dir;
  app.add_option("--dir", ckpt_dir, "ckpt-save, ckpt-check: the sharded checkpoints' directory");
  app.add_option("--closures", closures);
  app.add_option("--slow-ms", slow_ms);
  CLI11_PARSE(app, argc, argv);
  try {
    troupe::Runtime rt;
    auto resolver = std::make_shared<td::TFConfigClusterResolver>();
    td::ParameterServerStrategy strategy(rt, resolver, std::make_shared<td::FixedShardsPartitioner>(mode == "bulk" ? 3 : 2));
    td::ClusterCoordinatorOptions options;
    // leave-early: a worker that is down at the first try is not tried again while the chief runs.
    if (mode == "leave-early") options.reconnect_interval = std::chrono::seconds(60);
    // cancel: one function in flight per worker, so that "in flight" means running.
    if (mode == "cancel") options.closures_per_worker = 1;
    if (heartbeat_ms > 0) options.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms);
    if (missed > 0) options.missed_heartbeats = missed;
    // stall: a closure running longer than 1 s is reported, longer than 3 s given up on its worker.
    if (mode == "stall") {
      options.stall_warning = std::chrono::seconds(1);
      options.stall_shutdown = std::chrono::seconds(3);
      options.closures_per_worker = 2;
    }
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
      // Workers are connected in the background: on a loaded machine one may come up only after
      // the first closures are done. More closures, until each worker ran some (at most 30 s).
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (workers.size() < static_cast<std::size_t>(strategy.num_workers()) &&
             std::chrono::steady_clock::now() < deadline) {
        std::vector<td::RemoteValue> more;
        for (int i = 0; i < 8; ++i) more.push_back(coordinator.schedule("add", 1.0f, 2.0f));
        coordinator.join();
        for (auto& m : more) workers.insert(m.fetch().at(1).item<std::int32_t>());
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
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

      // Variables made in the strategy's scope live on the ps tasks (TensorFlow's form): reads and
      // writes from the chief reach them, the workers reach them by name.
      {
        std::optional<troupe::Variable> w;
        std::optional<troupe::Variable> step;
        {
          auto scope = strategy.scope();
          w.emplace(Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}), "w");
          step.emplace(Tensor::scalar<std::int64_t>(0));
          // A name taken gets the first free suffix, as TensorFlow makes names unique.
          troupe::Variable again(Tensor::from_vector<float>({1}, {1}), "w");
          expect(again.name() == "w_1", "a second variable 'w' is named " + again.name() + " (expected w_1)");
        }
        expect(step->name() == "Variable" && step->shape().empty(), "the unnamed scalar: " + step->name());
        bool listed = false;
        for (const auto& sv : strategy.variables()) {
          if (sv.name == "w") listed = sv.shards.size() == 2 && sv.shards[0].rows == 2;
        }
        expect(listed, "w is sharded in two by the partitioner");
        const auto ones = Tensor::from_vector<float>({1, 1, 1, 1, 1, 1, 1, 1}, {4, 2});
        for (int i = 0; i < 5; ++i) coordinator.schedule("bump_w", ones);
        coordinator.join();
        expect(w->value().to_vector<float>() == std::vector<float>{6, 7, 8, 9, 10, 11, 12, 13},
               "w after 5 bumps by the workers: " + w->value().to_string());
        w->assign(Tensor::from_vector<float>({0, 0, 0, 0, 0, 0, 0, 0}, {4, 2}));
        w->assign_sub(ones);
        expect(strategy.read_variable("w").to_vector<float>() == std::vector<float>(8, -1.0f),
               "the chief's assign and assign_sub reached the ps: " + strategy.read_variable("w").to_string());
        auto seen = coordinator.schedule("bump_w", ones).fetch().at(0).to_vector<float>();
        expect(seen == std::vector<float>(8, 0.0f), "a worker sees the chief's writes");
        step->assign_add(Tensor::scalar<std::int64_t>(2));
        expect(step->value().item<std::int64_t>() == 2 && step->value().shape().empty(), "the scalar's value");
        // run() on the chief runs there, once, reading the ps (TensorFlow warns and does the same).
        auto plus_two = strategy.run([&] { return w->value() + troupe::Scalar(2.0f); });  // w is 0 now
        expect(plus_two.values().size() == 1 && plus_two[0].to_vector<float>() == std::vector<float>(8, 2.0f),
               "run on the chief");
        std::cout << "PASS scope variables: " << w->value().to_string() << ", " << step->name() << " = "
                  << step->value().item<std::int64_t>() << std::endl;
      }

      // Per-worker iterators: each worker reads its own dataset from the start.
      auto it = coordinator.create_per_worker_dataset("counting").make_iterator();
      std::vector<td::RemoteValue> taken;
      for (int i = 0; i < 6; ++i) taken.push_back(coordinator.schedule("take", it));
      coordinator.join();
      std::multiset<std::int64_t> seen;
      for (auto& t : taken) seen.insert(t.fetch().at(0).item<std::int64_t>());
      expect(seen.count(0) >= 1 && *seen.rbegin() < 6, "per-worker iterators");
      std::cout << "PASS per-worker dataset" << std::endl;
    } else if (mode == "cancel") {
      // TensorFlow's rules after a function raises (its ClosureQueue): the next join, schedule or
      // done raises the error once, after the functions in flight finished, and cancels what is
      // still queued.
      auto is_cancelled = [](const td::RemoteValue& v) {
        try {
          v.fetch();
        } catch (const troupe::Cancelled& e) {
          expect(contains(e.what(), "function 'slow' was cancelled"), std::string("cancelled: ") + e.what());
          return true;
        }
        return false;
      };
      // Heartbeat settings out of range are refused, naming the value.
      for (auto [interval_ms, beats] : {std::pair{0, 6}, std::pair{500, 0}, std::pair{500, 100000}}) {
        td::ClusterCoordinatorOptions bad_options;
        bad_options.heartbeat_interval = std::chrono::milliseconds(interval_ms);
        bad_options.missed_heartbeats = beats;
        std::string what;
        try {
          td::ClusterCoordinator other(strategy, bad_options);
        } catch (const std::invalid_argument& x) {
          what = x.what();
        }
        const std::string named =
            interval_ms == 0 ? "heartbeat_interval is 0 ms" : "missed_heartbeats is " + std::to_string(beats);
        expect(contains(what, named), "heartbeat settings " + std::to_string(interval_ms) + " ms x " +
                                          std::to_string(beats) + " refused naming them: " + what);
      }
      const int queued = 40;
      auto running = coordinator.schedule("slow", 400, -1);  // on one worker while the other fails
      auto bad = coordinator.schedule("fail");
      std::vector<td::RemoteValue> rest;
      for (int i = 0; i < queued; ++i) rest.push_back(coordinator.schedule("slow", 50, i));
      auto e = error_of([&] { coordinator.join(); });
      expect(contains(e, "function 'fail' failed on /job:worker/") && contains(e, "the step diverged"), "join: " + e);
      expect(running.is_ready(), "the function in flight finished before join raised");
      expect(running.fetch().at(0).item<int>() == -1, "the function in flight has its value");
      expect(contains(error_of([&] { bad.fetch(); }), "the step diverged"), "the failed function's RemoteValue");
      int cancelled = 0;
      for (int i = 0; i < queued; ++i) {
        auto& v = rest[static_cast<std::size_t>(i)];
        expect(v.is_ready(), "closure " + std::to_string(i) + " still pending after join raised");
        if (is_cancelled(v)) {
          ++cancelled;
        } else {
          expect(v.fetch().at(0).item<int>() == i, "slow " + std::to_string(i));
        }
      }
      expect(cancelled > 0, "no queued function was cancelled");
      expect(coordinator.closures_cancelled() == static_cast<std::uint64_t>(cancelled), "closures_cancelled");
      expect(coordinator.closures_done() + coordinator.closures_cancelled() == queued + 2, "every closure accounted");
      expect(error_of([&] { coordinator.join(); }).empty(), "the error was raised twice");
      std::cout << "PASS join: " << cancelled << " of " << queued << " queued functions cancelled, "
                << queued - cancelled << " ran" << std::endl;

      // schedule raises a pending error, and the function it was given is cancelled.
      auto bad2 = coordinator.schedule("fail");
      error_of([&] { bad2.fetch(); });  // waits until it failed
      const auto before = coordinator.closures_cancelled();
      auto s = error_of([&] { coordinator.schedule("add", 1.0f, 2.0f); });
      expect(contains(s, "function 'fail' failed on /job:worker/"), "schedule after a failure: " + s);
      expect(coordinator.closures_cancelled() == before + 1, "the function given to schedule was cancelled");
      expect(error_of([&] { coordinator.join(); }).empty(), "join raised an error schedule raised");
      auto sum = coordinator.schedule("add", 1.0f, 2.0f);
      expect(sum.fetch().at(0).item<float>() == 3.0f, "schedule works again after the error was raised");
      std::cout << "PASS schedule: " << s << std::endl;

      // done raises it too, once.
      auto bad3 = coordinator.schedule("fail");
      error_of([&] { bad3.fetch(); });
      auto d = error_of([&] { coordinator.done(); });
      expect(contains(d, "function 'fail' failed on /job:worker/"), "done after a failure: " + d);
      bool finished = false;
      expect(error_of([&] { finished = coordinator.done(); }).empty() && finished, "done raised twice");
      std::cout << "PASS done: " << d << std::endl;

      // Closures handed to a worker ahead of time (8 per worker here) and not started there are
      // queued too: raising the error cancels them on the worker, as TensorFlow cancels what its
      // workers have not taken. The worker that runs the long function holds 7 such closures.
      td::ClusterCoordinatorOptions wide_options;
      wide_options.closures_per_worker = 8;
      td::ClusterCoordinator wide(strategy, wide_options);
      auto long_one = wide.schedule("slow", 3000, -1);
      std::vector<td::RemoteValue> handed;
      for (int i = 0; i < 16; ++i) handed.push_back(wide.schedule("slow", 50, i));
      // The long function has started on its worker before another fails (a closure its worker
      // has not started yet would be cancelled too, rightly).
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      auto bad4 = wide.schedule("fail");
      auto w = error_of([&] { wide.join(); });
      expect(contains(w, "function 'fail' failed on /job:worker/"), "join with a window of 8: " + w);
      expect(long_one.fetch().at(0).item<int>() == -1, "the long function in flight has its value");
      int dropped = 0;
      for (int i = 0; i < 16; ++i) {
        auto& v = handed[static_cast<std::size_t>(i)];
        expect(v.is_ready(), "closure " + std::to_string(i) + " still pending after join raised");
        if (is_cancelled(v)) {
          ++dropped;
        } else {
          expect(v.fetch().at(0).item<int>() == i, "slow " + std::to_string(i));
        }
      }
      expect(dropped >= 7, "only " + std::to_string(dropped) +
                               " of 16 closures cancelled: those queued on the worker of the long function ran");
      std::cout << "PASS worker queues: " << dropped << " of 16 closures cancelled" << std::endl;
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
    } else if (mode == "bulk") {
      // Reads and updates over the ps tasks' data connections, bit-exact: odd sizes around the
      // page, the 64 KiB drain buffer and 16 MiB, every dtype, up to 3 shards over 2 ps tasks.
      struct var {
        troupe::DType dtype;
        troupe::Shape shape;
      };
      const std::vector<var> vars = {{troupe::DType::f32, {1}},          {troupe::DType::f64, {7, 3}},
                                     {troupe::DType::i32, {1000003}},    {troupe::DType::i64, {5, 13107}},
                                     {troupe::DType::f32, {4194303}},    {troupe::DType::f32, {16385}}};
      auto elements = [](const var& v) {
        std::size_t n = 1;
        for (auto d : v.shape) n *= static_cast<std::size_t>(d);
        return n;
      };
      // Tensors of each dtype from a generator of element vectors.
      auto make = [&](const var& v, auto gen_f32, auto gen_f64, auto gen_i32, auto gen_i64) {
        const auto n = elements(v);
        switch (v.dtype) {
          case troupe::DType::f32: return Tensor::from_vector<float>(gen_f32(n), v.shape);
          case troupe::DType::f64: return Tensor::from_vector<double>(gen_f64(n), v.shape);
          case troupe::DType::i32: return Tensor::from_vector<std::int32_t>(gen_i32(n), v.shape);
          case troupe::DType::i64: return Tensor::from_vector<std::int64_t>(gen_i64(n), v.shape);
          case troupe::DType::f16:
          case troupe::DType::bf16: break;  // not among vars
        }
        fail("dtype");
      };
      auto random = [&](const var& v, std::uint64_t seed) {
        return make(
            v, [&](std::size_t n) { return bits<float>(n, seed); }, [&](std::size_t n) { return bits<double>(n, seed); },
            [&](std::size_t n) { return bits<std::int32_t>(n, seed); },
            [&](std::size_t n) { return bits<std::int64_t>(n, seed); });
      };
      auto ints = [&](const var& v, int seed) {
        return make(
            v, [&](std::size_t n) { return small<float>(n, seed); }, [&](std::size_t n) { return small<double>(n, seed); },
            [&](std::size_t n) { return small<std::int32_t>(n, seed); },
            [&](std::size_t n) { return small<std::int64_t>(n, seed); });
      };
      auto same = [](const Tensor& a, const Tensor& b) {
        if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
        switch (a.dtype()) {
          case troupe::DType::f32: return same_bits(a, b.to_vector<float>());
          case troupe::DType::f64: return same_bits(a, b.to_vector<double>());
          case troupe::DType::i32: return same_bits(a, b.to_vector<std::int32_t>());
          case troupe::DType::i64: return same_bits(a, b.to_vector<std::int64_t>());
          case troupe::DType::f16:
          case troupe::DType::bf16: return a.equals(b);
        }
        return false;
      };
      std::set<int> ps_used;
      for (std::size_t i = 0; i < vars.size(); ++i) {
        auto sv = strategy.create_variable("b" + std::to_string(i), random(vars[i], i));
        for (const auto& sh : sv.shards) ps_used.insert(sh.ps);
      }
      expect(ps_used.size() == 2, "the shards lie on both ps tasks");
      auto check_all = [&](const std::vector<Tensor>& want, const std::string& what) {
        std::vector<td::RemoteValue> reads;
        for (std::size_t i = 0; i < vars.size(); ++i) reads.push_back(coordinator.schedule("read_var", int(i)));
        coordinator.join();
        for (std::size_t i = 0; i < vars.size(); ++i) {
          expect(same(reads[i].fetch().at(0), want[i]), what + ": a worker's read of b" + std::to_string(i));
          expect(same(strategy.read_variable("b" + std::to_string(i)), want[i]),
                 what + ": the chief's read of b" + std::to_string(i));
        }
      };
      std::vector<Tensor> want;
      for (std::size_t i = 0; i < vars.size(); ++i) want.push_back(random(vars[i], i));
      check_all(want, "created");
      for (std::size_t i = 0; i < vars.size(); ++i) {
        want[i] = random(vars[i], 100 + i);
        coordinator.schedule("update_var", int(i), 0, want[i]);
      }
      coordinator.join();
      check_all(want, "assigned");
      for (std::size_t i = 0; i < vars.size(); ++i) {
        coordinator.schedule("update_var", int(i), 0, ints(vars[i], 1));
        coordinator.join();  // the assign first, then the add and the subtract in any order
        coordinator.schedule("update_var", int(i), 1, ints(vars[i], 2));
        coordinator.schedule("update_var", int(i), 2, ints(vars[i], 3));
        want[i] = ints(vars[i], 1) + ints(vars[i], 2) - ints(vars[i], 3);
      }
      coordinator.join();
      check_all(want, "added and subtracted");
      std::cout << "PASS bulk: " << vars.size() << " variables bit-exact through reads, assigns, adds and subtracts"
                << std::endl;

      // No torn shard: while one worker assigns whole values, the other's reads see every shard
      // with one value.
      auto torn_var = strategy.create_variable("b6", Tensor::zeros({3, 43691}, troupe::DType::f64));
      std::vector<std::int64_t> bounds{0};
      for (const auto& sh : torn_var.shards) bounds.push_back(bounds.back() + sh.rows);
      const Tensor bounds_t = Tensor::from_vector<std::int64_t>(bounds, {static_cast<std::int64_t>(bounds.size())});
      std::vector<td::RemoteValue> watches;
      for (int round = 0; round < 2; ++round) {
        coordinator.schedule("fill", 6, 300, Tensor::zeros({3, 43691}, troupe::DType::f64));
        watches.push_back(coordinator.schedule("watch", 6, 300, bounds_t));
      }
      coordinator.join();
      std::int64_t torn = 0, seen = 0;
      for (auto& w : watches) {
        auto r = w.fetch();
        torn += r.at(0).item<std::int64_t>();
        seen += r.at(1).item<std::int64_t>();
      }
      expect(torn == 0, std::to_string(torn) + " reads saw a torn shard");
      expect(seen > 2 * 3, "the reads did not overlap the updates (" + std::to_string(seen) + " values seen)");
      std::cout << "PASS no torn shard: 600 reads during 600 whole assigns, " << seen << " values seen" << std::endl;
    } else if (mode == "stall") {
      // 1. A closure of 2 s: reported past 1 s, cleared when it finishes (the script reads the log).
      auto slow = coordinator.schedule("slow", 2000, 11);
      coordinator.join();
      expect(slow.fetch().at(0).item<int>() == 11, "slow returned " + std::to_string(slow.fetch().at(0).item<int>()));
      std::cout << "PASS slow closure done" << std::endl;
      // 2. A closure stuck for 6 s on the first worker that runs it: given up there past 3 s, it
      // runs again on the other worker (at once), with the closures queued behind it.
      auto once = coordinator.schedule("stall_once", 6000, 7.0f);
      std::vector<td::RemoteValue> adds;
      for (int i = 0; i < 10; ++i) adds.push_back(coordinator.schedule("add", float(i), 0.5f));
      const auto began = std::chrono::steady_clock::now();
      coordinator.join();
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
      expect(once.fetch().at(0).item<float>() == 7.0f, "stall_once's result");
      for (int i = 0; i < 10; ++i) {
        expect(adds[static_cast<std::size_t>(i)].fetch().at(0).item<float>() == float(i) + 0.5f, "add " + std::to_string(i));
      }
      expect(coordinator.closures_retried() >= 1, "no closure ran again");
      expect(took < 5.5, "join took " + std::to_string(took) + " s: the stuck closure was not run elsewhere");
      std::cout << "PASS given up and run elsewhere in " << took << " s, retried=" << coordinator.closures_retried()
                << std::endl;
      // 3. A closure that hangs on every worker: given up on one, then on the other, it fails.
      auto hang = coordinator.schedule("slow", 4000, 3);
      const std::string error = error_of([&] { coordinator.join(); });
      expect(contains(error, "ran longer than the stall shutdown bound (3 s, TROUPE_STALL_SHUTDOWN_S) on "
                             "/job:worker/replica:0/task:") &&
                 contains(error, " and again on /job:worker/replica:0/task:"),
             "join's error: " + error);
      expect(error_of([&] { hang.fetch(); }) != "", "the hung closure's value did not fail");
      std::cout << "PASS hanging everywhere fails: " << error << std::endl;
      std::this_thread::sleep_for(std::chrono::seconds(2));  // the stuck calls return before the daemons stop
    } else if (mode == "ckpt-save" || mode == "ckpt-check") {
      // ckpt-save: saves "big" (32 MiB over both ps tasks) and "small" holding k everywhere as
      // checkpoint k, for k = 1, 2, ... until the script SIGKILLs it mid-save (at most 60 saves).
      // ckpt-check: restores the newest intact checkpoint into zeros and checks that every
      // element holds its step.
      auto scope = strategy.scope();
      troupe::Variable big(Tensor::zeros({2048, 4096}), "big");
      troupe::Variable small(Tensor::zeros({5, 3}), "small");
      troupe::CheckpointManager manager(troupe::Checkpoint({{"big", big}, {"small", small}}), ckpt_dir, 3);
      if (mode == "ckpt-check") {
        const auto step = manager.restore_or_initialize();
        expect(step.has_value() && *step >= 1, "no checkpoint restored");
        const float want = static_cast<float>(*step);
        for (float v : big.value().to_vector<float>()) expect(v == want, "big holds " + std::to_string(v));
        for (float v : small.value().to_vector<float>()) expect(v == want, "small holds " + std::to_string(v));
        std::cout << "PASS restored checkpoint " << *step << ": every element holds " << want << std::endl;
      } else {
        for (int k = 1; k <= 60; ++k) {
          big.assign(Tensor::full({2048, 4096}, static_cast<float>(k)));
          small.assign(Tensor::full({5, 3}, static_cast<float>(k)));
          std::cout << "saving " << k << std::endl;
          manager.save(k);
          std::cout << "saved " << k << std::endl;
        }
        fail("60 saves and never killed");
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
