// The back-pressure on one-way messages to an application actor, alone: how much may be
// unacknowledged, which message asks for its acknowledgement, and what an acknowledgement opens.
#include "troupe/actors/app_actors.hpp"

#include <doctest/doctest.h>

#include <thread>

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using troupe::actors::send_window;
using namespace std::chrono_literals;

TEST_CASE("send_window: max_messages small messages fit, the last asks for its acknowledgement, the next waits") {
  send_window w;
  bool ack = true;
  for (std::size_t i = 0; i + 1 < send_window::max_messages; ++i) {
    REQUIRE(w.reserve(4, &ack, 0ms));
    REQUIRE_FALSE(ack);
  }
  REQUIRE(w.reserve(4, &ack, 0ms));
  CHECK(ack);
  CHECK(w.outstanding() == send_window::max_messages);
  CHECK_FALSE(w.reserve(4, &ack, 10ms));
  // The actor's acknowledgement of the first ack_every opens as many.
  w.acknowledged(send_window::ack_every);
  CHECK(w.outstanding() == send_window::max_messages - send_window::ack_every);
  for (std::uint64_t i = 0; i < send_window::ack_every; ++i) CHECK(w.reserve(4, &ack, 0ms));
  CHECK_FALSE(w.reserve(4, &ack, 0ms));
  // A count already acknowledged opens nothing more; the whole count opens everything.
  w.acknowledged(send_window::ack_every);
  CHECK(w.outstanding() == send_window::max_messages);
  w.acknowledged(send_window::max_messages + send_window::ack_every);
  CHECK(w.outstanding() == 0);
}

TEST_CASE("send_window: bytes bound the window too, and one message of any size fits an empty window") {
  send_window w;
  bool ack = false;
  REQUIRE(w.reserve(send_window::max_bytes * 2, &ack, 0ms));
  CHECK(ack);  // alone it fills the window
  CHECK_FALSE(w.reserve(1, &ack, 0ms));
  w.acknowledged(1);
  REQUIRE(w.reserve(send_window::max_bytes / 2, &ack, 0ms));
  CHECK_FALSE(ack);
  REQUIRE(w.reserve(send_window::max_bytes / 2, &ack, 0ms));
  CHECK(ack);
  CHECK_FALSE(w.reserve(1, &ack, 0ms));
}

TEST_CASE("send_window: a sender waiting on a full window goes on when the acknowledgement comes") {
  send_window w;
  bool ack = false;
  for (std::size_t i = 0; i < send_window::max_messages; ++i) REQUIRE(w.reserve(1, &ack, 0ms));
  std::thread acker([&] {
    std::this_thread::sleep_for(50ms);
    w.acknowledged(send_window::max_messages);
  });
  CHECK(w.reserve(1, &ack, 10s));
  acker.join();
  CHECK(w.outstanding() == 1);
}

}  // namespace TROUPE_TEST_FILE
