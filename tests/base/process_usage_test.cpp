#include "troupe/base/process_usage.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <vector>

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using troupe::base::process_usage;

TEST_CASE("process_usage reads this process's resident memory, and its CPU from the second sample on") {
  process_usage usage;
  const auto first = usage.sample();
  CHECK(first.cpu_percent == -1);  // no rate from one reading
  // Memory this test holds and has touched is resident.
  std::vector<char> held(32 << 20, 1);
  const auto busy_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  volatile unsigned long spin = 0;
  while (std::chrono::steady_clock::now() < busy_until) spin = spin + 1;
  const auto second = usage.sample();
  CHECK(second.rss_bytes >= static_cast<std::int64_t>(held.size()));
  CHECK(second.rss_bytes < (std::int64_t{1} << 40));
  // 300 ms of spinning on one thread: well above zero; a rate per core, so at most a few hundred
  // percent even with the clock's ticks rounding.
  CHECK(second.cpu_percent > 10);
  CHECK(second.cpu_percent < 100.0 * 1024);
  // Within 200 ms of the last reading the rate is repeated, not made from a tick or two.
  CHECK(usage.sample().cpu_percent == second.cpu_percent);
}

}  // namespace TROUPE_TEST_FILE
