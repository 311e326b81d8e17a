// The spawner of troupe's actor tests: spawns the actor types of actor_types.cpp on the
// troupe-worker daemons the test script started (and locally), and checks what comes back. Prints
// "PASS <mode>"; any mismatch exits 1 naming it.
#include <CLI/CLI.hpp>
#include <chrono>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <thread>
#include <vector>

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

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The message of what fn throws as E ("" when it throws nothing; another exception fails).
template <class E>
std::string error_of(const std::function<void()>& fn, const std::string& what) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    fail(what + ": threw another kind of exception: " + e.what());
  }
  fail(what + ": threw nothing");
}

void expect_error(const std::string& message, const std::vector<std::string>& parts, const std::string& what) {
  for (const auto& p : parts) expect(contains(message, p), what + ": '" + message + "' does not name '" + p + "'");
  std::cout << "error as expected: " << message << std::endl;
}

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

// The down notices, as the on_down callback hands them over.
struct downs {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<td::ActorDown> seen;

  std::optional<td::ActorDown> wait_for(std::uint64_t id, std::chrono::milliseconds bound) {
    std::unique_lock<std::mutex> lock(mutex);
    std::optional<td::ActorDown> out;
    cv.wait_for(lock, bound, [&] {
      for (const auto& d : seen) {
        if (d.id == id) out = d;
      }
      return out.has_value();
    });
    return out;
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The spawner of troupe's actor tests."};
  std::string mode = "spawn";
  std::string module;
  app.add_option("--mode", mode, "spawn | refused | down | orphan | every-role")->required();
  app.add_option("--module", module, "the module of actor types (for the local actors)")->required();
  CLI11_PARSE(app, argc, argv);

  troupe::Runtime rt;
  auto resolver = std::make_shared<td::TFConfigClusterResolver>();
  td::FunctionRegistry registry;
  registry.load_module(module);
  auto options = td::ActorClusterOptions::from_environment();
  auto notices = std::make_shared<downs>();
  options.on_down = [notices](const td::ActorDown& d) {
    std::lock_guard<std::mutex> lock(notices->mutex);
    std::cout << "down: #" << d.id << " " << d.type << " on " << d.task << ": " << d.cause << std::endl;
    notices->seen.push_back(d);
    notices->cv.notify_all();
  };
  options.max_message_bytes = 4u << 20;
  if (mode == "every-role" && td::serve_if_worker_or_ps(rt, *resolver, registry)) {
    // This program as worker i: it served until its chief (which only spawned actors) left.
    std::cout << "served until the chief left" << std::endl;
    return 0;
  }
  td::ActorCluster actors(rt, *resolver, registry, options);
  const std::string w0 = "/job:worker/replica:0/task:0", w1 = "/job:worker/replica:0/task:1";
  const auto limit = options.heartbeat_interval * options.missed_heartbeats;

  if (mode == "spawn") {
    // A named task: request and response with tensors, a one-way send, the actor's own error.
    td::ActorHandle a = actors.spawn("accumulator", "worker:1", {Tensor::from_vector<float>({1, 2, 3, 4}, {4})});
    expect(a.task() == w1 && a.type() == "accumulator", "the handle names " + a.type() + " on " + a.task());
    auto r = a.request("add", {Tensor::from_vector<float>({10, 20, 30, 40}, {4})});
    expect(r.size() == 1 && values(r[0]) == std::vector<float>({11, 22, 33, 44}), "add did not return the sum");
    a.send("add", {Tensor::from_vector<float>({1, 1, 1, 1}, {4})});
    r = a.request("get");
    expect(r.size() == 2 && values(r[0]) == std::vector<float>({12, 23, 34, 45}), "the send was not applied before get");
    expect(r[1].item<std::int32_t>() == 1, "the actor did not run on worker 1");
    // 1 MiB and an int64 tensor, back bit for bit.
    std::vector<float> big(262144);
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.5f - 7.25f;
    r = a.request("echo", {Tensor::from_vector<float>(big, {512, 512}), Tensor::from_vector<std::int64_t>({-5, 1ll << 40})});
    expect(r.size() == 2 && r[0].shape() == troupe::Shape({512, 512}) && values(r[0]) == big, "1 MiB echo differs");
    expect(r[1].to_vector<std::int64_t>() == std::vector<std::int64_t>({-5, 1ll << 40}), "int64 echo differs");
    expect_error(error_of<troupe::Error>([&] { a.request("fail"); }, "fail"),
                 {"the trial diverged", "accumulator", w1, "'fail'"}, "the actor's error");
    expect_error(error_of<troupe::Error>([&] { a.request("sleep", {Tensor::scalar<std::int32_t>(1500)},
                                                          std::chrono::milliseconds(100)); }, "timeout"),
                 {"no answer within 100 ms", w1}, "a request past its timeout");
    r = a.request("get");  // after the sleep: the actor answers again, its state intact
    expect(values(r[0]) == std::vector<float>({12, 23, 34, 45}), "the state changed across the timeout");
    expect_error(error_of<std::invalid_argument>([&] {
                   a.request("echo", {Tensor::zeros({5 << 20 >> 2})});
                 }, "size"),
                 {"max_message_bytes", "accumulator"}, "a message over the bound");

    // Locally: the same handle, the same calls.
    td::ActorHandle l = actors.spawn("accumulator", "local", {Tensor::from_vector<float>({1, 2}, {2})});
    expect(l.task() == "local", "the local handle names " + l.task());
    r = l.request("add", {Tensor::from_vector<float>({2, 2}, {2})});
    expect(values(r[0]) == std::vector<float>({3, 4}), "local add");
    l.send("add", {Tensor::from_vector<float>({1, 1}, {2})});
    r = l.request("get");
    expect(values(r[0]) == std::vector<float>({4, 5}) && r[1].item<std::int32_t>() == -1, "local get");
    expect_error(error_of<troupe::Error>([&] { l.request("fail"); }, "local fail"), {"the trial diverged", "local"},
                 "a local actor's error");

    // Errors naming the type and the task.
    expect_error(error_of<troupe::Error>([&] { actors.spawn("no_such_type", "worker:0"); }, "unknown type"),
                 {"no_such_type", w0, "accumulator"}, "an unknown type on a task");
    expect_error(error_of<std::invalid_argument>([&] { actors.spawn("no_such_type", "local"); }, "unknown local"),
                 {"no_such_type", "local", "accumulator"}, "an unknown type locally");
    expect_error(error_of<std::invalid_argument>([&] { actors.spawn("accumulator", "worker:7"); }, "no task"),
                 {"accumulator", "worker:7", "worker:1"}, "a task the cluster lacks");
    expect_error(error_of<troupe::Error>([&] { actors.spawn("accumulator", "worker:0"); }, "factory"),
                 {"accumulator", w0, "takes its initial sum"}, "a constructor that refuses its arguments");

    // Stopped by its spawner: the down notice, and requests fail naming it.
    td::ActorHandle s = actors.spawn("accumulator", "worker:0", {Tensor::scalar<float>(0)});
    s.stop();
    auto d = notices->wait_for(s.id(), limit + std::chrono::seconds(5));
    expect(d && contains(d->cause, "stopped by its spawner") && d->task == w0, "no down notice for a stopped actor");
    expect_error(error_of<troupe::Error>([&] { s.request("get"); }, "stopped"), {"is down", "stopped by its spawner"},
                 "a request to a stopped actor");
    std::cout << "PASS spawn" << std::endl;
    return 0;
  }
  if (mode == "refused") {
    expect_error(error_of<troupe::Error>([&] { actors.spawn("accumulator", "worker:0", {Tensor::scalar<float>(0)}); },
                                         "refused"),
                 {"accumulator", w0, "cannot reach"}, "a spawn on a task with another token");
    std::cout << "PASS refused" << std::endl;
    return 0;
  }
  if (mode == "down") {
    // The script SIGKILLs (or SIGSTOPs) worker 1 once this says "spawned".
    td::ActorHandle a0 = actors.spawn("accumulator", "worker:0", {Tensor::scalar<float>(1)});
    td::ActorHandle a1 = actors.spawn("accumulator", "worker:1", {Tensor::scalar<float>(2)});
    expect(a1.request("get")[1].item<std::int32_t>() == 1, "a1 is not on worker 1");
    std::cout << "spawned" << std::endl;
    auto d = notices->wait_for(a1.id(), limit + std::chrono::seconds(20));
    expect(d.has_value(), "no down notice for the actor on worker 1");
    expect(d->task == w1 && d->type == "accumulator", "the down notice names " + d->type + " on " + d->task);
    expect(a1.down().has_value(), "the handle does not say it is down");
    expect_error(error_of<troupe::Error>([&] { a1.request("get", {}, std::chrono::seconds(5)); }, "down"),
                 {"is down", w1}, "a request to an actor whose host died");
    expect(values(a0.request("get")[0]) == std::vector<float>({1}), "the actor on worker 0 no longer answers");
    expect(!a0.down(), "the actor on worker 0 is said to be down");
    std::cout << "cause: " << d->cause << std::endl;
    std::cout << "PASS down" << std::endl;
    return 0;
  }
  if (mode == "every-role") {
    // The same program on every task: the workers serve under serve_if_worker_or_ps and take the
    // chief's first spawn as their chief's arrival; they end when this spawner leaves.
    for (int w = 0; w < 2; ++w) {
      td::ActorHandle h = actors.spawn("accumulator", "worker:" + std::to_string(w), {Tensor::scalar<float>(0)});
      auto r = h.request("add", {Tensor::scalar<float>(static_cast<float>(w + 1))});
      expect(r[0].item<float>() == static_cast<float>(w + 1), "worker " + std::to_string(w) + " did not add");
    }
    std::cout << "PASS every-role" << std::endl;
    return 0;
  }
  if (mode == "orphan") {
    // The script ends this process (SIGKILL) once it says "spawned": its actors must stop.
    td::ActorHandle a0 = actors.spawn("accumulator", "worker:0", {Tensor::scalar<float>(1)});
    expect(values(a0.request("get")[0]) == std::vector<float>({1}), "the actor on worker 0 does not answer");
    std::cout << "spawned" << std::endl;
    std::this_thread::sleep_for(std::chrono::seconds(60));
    fail("not killed within 60 s");
  }
  fail("unknown mode " + mode);
}
