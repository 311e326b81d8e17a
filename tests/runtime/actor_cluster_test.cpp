#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include "../common/free_port.hpp"
#include "distribute/cluster/actor_host.hpp"
#include "distribute/cluster/remote_wire.hpp"
#include "test_util.hpp"
#include "troupe/troupe.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::message_of;
namespace wire = troupe::distribute::detail;

namespace {

// Doubles what it is sent; "count" answers how many messages it handled.
class Doubler : public Actor {
 public:
  std::vector<Tensor> receive(const std::string& name, const std::vector<Tensor>& tensors) override {
    ++handled_;
    if (name == "count") return {Tensor::scalar<std::int64_t>(handled_)};
    if (name == "sleep") {
      std::this_thread::sleep_for(std::chrono::milliseconds(tensors.at(0).item<std::int32_t>()));
      return {};
    }
    if (name != "double") throw std::invalid_argument("no message " + name);
    std::vector<Tensor> out;
    for (const auto& t : tensors) out.push_back(t * 2.0f);
    return out;
  }

 private:
  std::int64_t handled_ = 0;
};

FunctionRegistry doubler_registry() {
  FunctionRegistry r;
  r.add_actor("doubler", [](const std::vector<Tensor>& args) -> std::unique_ptr<Actor> {
    if (!args.empty()) throw std::invalid_argument("doubler takes no arguments");
    return std::make_unique<Doubler>();
  });
  return r;
}

ActorClusterOptions quiet_options() {
  ActorClusterOptions o;
  o.connect_timeout = std::chrono::seconds(10);
  o.log = [](const std::string&) {};
  return o;
}

}  // namespace

TEST_CASE("a registry refuses actor types without a name, twice, under troupe. or without a factory") {
  FunctionRegistry r = doubler_registry();
  auto factory = [](const std::vector<Tensor>&) -> std::unique_ptr<Actor> { return std::make_unique<Doubler>(); };
  CHECK(contains(message_of([&] { r.add_actor("doubler", factory); }), "actor type 'doubler' is registered already"));
  CHECK(contains(message_of([&] { r.add_actor("", factory); }), "an actor type with an empty name"));
  CHECK(contains(message_of([&] { r.add_actor("troupe.trial", factory); }), "begins with \"troupe.\""));
  CHECK(contains(message_of([&] { r.add_actor("empty", ActorFactory{}); }), "actor type 'empty' has no factory"));
  r.add("doubler", [](FunctionContext&) { return std::vector<Tensor>{}; });  // functions: a name space of their own
  CHECK(r.actor_types() == std::vector<std::string>{"doubler"});
  CHECK(r.find_actor("doubler") != nullptr);
  CHECK(r.find_actor("nope") == nullptr);
}

TEST_CASE("a host names the type and the task of a spawn it refuses, and checks the arguments' bytes") {
  const FunctionRegistry r = doubler_registry();
  const std::string task = "/job:worker/replica:0/task:3";
  auto made = wire::make_actor(r, task, "trial", wire::encode_tensors({}));
  CHECK(!made.receive);
  CHECK(contains(made.error, "actor type 'trial' on /job:worker/replica:0/task:3 is not registered there (it has: doubler)"));
  made = wire::make_actor(r, task, "doubler", "not tensors");
  CHECK(!made.receive);
  CHECK(contains(made.error, "actor type 'doubler' on /job:worker/replica:0/task:3: its factory failed: actor arguments: malformed"));
  made = wire::make_actor(r, task, "doubler", wire::encode_tensors({Tensor::scalar<float>(1)}));
  CHECK(contains(made.error, "doubler takes no arguments"));
  made = wire::make_actor(r, task, "doubler", wire::encode_tensors({}));
  REQUIRE(made.receive);
  auto reply = made.receive("double", wire::encode_tensors({Tensor::from_vector<float>({1, -2}, {2})}));
  REQUIRE(reply.ok);
  CHECK(wire::decode_tensors(reply.payload)[0].to_vector<float>() == std::vector<float>({2, -4}));
  CHECK(contains(message_of([&] { made.receive("double", "junk"); }), "actor message: malformed"));
}

TEST_CASE("an ActorCluster refuses a cluster beyond loopback without a token, a bad own task and a bad bound") {
  Runtime rt;
  ClusterSpec spec(ClusterSpec::JobMap{{"chief", {"127.0.0.1:1"}}, {"worker", {"10.1.2.3:2222"}}});
  ActorClusterOptions o = quiet_options();
  CHECK(contains(message_of([&] { ActorCluster a(rt, spec, "chief:0", {}, o); }),
                 "ActorCluster: the cluster spans more than loopback (10.1.2.3:2222) and no cluster token is set"));
  ClusterSpec local(ClusterSpec::JobMap{{"chief", {"127.0.0.1:1"}}, {"worker", {"127.0.0.1:2"}}});
  CHECK(contains(message_of([&] { ActorCluster a(rt, local, "chief", {}, o); }), "own task 'chief' is not TYPE:INDEX"));
  o.max_message_bytes = 10;
  CHECK(contains(message_of([&] { ActorCluster a(rt, local, "chief:0", {}, o); }), "max_message_bytes is 10"));
}

TEST_CASE("actors spawned on an in-process Server and locally answer requests and sends alike") {
  // Two runtimes: the spawner and the task are two actor systems, talking over loopback.
  const auto port = [] { return "127.0.0.1:" + std::to_string(troupe::testing::free_port()); };
  ClusterSpec spec(ClusterSpec::JobMap{{"chief", {port()}}, {"worker", {port()}}});
  Runtime task_rt;
  ServerOptions so;
  so.log = [](const std::string&) {};
  Server server(task_rt, spec, "worker", 0, doubler_registry(), so);
  Runtime rt;
  ActorCluster actors(rt, spec, "chief:0", doubler_registry(), quiet_options());
  CHECK(actors.task() == "/job:chief/replica:0/task:0");
  for (const std::string where : {"worker:0", "local", "chief:0"}) {
    CAPTURE(where);
    ActorHandle h = actors.spawn("doubler", where);
    CHECK(h.task() == (where == "worker:0" ? "/job:worker/replica:0/task:0" : "local"));
    auto r = h.request("double", {Tensor::from_vector<float>({1, 2, 3}, {3}), Tensor::scalar<float>(-4)});
    REQUIRE(r.size() == 2);
    CHECK(r[0].to_vector<float>() == std::vector<float>({2, 4, 6}));
    CHECK(r[1].item<float>() == -8.0f);
    h.send("double", {Tensor::scalar<float>(1)});
    CHECK(h.request("count")[0].item<std::int64_t>() == 3);  // the send arrived before it
    // Sends cross in batches (a full one at once, the rest when the requester runs); a request
    // of either kind goes after the sends before it, and the sends after it after it.
    for (int i = 0; i < 600; ++i) h.send("double", {Tensor::scalar<float>(1)});
    ActorRequest counted = h.request_async("count");
    h.send("double", {Tensor::scalar<float>(1)});
    CHECK(h.request("count")[0].item<std::int64_t>() == 606);
    CHECK(counted.receive()[0].item<std::int64_t>() == 604);
    // A request past its timeout, whose reply comes later: the next request gets its own reply.
    CHECK(contains(message_of([&] { h.request("sleep", {Tensor::scalar<std::int32_t>(150)}, std::chrono::milliseconds(20)); }),
                   "no answer within"));
    CHECK(h.request("count")[0].item<std::int64_t>() == 608);
    CHECK(contains(message_of([&] { h.request("nope"); }), "no message nope"));
    CHECK(contains(message_of([&] { h.request(std::string(300, 'x')); }), "a message name of 300 bytes"));
    CHECK(!h.down());
    h.stop();
    CHECK(contains(message_of([&] { h.request("count"); }), "is down: stopped by its spawner"));
  }
  CHECK(contains(message_of([&] { actors.spawn("doubler", "worker:0", {Tensor::scalar<float>(1)}); }),
                 "doubler takes no arguments"));
  CHECK(contains(message_of([&] { actors.spawn("doubler", "ps:0"); }), "the cluster has no such task (it has: chief:0, worker:0)"));
  CHECK(contains(message_of([&] { actors.spawn("doubler", "nowhere"); }), "is not \"local\", \"any\", \"any:JOB\", TYPE:INDEX"));
  CHECK(contains(message_of([] { ActorHandle().request("x"); }), "an empty handle"));
}

TEST_CASE("an asynchronous request completes through receive() or then(), its callbacks off the caller's stack") {
  const auto port = [] { return "127.0.0.1:" + std::to_string(troupe::testing::free_port()); };
  ClusterSpec spec(ClusterSpec::JobMap{{"chief", {port()}}, {"worker", {port()}}});
  Runtime task_rt;
  ServerOptions so;
  so.log = [](const std::string&) {};
  Server server(task_rt, spec, "worker", 0, doubler_registry(), so);
  Runtime rt;
  std::vector<std::string> lines;
  std::mutex lines_mutex;
  ActorClusterOptions o = quiet_options();
  o.log = [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(lines_mutex);
    lines.push_back(line);
  };
  ActorCluster actors(rt, spec, "chief:0", doubler_registry(), o);
  for (const std::string where : {"worker:0", "local"}) {
    CAPTURE(where);
    ActorHandle h = actors.spawn("doubler", where);
    // receive(): the reply's tensors, or the actor's error as troupe::Error.
    ActorRequest r = h.request_async("double", {Tensor::from_vector<float>({1, 2}, {2})});
    CHECK(r.receive()[0].to_vector<float>() == std::vector<float>({2, 4}));
    CHECK(r.ready());
    CHECK(r.receive()[0].to_vector<float>() == std::vector<float>({2, 4}));  // again
    CHECK(contains(message_of([&] { h.request_async("nope").receive(); }), "no message nope"));

    // then(): on another thread than the caller's, and a callback may make a blocking request.
    std::promise<std::pair<std::thread::id, float>> got;
    h.request_async("double", {Tensor::scalar<float>(3)}).then([&, h](std::vector<Tensor> reply) {
      const float nested = h.request("double", {reply.at(0)})[0].item<float>();  // 12
      got.set_value({std::this_thread::get_id(), nested});
    });
    auto f = got.get_future();
    REQUIRE(f.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    const auto [thread, nested] = f.get();
    CHECK(thread != std::this_thread::get_id());
    CHECK(nested == 12.0f);

    // The error callback, with the actor's text; one registered after completion runs too.
    std::promise<std::string> failed;
    ActorRequest bad = h.request_async("nope");
    while (!bad.ready()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    bad.then([](std::vector<Tensor>) {}, [&](const Error& e) { failed.set_value(e.what()); });
    auto ff = failed.get_future();
    REQUIRE(ff.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    CHECK(contains(ff.get(), "no message nope"));
    CHECK(contains(message_of([&] { bad.then([](std::vector<Tensor>) {}); }), "then() was called already"));

    // Many in flight: every callback runs once, in the order the actor answered.
    const int n = 500;
    std::atomic<int> seen{0};
    std::atomic<bool> in_order{true};
    std::promise<void> all;
    const std::int64_t before = h.request("count")[0].item<std::int64_t>();
    for (int i = 0; i < n; ++i) {
      h.request_async("count").then([&, i, before](std::vector<Tensor> reply) {
        if (reply.at(0).item<std::int64_t>() != before + 1 + i) in_order = false;
        if (++seen == n) all.set_value();
      });
    }
    REQUIRE(all.get_future().wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    CHECK(seen == n);
    CHECK(in_order);

    // A timeout, and an actor that is down, come through the request.
    CHECK(contains(message_of([&] {
                     h.request_async("sleep", {Tensor::scalar<std::int32_t>(600)}, std::chrono::milliseconds(50)).receive();
                   }),
                   "no answer within 50 ms"));
    h.stop();
    CHECK(contains(message_of([&] { h.request_async("count").receive(); }), "is down: stopped by its spawner"));
    // An error no callback handles is logged.
    h.request_async("count").then([](std::vector<Tensor>) {});
    bool logged = false;
    for (int i = 0; i < 1000 && !logged; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::lock_guard<std::mutex> lock(lines_mutex);
      for (const auto& l : lines) logged = logged || contains(l, "error no callback handled");
    }
    CHECK(logged);
  }
  CHECK(contains(message_of([] { ActorRequest().receive(); }), "an empty request"));
}

TEST_CASE("over the actor data connection: 1 MiB bit for bit, 2000 requests in flight, a stopping host fails them naming it") {
  const auto port = [] { return "127.0.0.1:" + std::to_string(troupe::testing::free_port()); };
  // The data connection (true) and the control plane alone (false) answer alike; only the first
  // connects to the task's actor data port.
  for (const bool data : {true, false}) {
    CAPTURE(data);
    ClusterSpec spec(ClusterSpec::JobMap{{"chief", {port()}}, {"worker", {port()}}});
    Runtime task_rt;
    auto lines = std::make_shared<std::vector<std::string>>();
    auto lines_mutex = std::make_shared<std::mutex>();
    ServerOptions so;
    so.log = [lines, lines_mutex](const std::string& line) {
      std::lock_guard<std::mutex> lock(*lines_mutex);
      lines->push_back(line);
    };
    auto server = std::make_unique<Server>(task_rt, spec, "worker", 0, doubler_registry(), so);
    Runtime rt;
    ActorClusterOptions o = quiet_options();
    o.data_connections = data;
    ActorCluster actors(rt, spec, "chief:0", doubler_registry(), o);
    ActorHandle h = actors.spawn("doubler", "worker:0");
    // 1 MiB of floats, doubled exactly: bit for bit.
    std::vector<float> big(262144);
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 9973) * 0.37f - 1000.0f;
    const Tensor t = Tensor::from_vector<float>(big, {static_cast<std::int64_t>(big.size())});
    for (int i = 0; i < 3; ++i) {
      auto r = h.request("double", {t});
      REQUIRE(r.size() == 1);
      const auto got = r[0].to_vector<float>();
      REQUIRE(got.size() == big.size());
      bool equal = true;
      for (std::size_t k = 0; k < big.size(); ++k) equal = equal && got[k] == big[k] * 2.0f;
      CHECK(equal);
    }
    // Many in flight at once, with sends between them: each reply is its own, in order.
    std::vector<ActorRequest> inflight;
    for (int i = 0; i < 2000; ++i) {
      inflight.push_back(h.request_async("double", {Tensor::scalar<float>(static_cast<float>(i))}));
      if (i % 100 == 0) h.send("double", {Tensor::scalar<float>(1)});
    }
    bool each = true;
    for (int i = 0; i < 2000; ++i) each = each && inflight[static_cast<std::size_t>(i)].receive()[0].item<float>() == 2.0f * i;
    CHECK(each);
    CHECK(h.request("count")[0].item<std::int64_t>() == 3 + 2000 + 20 + 1);
    {
      std::lock_guard<std::mutex> lock(*lines_mutex);
      int connected = 0;
      for (const auto& line : *lines) connected += contains(line, "an actor spawner connected to the actor data port");
      CHECK(connected == (data ? 1 : 0));
    }
    if (!data) continue;  // over the control plane the actor's reply still goes out as it stops
    // The task stops with a request in flight: its data connection closes first, and the request
    // fails then (not at its timeout, nor with the actor's late reply), naming the task.
    ActorRequest sleeping = h.request_async("sleep", {Tensor::scalar<std::int32_t>(1500)}, std::chrono::seconds(20));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto t0 = std::chrono::steady_clock::now();
    std::thread stopper([&] { server.reset(); });
    const std::string why = message_of([&] { sleeping.receive(); });
    const auto took = std::chrono::steady_clock::now() - t0;
    stopper.join();
    CHECK(contains(why, "is down"));
    CHECK(contains(why, "/job:worker/replica:0/task:0"));
    CHECK(took < std::chrono::seconds(15));
    CHECK(contains(message_of([&] { h.request("count", {}, std::chrono::seconds(5)); }), "is down"));
  }
}

TEST_CASE("on one Runtime, cluster objects of one token share its TLS credentials, and another token is refused naming both") {
  const auto port = [] { return "127.0.0.1:" + std::to_string(troupe::testing::free_port()); };
  ClusterSpec spec(ClusterSpec::JobMap{{"chief", {port()}}, {"worker", {port(), port()}}});
  const std::string token = "one cluster's token";
  ServerOptions so;
  so.cluster_token = token;
  so.log = [](const std::string&) {};
  Runtime task0_rt, task1_rt;
  Server worker0(task0_rt, spec, "worker", 0, doubler_registry(), so);
  Server worker1(task1_rt, spec, "worker", 1, doubler_registry(), so);
  Runtime rt;
  ActorClusterOptions o = quiet_options();
  o.cluster_token = token;
  ActorCluster actors(rt, spec, "chief:0", doubler_registry(), o);
  {
    // Same token, same Runtime: one set of credentials, which outlives this object (it used to
    // install its own and leave the Runtime reading its closed files when it ended).
    ActorCluster second(rt, spec, "chief:0", doubler_registry(), o);
    ActorHandle h = second.spawn("doubler", "worker:0");
    CHECK(h.request("double", {Tensor::scalar<float>(3)})[0].item<float>() == 6.0f);
  }
  // Another token on the same Runtime: refused at construction, naming both uses and the remedy,
  // and nothing of the Runtime's credentials changes.
  ActorClusterOptions other = o;
  other.cluster_token = "another cluster's token";
  const std::string refused = message_of([&] { ActorCluster a(rt, spec, "chief:0", doubler_registry(), other); });
  CHECK(contains(refused, "ActorCluster: this process's actor system already holds the control plane's TLS credentials "
                          "of another cluster token, installed for ActorCluster"));
  CHECK(contains(refused, "give ActorCluster the same cluster token"));
  CHECK(contains(refused, "a troupe::Runtime of its own"));
  ClusterSpec ps_spec(ClusterSpec::JobMap{{"chief", {port()}}, {"worker", {port()}}, {"ps", {port()}}});
  ServerOptions other_so = so;
  other_so.cluster_token = other.cluster_token;
  CHECK(contains(message_of([&] {
                   ParameterServerStrategy s(rt, std::make_shared<SimpleClusterResolver>(ps_spec, "chief", 0), nullptr,
                                             other_so);
                 }),
                 "ParameterServerStrategy: this process's actor system already holds the control plane's TLS "
                 "credentials of another cluster token, installed for ActorCluster"));
  // A first connection to worker:1 after all that: made with the token's credentials.
  ActorHandle h1 = actors.spawn("doubler", "worker:1");
  CHECK(h1.request("double", {Tensor::scalar<float>(5)})[0].item<float>() == 10.0f);
  // A task's Server and an ActorCluster on its Runtime: the same token shares, another is refused.
  CHECK(contains(message_of([&] { ActorCluster a(task0_rt, spec, "worker:0", doubler_registry(), other); }),
                 "installed for Server"));
  ActorCluster on_task(task0_rt, spec, "worker:0", doubler_registry(), o);
  ActorHandle h2 = on_task.spawn("doubler", "worker:1");
  CHECK(h2.request("double", {Tensor::scalar<float>(-1)})[0].item<float>() == -2.0f);
  CHECK(h1.request("count")[0].item<std::int64_t>() == 2);  // its double and this count
}

TEST_CASE("a request in flight when its ActorCluster ends completes with an error") {
  const auto port = [] { return "127.0.0.1:" + std::to_string(troupe::testing::free_port()); };
  ClusterSpec spec(ClusterSpec::JobMap{{"chief", {port()}}, {"worker", {port()}}});
  Runtime task_rt;
  ServerOptions so;
  so.log = [](const std::string&) {};
  Server server(task_rt, spec, "worker", 0, doubler_registry(), so);
  Runtime rt;
  ActorRequest pending;
  std::promise<std::string> failed;
  {
    ActorCluster actors(rt, spec, "chief:0", doubler_registry(), quiet_options());
    ActorHandle h = actors.spawn("doubler", "worker:0");
    pending = h.request_async("sleep", {Tensor::scalar<std::int32_t>(300)});
    pending.then([](std::vector<Tensor>) {}, [&](const Error& e) { failed.set_value(e.what()); });
  }  // the callback ran before the destructor returned
  auto f = failed.get_future();
  REQUIRE(f.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
  const std::string got = f.get();
  CAPTURE(got);
  CHECK(contains(got, "its actor client is gone"));
  CHECK(contains(message_of([&] { pending.receive(); }), "its actor client is gone"));
  // The task's actor finishes its sleep (its reply goes nowhere) before the runtimes end.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
}

TEST_CASE("a RestartPolicy out of range is refused naming it") {
  Runtime rt;
  const auto port = [] { return "127.0.0.1:" + std::to_string(troupe::testing::free_port()); };
  ClusterSpec spec(ClusterSpec::JobMap{{"chief", {port()}}, {"worker", {port()}}});
  ActorCluster actors(rt, spec, "chief:0", doubler_registry(), quiet_options());
  CHECK(contains(message_of([&] { actors.spawn("doubler", "worker:0", {}, RestartPolicy{-1, std::chrono::seconds(1)}); }),
                 "RestartPolicy max_restarts -1"));
  CHECK(contains(message_of([&] { actors.spawn("doubler", "any", {}, RestartPolicy{1, std::chrono::milliseconds(0)}); }),
                 "within a window above 0 ms"));
  CHECK(actors.load() == std::vector<int>({0}));
  CHECK(contains(message_of([&] { actors.spawn("doubler", "any:chief"); }), "no chief task but this spawner's own"));
}

}  // namespace TROUPE_TEST_FILE
