// The input pipeline actor: order, its bound, the end, errors, depth 0, and stopping it.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "caf/all.hpp"
#include "troupe/actors/input_pipeline.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using troupe::actors::input_pipeline;

namespace {

constexpr std::chrono::microseconds spin{50};

// Produces 0, 1, ..., count-1 as ints, then the end; counts its calls.
struct counter {
  int count;
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  input_pipeline::item operator()() const {
    const int i = calls->fetch_add(1);
    if (i >= count) return nullptr;
    return std::make_shared<const int>(i);
  }
};

int value(const input_pipeline::item& x) { return *static_cast<const int*>(x.get()); }

// Waits (bounded) until f() holds.
template <class F>
bool eventually(F f) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!f()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace

TEST_CASE("the input pipeline actor hands out every item in order, then the end, for any depth") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  for (std::size_t depth : {0u, 1u, 2u, 5u}) {
    CAPTURE(depth);
    counter produce{10};
    input_pipeline p(sys, produce, depth, spin);
    for (int i = 0; i < 10; ++i) {
      auto x = p.next();
      REQUIRE(x != nullptr);
      CHECK(value(x) == i);
    }
    CHECK(p.next() == nullptr);
    CHECK(p.next() == nullptr);  // and after
  }
}

TEST_CASE("the input pipeline actor keeps exactly depth items ready while nobody takes them") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  counter produce{1000};
  input_pipeline p(sys, produce, 3, spin);
  REQUIRE(eventually([&] { return produce.calls->load() == 3; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(produce.calls->load() == 3);  // full: production stops
  CHECK(value(p.next()) == 0);
  REQUIRE(eventually([&] { return produce.calls->load() == 4; }));  // room for one more
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(produce.calls->load() == 4);
}

TEST_CASE("the input pipeline actor with depth 0 produces an item only when asked for one") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  counter produce{1000};
  input_pipeline p(sys, produce, 0, spin);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(produce.calls->load() == 0);
  CHECK(value(p.next()) == 0);
  CHECK(value(p.next()) == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(produce.calls->load() == 2);
}

TEST_CASE("the input pipeline actor rethrows a producer's error after the items made before it") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto calls = std::make_shared<int>(0);
  input_pipeline p(
      sys,
      [calls]() -> input_pipeline::item {
        const int i = (*calls)++;
        if (i == 2) throw std::runtime_error("row 2 is malformed");
        return std::make_shared<const int>(i);
      },
      4, spin);
  CHECK(value(p.next()) == 0);
  CHECK(value(p.next()) == 1);
  for (int attempt = 0; attempt < 2; ++attempt) {  // and again: the error stays
    std::string error;
    try {
      p.next();
    } catch (const std::runtime_error& e) {
      error = e.what();
    }
    CHECK(error == "row 2 is malformed");
  }
}

TEST_CASE("the input pipeline actor stops while its buffer is full, without the consumer taking anything") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  counter produce{1000};
  const auto start = std::chrono::steady_clock::now();
  {
    input_pipeline p(sys, produce, 2, spin);
    REQUIRE(eventually([&] { return produce.calls->load() == 2; }));
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK(produce.calls->load() == 2);
}

}  // namespace TROUPE_TEST_FILE
