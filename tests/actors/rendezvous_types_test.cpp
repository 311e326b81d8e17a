#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "../../actors/src/protocol.hpp"
#include "caf/io/all.hpp"
#include "troupe/actors/rendezvous.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::actors;
using namespace std::chrono_literals;

namespace {

struct system_with {
  explicit system_with(bool rendezvous_types) {
    cfg.load<caf::io::middleman>();
    if (rendezvous_types) add_rendezvous_types(cfg);
    system = std::make_unique<caf::actor_system>(cfg);
  }
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> system;
};

// `x` written by CAF's binary serializer and read back, as between two processes.
template <class T>
caf::error round_trip(caf::actor_system& sys, const T& in, T& out) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  auto copy = in;
  if (auto e = sink(copy)) return e;
  caf::binary_deserializer source{sys, buf};
  return source(out);
}

// A chief that hands out a nonce and answers every join with `answer`, whatever it is.
caf::behavior fake_chief(caf::event_based_actor*, caf::message answer) {
  return {
      [](nonce_atom) { return std::string("n"); },
      [=](join_atom, std::uint32_t, std::int32_t, const std::string&, const std::string&, std::int32_t,
          const std::string&, std::uint16_t) { return answer; },
  };
}

// What worker 1 of 2 gets from a chief that answers its join with `answer`: "" or the error.
std::string join_fake_chief(caf::message answer) {
  system_with chief_node(true), worker_node(true);
  auto chief = chief_node.system->spawn(fake_chief, std::move(answer));
  auto port = chief_node.system->middleman().publish(chief, 0, "127.0.0.1", true);
  REQUIRE(port);
  rendezvous_options o;
  o.rank = 1;
  o.tasks = {"/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"};
  o.chief_host = "127.0.0.1";
  o.chief_port = *port;
  o.data_host = "127.0.0.1";
  o.data_port = 40001;
  o.timeout = 5000ms;
  std::string result;
  try {
    rendezvous(*worker_node.system, o);
  } catch (const std::exception& e) {
    result = e.what();
  }
  caf::anon_send_exit(chief, caf::exit_reason::user_shutdown);
  return result;
}

std::vector<member> table_for_two() {
  return {{0, "/job:worker/replica:0/task:0", "127.0.0.1", 40000, 1, "", "00112233445566778899aabbccddeeff"},
          {1, "/job:worker/replica:0/task:1", "127.0.0.1", 40001, 1, "", ""}};
}

}  // namespace

TEST_CASE("a worker takes a good peer table from the chief and refuses a bad one") {
  CHECK(join_fake_chief(caf::make_message(table_for_two())).empty());
  auto three = table_for_two();
  three.push_back(three.back());
  CHECK(join_fake_chief(caf::make_message(three)) ==
        "rendezvous failed: the peer table from the chief /job:worker/replica:0/task:0 has 3 entries, this cluster "
        "has 2 workers (the same TF_CONFIG on every worker?)");
  auto moved = table_for_two();
  moved[1].data_port = 1;
  CHECK(join_fake_chief(caf::make_message(moved)).find("gives this worker (/job:worker/replica:0/task:1) the data "
                                                       "plane 127.0.0.1:1, it sent 127.0.0.1:40001") !=
        std::string::npos);
}

TEST_CASE("a worker shows the chief's rendezvous error as the chief wrote it") {
  const std::string text = "rendezvous failed: /job:worker/replica:0/task:1 failed the cluster token check";
  CHECK(join_fake_chief(caf::make_message(to_caf_error({rendezvous_errc::bad_token, text}))) == text);
}

TEST_CASE("the peer table travels as typed members between actor systems that announced them") {
  system_with announced(true);
  std::vector<member> table{{0, "/job:worker/replica:0/task:0", "10.0.0.1", 40000, 2, "0f9e", "00112233445566778899aabbccddeeff"},
                            {1, "/job:worker/replica:0/task:1", "10.0.0.2", 65535, 2, "", ""}};
  caf::message out;
  REQUIRE_FALSE(round_trip(*announced.system, caf::make_message(table), out));
  REQUIRE(out.match_elements<std::vector<member>>());
  const auto& back = out.get_as<std::vector<member>>(0);
  REQUIRE(back.size() == 2);
  CHECK(back[0].collective_id == "0f9e");
  CHECK(back[0].incarnation == "00112233445566778899aabbccddeeff");
  CHECK(back[1].rank == 1);
  CHECK(back[1].task == "/job:worker/replica:0/task:1");
  CHECK(back[1].data_host == "10.0.0.2");
  CHECK(back[1].data_port == 65535);
  CHECK(back[1].devices == 2);
}

TEST_CASE("a peer table does not arrive through an actor system that did not announce the rendezvous types") {
  system_with plain(false);
  caf::message out;
  auto error = round_trip(*plain.system, caf::make_message(std::vector<member>{member{}}), out);
  CHECK_FALSE(out.match_elements<std::vector<member>>());
}

TEST_CASE("a rendezvous error travels as a caf::error of category rendezvous and renders as its message") {
  system_with announced(true);
  const rendezvous_error e{rendezvous_errc::device_mismatch, "rendezvous failed: workers have different device counts"};
  caf::error back;
  REQUIRE_FALSE(round_trip(*announced.system, to_caf_error(e), back));
  CHECK(back.category() == caf::atom("rendezvous"));
  CHECK(back.code() == static_cast<std::uint8_t>(rendezvous_errc::device_mismatch));
  CHECK(announced.system->render(back) == e.message);
}

TEST_CASE("the rendezvous refuses an actor system built without the rendezvous types, saying what to call") {
  system_with plain(false);
  rendezvous_options o;
  o.tasks = {"/job:worker/replica:0/task:0"};
  o.chief_host = "127.0.0.1";
  o.data_host = "127.0.0.1";
  o.data_port = 40000;
  CHECK_THROWS_WITH_AS(rendezvous(*plain.system, o),
                       "rendezvous: this actor system was built without troupe's message types: call "
                       "troupe::Runtime::configure(config) on its config before constructing it",
                       std::invalid_argument);
}

TEST_CASE("the rendezvous checks its own options before anything travels") {
  system_with announced(true);
  rendezvous_options o;
  o.tasks = {"/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"};
  o.rank = 1;
  o.chief_host = "127.0.0.1";
  o.chief_port = 1;
  o.data_host = "127.0.0.1";
  o.data_port = 40001;
  o.devices = 0;
  CHECK_THROWS_WITH_AS(rendezvous(*announced.system, o),
                       "rendezvous: /job:worker/replica:0/task:1: devices is 0 (expected at least 1)",
                       std::invalid_argument);
}

TEST_CASE("a joiner's answer travels typed, and the joiner refuses one that does not fit its request") {
  system_with announced(true);
  join_answer a;
  a.table = table_for_two();
  a.table.push_back({2, "/job:worker/replica:0/task:2", "127.0.0.1", 40002, 1, "", ""});
  a.watch_ids = {0, 1, 3};
  a.generation = 2;
  a.incarnation = "00112233445566778899aabbccddeeff";
  a.rank = 2;
  a.changes = 1;
  a.max_workers = 3;
  caf::message out;
  REQUIRE_FALSE(round_trip(*announced.system, caf::make_message(a), out));
  REQUIRE(out.match_elements<join_answer>());
  const join_answer& back = out.get_as<join_answer>(0);
  CHECK(back.table.size() == 3);
  CHECK(back.watch_ids == std::vector<std::int32_t>{0, 1, 3});
  CHECK(back.generation == 2);
  CHECK(back.rank == 2);
  CHECK(back.changes == 1);
  CHECK(back.max_workers == 3);

  rendezvous_options o;
  o.rank = 2;
  for (int t = 0; t < 3; ++t) o.tasks.push_back("/job:worker/replica:0/task:" + std::to_string(t));
  o.devices = 1;
  o.data_host = "127.0.0.1";
  o.data_port = 40002;
  CHECK_FALSE(check_join_answer(o, back).has_value());
  join_answer moved = back;
  moved.table[2].data_port = 1;
  CHECK(check_join_answer(o, moved).value_or("").find("gives this worker the entry") != std::string::npos);
  join_answer short_ids = back;
  short_ids.watch_ids.pop_back();
  CHECK(check_join_answer(o, short_ids).value_or("").find("2 watch ids for 3 members") != std::string::npos);
  join_answer chief = back;
  chief.rank = 0;
  CHECK(check_join_answer(o, chief).value_or("").find("gives it rank 0") != std::string::npos);
  join_answer start = back;
  start.generation = 0;
  CHECK(check_join_answer(o, start).value_or("").find("generation 0") != std::string::npos);
}

}  // namespace TROUPE_TEST_FILE
