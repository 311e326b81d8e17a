#include "troupe/base/quote.hpp"

#include <doctest/doctest.h>

#include <string>

using troupe::base::has_nul;
using troupe::base::quoted;

TEST_CASE("quoted puts short text between single quotes as it is") {
  CHECK(quoted("worker-1.example:2222") == "'worker-1.example:2222'");
  CHECK(quoted("") == "''");
}

TEST_CASE("quoted escapes NUL and control bytes so that nothing is cut or hidden") {
  CHECK(quoted(std::string("a\0b", 3)) == "'a\\0b'");
  CHECK(quoted("x\ny\tz\r") == "'x\\ny\\tz\\r'");
  CHECK(quoted("\x01\x7f") == "'\\x01\\x7f'");
}

TEST_CASE("quoted cuts long text and says how long the whole was") {
  const std::string host(120'000, 'h');
  const std::string q = quoted(host);
  CHECK(q == "'" + std::string(64, 'h') + "...' (120000 bytes)");
  CHECK(quoted("abcdef", 3) == "'abc...' (6 bytes)");
  CHECK(quoted("abc", 3) == "'abc'");
}

TEST_CASE("has_nul finds a NUL anywhere in a string") {
  CHECK_FALSE(has_nul("localhost"));
  CHECK(has_nul(std::string("local\0host", 10)));
  CHECK(has_nul(std::string(1, '\0')));
}
