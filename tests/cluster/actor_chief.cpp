// The spawner of troupe's actor tests: spawns the actor types of actor_types.cpp on the
// troupe-worker daemons the test script started (and locally), and checks what comes back. Prints
// "PASS <mode>"; any mismatch exits 1 naming it.
#include <CLI/CLI.hpp>
#include <chrono>
#include <condition_variable>
#include <future>
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
  app.add_option("--mode", mode, "spawn | refused | down | orphan | every-role | any | restart | restart-stop | late | never | flood")->required();
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
  auto restarted = std::make_shared<std::vector<td::ActorRestart>>();
  options.on_restart = [notices, restarted](const td::ActorRestart& r) {
    std::lock_guard<std::mutex> lock(notices->mutex);
    std::cout << "restart: #" << r.previous_id << " from " << r.from << " -> #" << r.id << " on " << r.task
              << " (" << r.restarts << ")" << (r.error.empty() ? "" : " error: " + r.error) << std::endl;
    restarted->push_back(r);
    notices->cv.notify_all();
  };
  // The n-th restart notice, waiting at most `bound`.
  auto restart_notice = [notices, restarted](std::size_t n, std::chrono::milliseconds bound) {
    std::unique_lock<std::mutex> lock(notices->mutex);
    std::optional<td::ActorRestart> out;
    notices->cv.wait_for(lock, bound, [&] { return restarted->size() >= n; });
    if (restarted->size() >= n) out = (*restarted)[n - 1];
    return out;
  };
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
    // Asynchronously: then() on the callback thread, receive() waiting.
    std::promise<float> sum;
    a.request_async("add", {Tensor::from_vector<float>({0, 0, 0, 1}, {4})}).then(
        [&](std::vector<Tensor> reply) { sum.set_value(values(reply.at(0))[3]); },
        [&](const troupe::Error& e) { sum.set_exception(std::make_exception_ptr(e)); });
    auto sf = sum.get_future();
    expect(sf.wait_for(std::chrono::seconds(10)) == std::future_status::ready && sf.get() == 46.0f, "then() on worker 1");
    expect(values(a.request_async("add", {Tensor::from_vector<float>({0, 0, 0, -1}, {4})}).receive()[0])[3] == 45.0f,
           "receive() on worker 1");
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
    // A request in flight when the host dies (the script kills or stops it once the actor says it
    // sleeps): it ends as down with the notice, not at its timeout nor never.
    expect_error(error_of<troupe::Error>(
                     [&] { a1.request("sleep", {Tensor::scalar<std::int32_t>(30000)}, std::chrono::seconds(40)); },
                     "in flight"),
                 {"is down", w1}, "a request in flight when the actor's host died");
    auto d = notices->wait_for(a1.id(), limit + std::chrono::seconds(20));
    expect(d.has_value(), "no down notice for the actor on worker 1");
    expect(d->task == w1 && d->type == "accumulator", "the down notice names " + d->type + " on " + d->task);
    expect(a1.down().has_value(), "the handle does not say it is down");
    expect_error(error_of<troupe::Error>([&] { a1.request("get", {}, std::chrono::seconds(5)); }, "down"),
                 {"is down", w1}, "a request to an actor whose host died");
    expect(values(a0.request("get")[0]) == std::vector<float>({1}), "the actor on worker 0 no longer answers");
    expect(!a0.down(), "the actor on worker 0 is said to be down");
    expect(!d->restarting, "an actor spawned without a policy is said to restart");
    std::cout << "cause: " << d->cause << std::endl;
    std::cout << "PASS down" << std::endl;
    return 0;
  }
  if (mode == "flood") {
    // A stranger floods worker 0 meanwhile (the script started it first): this spawner, with the
    // token, keeps spawning and talking there for 6 s, and every spawn and request succeeds.
    int rounds = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(6);
    while (std::chrono::steady_clock::now() < until) {
      td::ActorHandle h = actors.spawn("accumulator", "worker:0", {Tensor::scalar<float>(static_cast<float>(rounds))});
      auto r = h.request("add", {Tensor::scalar<float>(1)}, std::chrono::seconds(10));
      expect(r[0].item<float>() == static_cast<float>(rounds + 1), "a request during the flood");
      h.stop();
      ++rounds;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::cout << "spawned during the flood: " << rounds << std::endl;
    expect(rounds >= 5, "only " + std::to_string(rounds) + " spawns in 6 s of flood");
    // An over-size message from a token holder: refused by name before anything travels; the
    // actor answers on.
    td::ActorHandle a = actors.spawn("accumulator", "worker:0", {Tensor::scalar<float>(1)});
    expect_error(error_of<std::invalid_argument>([&] { a.request("echo", {Tensor::zeros({(4 << 20) / 4 + 1})}); },
                                                 "over-size"),
                 {"accumulator", w0, "'echo' is", "bytes (at most 4194304: ActorClusterOptions::max_message_bytes)"},
                 "an over-size request");
    expect_error(error_of<std::invalid_argument>([&] { a.send("echo", {Tensor::zeros({(4 << 20) / 4 + 1})}); },
                                                 "over-size send"),
                 {"max_message_bytes"}, "an over-size send");
    expect_error(error_of<std::invalid_argument>([&] { a.request_async("echo", {Tensor::zeros({(4 << 20) / 4 + 1})}); },
                                                 "over-size async"),
                 {"max_message_bytes"}, "an over-size asynchronous request");
    expect_error(error_of<std::invalid_argument>([&] { a.request(std::string(257, 'n')); }, "long name"),
                 {"a message name of 257 bytes (at most 256)"}, "an over-long message name");
    expect(a.request("get")[0].item<float>() == 1.0f, "the actor does not answer after the refusals");
    std::cout << "PASS flood" << std::endl;
    return 0;
  }
  if (mode == "restart") {
    // One for one: at most 1 restart within a minute.
    const td::RestartPolicy policy{1, std::chrono::minutes(1)};
    // Stopped by its spawner: not restarted.
    td::ActorHandle s = actors.spawn("accumulator", "worker:0", {Tensor::scalar<float>(0)}, policy);
    s.stop();
    auto ds = notices->wait_for(s.id(), limit + std::chrono::seconds(5));
    expect(ds && !ds->restarting, "a stopped supervised actor's down notice says it restarts");
    td::ActorHandle a = actors.spawn("accumulator", "worker:1", {Tensor::scalar<float>(7)}, policy);
    const std::uint64_t first = a.id();
    expect(a.request("add", {Tensor::scalar<float>(1)})[0].item<float>() == 8.0f, "add on worker 1");
    expect(a.request("get")[1].item<std::int32_t>() == 1 && a.task() == w1, "the actor is not on worker 1");
    // The script SIGKILLs worker 1 now: the actor answers again from worker 0, made anew from its
    // constructor arguments (7), through the same handle and a copy of it.
    td::ActorHandle copy = a;
    std::cout << "spawned" << std::endl;
    auto d = notices->wait_for(first, limit + std::chrono::seconds(20));
    expect(d && d->restarting && d->task == w1, "no down notice saying the actor on worker 1 restarts");
    auto r = restart_notice(1, std::chrono::seconds(20));
    expect(r && r->error.empty() && r->from == w1 && r->task == w0 && r->previous_id == first && r->restarts == 1,
           "no restart from worker 1 onto worker 0");
    auto got = copy.request("get", {}, std::chrono::seconds(10));
    expect(got[0].item<float>() == 7.0f && got[1].item<std::int32_t>() == 0,
           "the restarted actor does not answer from worker 0 with its constructor's sum");
    expect(a.task() == w0 && a.id() == r->id && a.restarts() == 1 && !a.down(), "the handle did not follow the new actor");
    auto async = a.request_async("add", {Tensor::scalar<float>(2)}).receive();
    expect(async[0].item<float>() == 9.0f, "an asynchronous request to the restarted actor");
    // The script SIGKILLs worker 0 now: a second loss within the window exceeds the budget.
    std::cout << "restarted" << std::endl;
    auto r2 = restart_notice(2, limit + std::chrono::seconds(20));
    expect(r2 && r2->id == 0 && contains(r2->error, "max_restarts 1"), "no notice that the policy gave up");
    expect_error(error_of<td::ActorRestartsExhausted>([&] { a.request("get"); }, "exhausted"),
                 {"accumulator", w0, "1 restart(s) within 60000 ms", "max_restarts 1", "not restarted"},
                 "a request to an actor over its restart budget");
    expect(a.down() && contains(*a.down(), "not restarted"), "down() does not say the policy gave up");
    std::cout << "PASS restart" << std::endl;
    return 0;
  }
  if (mode == "restart-stop") {
    // A supervised actor on worker 1 whose construction takes 1 s, so that its restart does too.
    const td::RestartPolicy policy{2, std::chrono::minutes(1)};
    td::ActorHandle a = actors.spawn("accumulator", "worker:1",
                                     {Tensor::scalar<float>(7), Tensor::scalar<std::int32_t>(1000)}, policy);
    const std::uint64_t first = a.id();
    expect(a.request("get")[1].item<std::int32_t>() == 1, "the actor is not on worker 1");
    // The script SIGKILLs worker 1 now; the restart onto worker 0 is under way when stop() comes.
    std::cout << "spawned" << std::endl;
    auto d = notices->wait_for(first, limit + std::chrono::seconds(20));
    expect(d && d->restarting, "no down notice saying the actor on worker 1 restarts");
    a.stop();
    auto r = restart_notice(1, std::chrono::seconds(20));
    expect(r.has_value(), "no restart notice");
    if (r->id != 0) {
      // The restart made its actor before it saw the stop: that new actor is the one stopped.
      auto d2 = notices->wait_for(r->id, limit + std::chrono::seconds(5));
      expect(d2 && contains(d2->cause, "stopped by its spawner") && !d2->restarting,
             "the actor the restart made was not stopped");
      std::cout << "stopped the new actor #" << r->id << " on " << r->task << std::endl;
    } else {
      expect(contains(r->error, "stopped by its spawner"), "the restart gave up for another reason: " + r->error);
      std::cout << "the restart made no actor" << std::endl;
    }
    expect(a.down() && contains(*a.down(), "stopped by its spawner"),
           "the handle does not say it was stopped: " + a.down().value_or("(it runs)"));
    expect_error(error_of<troupe::Error>([&] { a.request("get", {}, std::chrono::seconds(5)); }, "stopped"),
                 {"is down", "stopped by its spawner"}, "a request to the stopped actor");
    expect(actors.load("worker") == std::vector<int>({0, 0}),
           "an actor of the stopped handle still runs: the load is not 0, 0");
    std::cout << "PASS restart-stop" << std::endl;
    return 0;
  }
  if (mode == "late") {
    // Worker 1 starts after this spawn began: it is waited for within TROUPE_START_TIMEOUT_MS.
    std::cout << "spawning" << std::endl;
    const auto start = std::chrono::steady_clock::now();
    td::ActorHandle a = actors.spawn("accumulator", "worker:1", {Tensor::scalar<float>(3)});
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    std::cout << "spawned on the late task after " << waited.count() << " ms" << std::endl;
    expect(a.task() == w1 && a.request("get")[1].item<std::int32_t>() == 1, "the actor is not on worker 1");
    expect(a.request("add", {Tensor::scalar<float>(1)})[0].item<float>() == 4.0f, "add on the late task");
    std::cout << "PASS late" << std::endl;
    return 0;
  }
  if (mode == "never") {
    // Worker 1 never starts: the spawn gives up after TROUPE_START_TIMEOUT_MS, naming the task;
    // worker 0, running, takes a spawn at once.
    const auto bound = options.connect_timeout;
    const auto start = std::chrono::steady_clock::now();
    const std::string e = error_of<troupe::Error>([&] { actors.spawn("accumulator", "worker:1", {Tensor::scalar<float>(0)}); },
                                                  "never");
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    expect_error(e, {"accumulator", "worker:1", "cannot reach " + w1, "nothing listened there within " +
                     std::to_string(bound.count()) + " ms"}, "a spawn on a task that never listens");
    expect(waited >= bound / 2 && waited <= bound + std::chrono::seconds(10),
           "the spawn gave up after " + std::to_string(waited.count()) + " ms (its bound is " +
               std::to_string(bound.count()) + " ms)");
    td::ActorHandle a = actors.spawn("accumulator", "worker:0", {Tensor::scalar<float>(2)});
    expect(a.request("get")[0].item<float>() == 2.0f, "the actor on worker 0 does not answer");
    std::cout << "PASS never" << std::endl;
    return 0;
  }
  if (mode == "any") {
    // "any": the least-loaded worker (live actors this spawner placed there), ties by index.
    auto where = [](const td::ActorHandle& h) { return h.request("get")[1].item<std::int32_t>(); };
    auto load = [&] { return actors.load("worker"); };
    expect(load() == std::vector<int>({0, 0}), "the load before any spawn is not 0, 0");
    td::ActorHandle a = actors.spawn("accumulator", "any", {Tensor::scalar<float>(1)});
    td::ActorHandle b = actors.spawn("accumulator", "any", {Tensor::scalar<float>(2)});
    td::ActorHandle c = actors.spawn("accumulator", "any:worker", {Tensor::scalar<float>(3)});
    expect(a.task() == w0 && where(a) == 0, "the first 'any' spawn is on " + a.task() + " (expected worker 0: a tie)");
    expect(b.task() == w1 && where(b) == 1, "the second 'any' spawn is on " + b.task() + " (expected worker 1)");
    expect(c.task() == w0 && where(c) == 0, "the third 'any' spawn is on " + c.task() + " (expected worker 0)");
    expect(load() == std::vector<int>({2, 1}), "the load is not 2, 1 after three spawns");
    // A stopped actor no longer counts: worker 0 holds 1, worker 1 holds 1, the tie goes to 0.
    a.stop();
    expect(notices->wait_for(a.id(), limit + std::chrono::seconds(5)).has_value(), "no down notice for a stopped actor");
    expect(load() == std::vector<int>({1, 1}), "the load is not 1, 1 after a stop");
    td::ActorHandle d = actors.spawn("accumulator", "any", {Tensor::scalar<float>(4)});
    expect(d.task() == w0 && where(d) == 0, "after the stop, 'any' placed on " + d.task() + " (expected worker 0)");
    expect(load() == std::vector<int>({2, 1}), "the load is not 2, 1 after the fourth spawn");
    expect_error(error_of<std::invalid_argument>([&] { actors.spawn("accumulator", "any:ps"); }, "any:ps"),
                 {"accumulator", "any:ps", "no 'ps' tasks", "worker:1"}, "'any' over a job the cluster lacks");
    expect_error(error_of<troupe::Error>([&] { actors.spawn("no_such_type", "any"); }, "any unknown"),
                 {"no_such_type", w1, "accumulator"}, "an unknown type placed on any worker (worker 1 holds fewer)");
    // The script SIGKILLs worker 0 now: its actors go down, and "any" places on worker 1 although
    // it holds more than worker 0 did.
    std::cout << "placed" << std::endl;
    expect(notices->wait_for(c.id(), limit + std::chrono::seconds(20)).has_value(), "no down notice from worker 0");
    expect(notices->wait_for(d.id(), limit + std::chrono::seconds(5)).has_value(), "no down notice for d");
    expect(load() == std::vector<int>({0, 1}), "the load is not 0, 1 after worker 0 died");
    td::ActorHandle e = actors.spawn("accumulator", "any", {Tensor::scalar<float>(5)});
    expect(e.task() == w1 && where(e) == 1, "with worker 0 dead, 'any' placed on " + e.task());
    expect(load() == std::vector<int>({0, 2}), "the load is not 0, 2 at the end");
    std::cout << "PASS any" << std::endl;
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
