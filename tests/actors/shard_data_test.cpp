// A ps task's data port, in-process over loopback: a task_server holding a shard, a worker's
// shard_client, and a reader that stops reading in the middle of a shard; a task's stop ending
// what its function waits for.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "../../actors/src/protocol.hpp"
#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "troupe/actors/cluster_tasks.hpp"
#include "troupe/transport/bulk_channel.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::actors;
using namespace std::chrono_literals;
namespace tt = troupe::transport;

namespace {

struct node {
  node() {
    cfg.load<caf::io::middleman>();
    system = std::make_unique<caf::actor_system>(cfg);
  }
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> system;
};

// Shards of plain bytes: the elements are the whole value, an update assigns or adds.
task_handlers byte_shards() {
  task_handlers h;
  h.layout = [](const std::string& v) { return std::optional<shard_layout>(shard_layout{0, v.size(), 0}); };
  h.combine = [](char* value, const char* delta, std::size_t n, std::uint8_t, update_op op) {
    if (op == update_op::assign) {
      std::memcpy(value, delta, n);
    } else {
      for (std::size_t i = 0; i < n; ++i) value[i] = static_cast<char>(value[i] + delta[i]);
    }
    return std::optional<std::string>();
  };
  return h;
}

// Whether every byte of `s` is `c` (a CHECK on this prints a bool, not megabytes).
bool every_byte_is(const std::string& s, char c) {
  return s.find_first_not_of(c) == std::string::npos;
}

}  // namespace

TEST_CASE("a reader that stops in the middle of a shard holds up no update, and sees the shard whole") {
  node ps_node;
  node worker_node;
  const std::string task = "/job:ps/replica:0/task:0";
  task_server ps(*ps_node.system, task, "127.0.0.1", 0, nullptr, byte_shards());
  const std::size_t n = 32u << 20;  // well beyond what the sockets' buffers hold

  auto agent = worker_node.system->middleman().remote_actor("127.0.0.1", ps.port());
  REQUIRE(agent);
  caf::scoped_actor self{*worker_node.system};
  bool created = false;
  self->request(*agent, 10s, vnew_atom::value, std::string("s"), std::string(n, 'a'))
      .receive([&](bool ok) { created = ok; }, [](caf::error&) {});
  REQUIRE(created);
  std::string answer;
  self->request(*agent, 10s, data_atom::value).receive([&](std::string& a) { answer = a; }, [](caf::error&) {});
  REQUIRE(answer.size() == 2 + 32);
  const auto port = static_cast<std::uint16_t>(static_cast<unsigned char>(answer[0]) |
                                               static_cast<unsigned char>(answer[1]) << 8);

  // A worker asks for the whole shard, takes its first bytes and stops reading.
  auto stalled = tt::bulk_stream::connect(tt::endpoint{"127.0.0.1", port}, tt::ring_auth{"", answer.substr(2)}, 10000ms,
                                          "ps task 0");
  tt::bulk_request r;
  r.key = "s";
  r.bytes = n;
  stalled->send_request(r, nullptr);
  stalled->receive_reply(n);
  std::string head(16, '\0');
  stalled->receive(head.data(), head.size());
  CHECK(every_byte_is(head, 'a'));

  // Another worker's update goes through at once, and its reads see it.
  shard_client client(*worker_node.system, "/job:worker/replica:0/task:0", {task_endpoint{task, "127.0.0.1", ps.port()}},
                      nullptr, 10000ms);
  const std::string delta(n, 'b');
  const auto t0 = std::chrono::steady_clock::now();
  client.update_from({shard_client::shard_write{0, "s", update_op::assign, delta.data(), n, 0}});
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  std::string back(n, '\0');
  client.read_into({shard_client::shard_read{0, "s", back.data(), n, 0}});
  CHECK(every_byte_is(back, 'b'));
  const std::string one(n, '\1');
  client.update_from({shard_client::shard_write{0, "s", update_op::add, one.data(), n, 0}});
  client.read_into({shard_client::shard_read{0, "s", back.data(), n, 0}});
  CHECK(every_byte_is(back, 'c'));

  // The stalled reader, reading again, gets the shard as it was when it asked: whole.
  std::string rest(n - head.size(), '\0');
  stalled->receive(rest.data(), rest.size());
  CHECK(every_byte_is(rest, 'a'));

  // A read of a size other than the shard's is refused by the ps task, naming it.
  try {
    client.read_into({shard_client::shard_read{0, "s", back.data(), n - 1, 0}});
    FAIL("a read of the wrong size was answered");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("reading variable shard 's' on ps task " + task + " failed: ps task " + task +
                                     ": variable shard 's' on " + task + " holds 33554432 bytes") == 0);
  }
}

namespace {

// A port that accepts connections (the kernel's backlog) and never says a word: a ps task stopped
// or stuck, as a worker sees it.
struct silent_port {
  silent_port() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 16) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~silent_port() { ::close(fd); }
  int fd = -1;
  std::uint16_t port = 0;
};

}  // namespace

TEST_CASE("cancel ends a worker's wait for a ps task that never answers, and every later request, at once") {
  node worker_node;
  silent_port ps;
  shard_client client(*worker_node.system, "/job:worker/replica:0/task:0",
                      {task_endpoint{"/job:ps/replica:0/task:0", "127.0.0.1", ps.port}}, nullptr, 60000ms);
  auto reading = std::async(std::launch::async, [&] { return client.read_many({{0, "w"}}); });
  // Still waiting for the silent ps task well after the read began (its bound is 60 s).
  CHECK(reading.wait_for(300ms) == std::future_status::timeout);
  client.cancel("/job:worker/replica:0/task:0 is stopping");
  REQUIRE(reading.wait_for(10s) == std::future_status::ready);
  try {
    reading.get();
    FAIL("a read of a ps task that never answered returned");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("cannot reach ps task /job:ps/replica:0/task:0 at 127.0.0.1:" +
                                     std::to_string(ps.port) + ": /job:worker/replica:0/task:0 is stopping") !=
          std::string::npos);
  }
  // Nothing waits from now on.
  std::string into(4, '\0');
  CHECK_THROWS_WITH_AS(client.read_into({shard_client::shard_read{0, "w", into.data(), 4, 0}}),
                       doctest::Contains("is stopping"), std::runtime_error);
}

TEST_CASE("a worker task answers its peers while a function runs, and its stop ends the function's waits and drops the queue") {
  node worker_node;
  node chief_node;
  std::mutex mutex;
  std::condition_variable wake;
  bool cancelled = false;
  int started = 0;
  task_handlers h;
  h.call = [&](const std::string& function, const std::string&) {
    std::unique_lock<std::mutex> lock(mutex);
    ++started;
    wake.notify_all();
    // Waits, as a function waiting on a ps task would, until the task's stop cancels the wait.
    wake.wait(lock, [&] { return cancelled; });
    return call_reply{false, function + " gave up: the task stops"};
  };
  h.cancel = [&] {
    std::lock_guard<std::mutex> lock(mutex);
    cancelled = true;
    wake.notify_all();
  };
  const std::string task = "/job:worker/replica:0/task:0";
  auto worker = std::make_unique<task_server>(*worker_node.system, task, "127.0.0.1", 0, nullptr, h);
  auto agent = chief_node.system->middleman().remote_actor("127.0.0.1", worker->port());
  REQUIRE(agent);
  caf::scoped_actor chief{*chief_node.system};
  chief->send(*agent, call_atom::value, std::uint64_t{1}, std::string("first"), std::string());
  chief->send(*agent, call_atom::value, std::uint64_t{2}, std::string("second"), std::string());
  {
    std::unique_lock<std::mutex> lock(mutex);
    REQUIRE(wake.wait_for(lock, 10s, [&] { return started == 1; }));
  }
  // The function runs; the agent still answers a hello, with its task's name.
  std::string name;
  chief->request(*agent, 10s, hello_atom::value, std::string("/job:chief/replica:0/task:0"), caf::actor{chief})
      .receive([&](std::string& n, caf::actor&) { name = n; }, [](caf::error&) {});
  CHECK(name == task);
  // Stopping: the function's wait ends, the call queued behind it never runs, the server is gone.
  const auto t0 = std::chrono::steady_clock::now();
  worker.reset();
  CHECK(std::chrono::steady_clock::now() - t0 < 20s);
  CHECK(cancelled);
  CHECK(started == 1);
}

TEST_CASE("gathers and scatters on a data connection: rows by index, every size and index checked") {
  node ps_node;
  const std::string task = "/job:ps/replica:0/task:0";
  auto h = byte_shards();
  h.layout = [](const std::string& v) { return std::optional<shard_layout>(shard_layout{0, v.size(), 0, v.size() / 4}); };
  // Reached only by an operation the task checked (below, an unknown one never is).
  h.update = [](std::string&, update_op, const std::string&) { return std::optional<std::string>("applied"); };
  task_server ps(*ps_node.system, task, "127.0.0.1", 0, nullptr, h);
  node worker_node;
  auto agent = worker_node.system->middleman().remote_actor("127.0.0.1", ps.port());
  REQUIRE(agent);
  caf::scoped_actor self{*worker_node.system};
  std::string rows;  // 6 rows of 4 bytes: row r is "rrrr" as the digit r
  for (char r = '0'; r < '6'; ++r) rows += std::string(4, r);
  bool created = false;
  self->request(*agent, 10s, vnew_atom::value, std::string("e"), rows).receive([&](bool ok) { created = ok; },
                                                                                [](caf::error&) {});
  REQUIRE(created);
  shard_client client(*worker_node.system, "/job:worker/replica:0/task:0", {task_endpoint{task, "127.0.0.1", ps.port()}},
                      nullptr, 10000ms);

  const std::vector<std::uint64_t> ids{4, 0, 4};
  std::string got(12, '\0');
  client.gather_into({shard_client::shard_gather{0, "e", ids.data(), ids.size(), got.data(), 4, 0}});
  CHECK(got == "444400004444");
  // Row 1 twice: both added (byte_shards adds bytes); row 5 assigned.
  const std::vector<std::uint64_t> add_ids{1, 1};
  const std::string ones(8, '\1');
  client.scatter_from({shard_client::shard_scatter{0, "e", update_op::add, add_ids.data(), 2, ones.data(), 4, 0}});
  const std::vector<std::uint64_t> set_ids{5};
  client.scatter_from({shard_client::shard_scatter{0, "e", update_op::assign, set_ids.data(), 1, "zzzz", 4, 0}});
  std::string all(24, '\0');
  client.read_into({shard_client::shard_read{0, "e", all.data(), 24, 0}});
  CHECK(all == "00003333222233334444zzzz");

  // A row the shard lacks is refused naming it; nothing changes.
  const std::vector<std::uint64_t> outside{2, 6};
  CHECK_THROWS_WITH_AS(client.gather_into({shard_client::shard_gather{0, "e", outside.data(), 2, got.data(), 4, 0}}),
                       doctest::Contains("has 6 rows; the request names row 6 (index 1)"), std::runtime_error);
  CHECK_THROWS_WITH_AS(client.scatter_from({shard_client::shard_scatter{0, "e", update_op::add, outside.data(), 2, ones.data(), 4, 0}}),
                       doctest::Contains("has 6 rows; the request names row 6 (index 1)"), std::runtime_error);
  client.read_into({shard_client::shard_read{0, "e", all.data(), 24, 0}});
  CHECK(all == "00003333222233334444zzzz");

  // Sizes that are no whole number of indices (or of indices and rows) and a wrong element type,
  // on a proven connection of its own: refused, the connection kept in step.
  std::string answer;
  self->request(*agent, 10s, data_atom::value).receive([&](std::string& a) { answer = a; }, [](caf::error&) {});
  REQUIRE(answer.size() == 2 + 32);
  const auto port = static_cast<std::uint16_t>(static_cast<unsigned char>(answer[0]) |
                                               static_cast<unsigned char>(answer[1]) << 8);
  auto raw = tt::bulk_stream::connect(tt::endpoint{"127.0.0.1", port}, tt::ring_auth{"", answer.substr(2)}, 10000ms,
                                      "ps task 0");
  auto refused = [&](std::uint8_t kind, std::uint8_t dtype, std::uint64_t bytes, const std::string& why,
                     std::uint8_t op = 0) {
    tt::bulk_request r;
    r.kind = kind;
    r.op = op;
    r.dtype = dtype;
    r.key = "e";
    r.bytes = bytes;
    const std::string payload(static_cast<std::size_t>(bytes), '\0');
    raw->send_request(r, payload.data());
    CHECK_THROWS_WITH_AS(raw->receive_reply(0), doctest::Contains(why.c_str()), std::runtime_error);
  };
  refused(tt::bulk_request::gather, 0, 12, "a gather of 12 bytes is not a whole number of 8-byte row indices");
  refused(tt::bulk_request::scatter, 0, 13, "a scatter of 13 bytes is not a whole number of row indices and rows of 4");
  refused(tt::bulk_request::gather, 3, 8, "the request says type 3");
  // An operation byte that names none, on an update and on a scatter (a peer's byte is checked
  // before anything is applied).
  refused(tt::bulk_request::update, 0, 24, "update operation 7 is unknown (expected 0 assign, 1 add or 2 subtract)", 7);
  refused(tt::bulk_request::scatter, 0, 12, "update operation 255 is unknown", 255);
  // Optimizer updates: this task has no apply handler; and the sizes and parameters of one are
  // checked before anything is read into the shard (below, on a task that applies them).
  refused(tt::bulk_request::apply, 0, apply_params_bytes + 24, "applies no optimizer updates");
  // Still in step: a good gather on the same connection.
  tt::bulk_request good;
  good.kind = tt::bulk_request::gather;
  good.key = "e";
  good.bytes = 8;
  const std::uint64_t two = 2;
  raw->send_request(good, &two);
  raw->receive_reply(4);
  std::string row(4, '\0');
  raw->receive(row.data(), 4);
  CHECK(row == "2222");
  // And through the control plane: refused, the shard unchanged.
  std::string refusal;
  self->request(*agent, 10s, vupdate_atom::value, std::string("e"), std::uint8_t{3}, std::string(24, 'x'))
      .receive([](bool) {}, [&](caf::error& e) { refusal = e.context().get_as<std::string>(0); });
  CHECK(refusal.find("update operation 3 is unknown") != std::string::npos);
  all.assign(24, '\0');
  client.read_into({shard_client::shard_read{0, "e", all.data(), 24, 0}});
  CHECK(all == "00003333222233334444zzzz");
}

TEST_CASE("optimizer updates on a data connection: parameters, sizes, rows and the slots' kind checked first") {
  node ps_node;
  const std::string task = "/job:ps/replica:0/task:0";
  auto h = byte_shards();
  h.layout = [](const std::string& v) { return std::optional<shard_layout>(shard_layout{0, v.size(), 0, v.size() / 4}); };
  // Records what reaches the handler: the kind, the step and whether the slots are zeros at first.
  std::vector<std::string> seen;
  std::mutex seen_mutex;
  h.apply = [&](char* value, char* const* slots, const char* grad, std::size_t n, std::uint8_t, const apply_params& p,
                std::int64_t step) {
    std::lock_guard<std::mutex> lock(seen_mutex);
    std::string line = std::string(shard_optimizer_name(p.kind)) + " step " + std::to_string(step) + " bytes " +
                       std::to_string(n);
    for (int k = 0; k < slot_count(p.kind); ++k) {
      line += std::string(" slot") + (std::all_of(slots[k], slots[k] + n, [](char c) { return c == 0; }) ? "=0" : "!=0");
      slots[k][n - 1] = 1;  // seen by a later update of that row
    }
    for (std::size_t i = 0; i < n; ++i) value[i] = grad[i];
    seen.push_back(line);
    return std::optional<std::string>();
  };
  task_server ps(*ps_node.system, task, "127.0.0.1", 0, nullptr, h);
  node worker_node;
  auto agent = worker_node.system->middleman().remote_actor("127.0.0.1", ps.port());
  REQUIRE(agent);
  caf::scoped_actor self{*worker_node.system};
  bool created = false;
  self->request(*agent, 10s, vnew_atom::value, std::string("e"), std::string(16, '0'))
      .receive([&](bool ok) { created = ok; }, [](caf::error&) {});
  REQUIRE(created);
  shard_client client(*worker_node.system, "/job:worker/replica:0/task:0", {task_endpoint{task, "127.0.0.1", ps.port()}},
                      nullptr, 10000ms);
  apply_params adam;
  adam.kind = shard_optimizer::adam;
  adam.learning_rate = 0.01;
  unsigned char params[apply_params_bytes];
  encode_apply_params(adam, params);
  client.apply_from({shard_client::shard_apply{0, "e", shard_optimizer::adam, params, nullptr, 0, "abcdefghijklmnop", 16, 0}});
  const std::vector<std::uint64_t> rows{3, 1};
  client.apply_from({shard_client::shard_apply{0, "e", shard_optimizer::adam, params, rows.data(), 2, "WXYZwxyz", 8, 0}});
  std::string all(16, '\0');
  client.read_into({shard_client::shard_read{0, "e", all.data(), 16, 0}});
  CHECK(all == "abcdwxyzijklWXYZ");
  REQUIRE(seen.size() == 3);
  CHECK(seen[0] == "adam step 1 bytes 16 slot=0 slot=0");  // the slots made as zeros by the first update
  CHECK(seen[1] == "adam step 2 bytes 4 slot!=0 slot!=0");  // then kept: row 3 (byte 15 was set)...
  CHECK(seen[2] == "adam step 2 bytes 4 slot=0 slot=0");    // ...row 1, one update (step 2) for both rows

  // Another kind on the same shard is refused, naming both; the shard is unchanged.
  apply_params sgd;
  sgd.learning_rate = 0.1;
  unsigned char sgd_params[apply_params_bytes];
  encode_apply_params(sgd, sgd_params);
  CHECK_THROWS_WITH_AS(client.apply_from({shard_client::shard_apply{0, "e", shard_optimizer::sgd, sgd_params, nullptr, 0,
                                                                     "0123456789abcdef", 16, 0}}),
                       doctest::Contains("keeps the slots of adam; an update by sgd cannot use them"), std::runtime_error);
  client.read_into({shard_client::shard_read{0, "e", all.data(), 16, 0}});
  CHECK(all == "abcdwxyzijklWXYZ");

  // Hostile requests on a proven connection of their own: refused, the connection kept in step.
  std::string answer;
  self->request(*agent, 10s, data_atom::value).receive([&](std::string& a) { answer = a; }, [](caf::error&) {});
  REQUIRE(answer.size() == 2 + 32);
  const auto port = static_cast<std::uint16_t>(static_cast<unsigned char>(answer[0]) |
                                               static_cast<unsigned char>(answer[1]) << 8);
  auto raw = tt::bulk_stream::connect(tt::endpoint{"127.0.0.1", port}, tt::ring_auth{"", answer.substr(2)}, 10000ms,
                                      "ps task 0");
  auto refused = [&](std::uint8_t kind, std::uint8_t op, std::string payload, const std::string& why) {
    tt::bulk_request r;
    r.kind = kind;
    r.op = op;
    r.key = "e";
    r.bytes = payload.size();
    raw->send_request(r, payload.data());
    CHECK_THROWS_WITH_AS(raw->receive_reply(0), doctest::Contains(why.c_str()), std::runtime_error);
  };
  const std::string good(reinterpret_cast<const char*>(params), apply_params_bytes);
  refused(tt::bulk_request::apply, 2, "short", "is shorter than its 56 bytes of parameters");
  refused(tt::bulk_request::apply, 2, good + std::string(15, 'x'), "holds 16 bytes, the optimizer update's gradient has 15");
  refused(tt::bulk_request::apply_rows, 2, good + std::string(13, 'x'), "is not a whole number of row indices and rows of 4");
  std::string unknown = good;
  unknown[0] = 9;
  refused(tt::bulk_request::apply, 9, unknown + std::string(16, 'x'), "optimizer 9 is unknown");
  std::string nan = good;
  const double not_a_number = std::numeric_limits<double>::quiet_NaN();
  std::memcpy(nan.data() + 8, &not_a_number, 8);
  refused(tt::bulk_request::apply, 2, nan + std::string(16, 'x'), "learning_rate is nan");
  std::string beta = good;
  const double one = 1.0;
  std::memcpy(beta.data() + 24, &one, 8);
  refused(tt::bulk_request::apply, 2, beta + std::string(16, 'x'), "expected each in [0, 1)");
  refused(tt::bulk_request::apply, 0, good + std::string(16, 'x'), "the request's optimizer 0 is not its parameters' 2");
  std::string far_row = good;
  const std::uint64_t four = 4;
  far_row.append(reinterpret_cast<const char*>(&four), 8);
  far_row += "xxxx";
  refused(tt::bulk_request::apply_rows, 2, far_row, "has 4 rows; the optimizer update names row 4 (index 0)");
  client.read_into({shard_client::shard_read{0, "e", all.data(), 16, 0}});
  CHECK(all == "abcdwxyzijklWXYZ");  // nothing refused reached the shard
  CHECK(seen.size() == 3);
}

}  // namespace TROUPE_TEST_FILE
