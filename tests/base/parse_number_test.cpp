#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "troupe/base/parse_number.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::base;

TEST_CASE("parse_int reads a whole decimal integer and refuses everything else") {
  CHECK(parse_int("0") == 0);
  CHECK(parse_int("42") == 42);
  CHECK(parse_int("-7") == -7);
  CHECK(parse_int("9223372036854775807") == std::numeric_limits<long long>::max());
  CHECK_FALSE(parse_int("9223372036854775808"));  // out of range, not wrapped
  CHECK_FALSE(parse_int(""));
  CHECK_FALSE(parse_int("0x10"));  // decimal only
  CHECK_FALSE(parse_int("12abc"));
  CHECK_FALSE(parse_int(" 3"));
  CHECK_FALSE(parse_int("3 "));
  CHECK_FALSE(parse_int("+3"));
  CHECK_FALSE(parse_int("1.5"));
}

TEST_CASE("parse_uint refuses a sign") {
  CHECK(parse_uint("18446744073709551615") == std::numeric_limits<unsigned long long>::max());
  CHECK_FALSE(parse_uint("-1"));
  CHECK_FALSE(parse_uint("18446744073709551616"));
}

TEST_CASE("parse_double reads decimal numbers, refuses hexadecimal and trailing text") {
  CHECK(parse_double("1") == 1.0);
  CHECK(parse_double("-0.5") == -0.5);
  CHECK(parse_double("3e-4") == 3e-4);
  CHECK(std::isinf(*parse_double("inf")));
  CHECK(std::isnan(*parse_double("nan")));
  CHECK_FALSE(parse_double("0x10"));
  CHECK_FALSE(parse_double("0x1p3"));
  CHECK_FALSE(parse_double("1e999"));  // beyond double
  CHECK_FALSE(parse_double("0.1x"));
  CHECK_FALSE(parse_double(""));
}

TEST_CASE("parse_port takes 1..65535, and 0 only when asked") {
  CHECK(parse_port("1") == 1);
  CHECK(parse_port("65535") == 65535);
  CHECK_FALSE(parse_port("65536"));
  CHECK_FALSE(parse_port("0"));
  CHECK(parse_port("0", true) == 0);
  CHECK_FALSE(parse_port("-1"));
  CHECK_FALSE(parse_port("80a"));
}

}  // namespace TROUPE_TEST_FILE
