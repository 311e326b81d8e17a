#include "troupe/transport/random.hpp"

#include <doctest/doctest.h>

#include <set>
#include <string>

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using troupe::transport::random_bytes;
using troupe::transport::random_hex;

TEST_CASE("random_bytes gives the bytes asked for, different each time") {
  CHECK(random_bytes(0, "test").empty());
  CHECK(random_bytes(1, "test").size() == 1);
  std::set<std::vector<std::uint8_t>> seen;
  for (int i = 0; i < 64; ++i) seen.insert(random_bytes(32, "test"));
  CHECK(seen.size() == 64);  // 64 draws of 256 bits: a repeat would mean no randomness at all
}

TEST_CASE("random_hex gives 2n lowercase hex digits") {
  const std::string h = random_hex(16, "test");
  REQUIRE(h.size() == 32);
  for (char c : h) CHECK(((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')));
  CHECK(random_hex(16, "test") != h);
}

}  // namespace TROUPE_TEST_FILE
