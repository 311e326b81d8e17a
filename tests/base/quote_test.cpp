#include "troupe/base/quote.hpp"

#include <doctest/doctest.h>

#include <string>

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

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

TEST_CASE("printable_line keeps valid UTF-8 text as it is and replaces what a page cannot show") {
  using troupe::base::printable_line;
  CHECK(printable_line("paused after step 12", 256) == "paused after step 12");
  CHECK(printable_line("gr\xC3\xBC\xC3\x9F \xE2\x82\xAC \xF0\x9F\x98\x80", 256) == "gr\xC3\xBC\xC3\x9F \xE2\x82\xAC \xF0\x9F\x98\x80");
  const std::string fffd = "\xEF\xBF\xBD";
  CHECK(printable_line("a\tb", 256) == "a b");
  CHECK(printable_line("a\nb\rc", 256) == "a" + fffd + "b" + fffd + "c");
  CHECK(printable_line(std::string("a\0b", 3), 256) == "a" + fffd + "b");
  CHECK(printable_line("\x7f\xC2\x85", 256) == fffd + fffd);           // DEL and a C1 control
  CHECK(printable_line("a\xFF" "b", 256) == "a" + fffd + "b");          // not UTF-8 at all
  CHECK(printable_line("\xC0\xAF", 256) == fffd + fffd);                // an overlong '/'
  CHECK(printable_line("\xED\xA0\x80", 256) == fffd + fffd + fffd);     // a surrogate
  CHECK(printable_line("ab\xE2\x82", 256) == "ab" + fffd + fffd);       // a character cut short
}

TEST_CASE("printable_line cuts a long line on a character boundary, the ellipsis within the bound") {
  using troupe::base::printable_line;
  CHECK(printable_line("abcdefghij", 10) == "abcdefghij");
  CHECK(printable_line("abcdefghijk", 10) == "abcdefg...");
  // "€" is 3 bytes: 4 of them (12 bytes) into 10 keep 2 whole ones and the ellipsis.
  CHECK(printable_line("\xE2\x82\xAC\xE2\x82\xAC\xE2\x82\xAC\xE2\x82\xAC", 10) == "\xE2\x82\xAC\xE2\x82\xAC...");
  const std::string cut = printable_line(std::string(100'000, '\xFF'), 256);  // each byte grows to 3
  CHECK(cut.size() <= 256);
  CHECK(troupe::base::is_printable_line(cut));
  CHECK(cut.substr(cut.size() - 3) == "...");
}

TEST_CASE("is_printable_line accepts what printable_line makes and refuses control characters and bad UTF-8") {
  using troupe::base::is_printable_line;
  CHECK(is_printable_line(""));
  CHECK(is_printable_line("learning rate 0.001 from step 9 \xE2\x82\xAC"));
  CHECK_FALSE(is_printable_line("two\nlines"));
  CHECK_FALSE(is_printable_line("tab\there"));
  CHECK_FALSE(is_printable_line(std::string("nul\0", 4)));
  CHECK_FALSE(is_printable_line("\xC2\x9B" "31m"));  // a C1 CSI: a terminal's escape
  CHECK_FALSE(is_printable_line("\xFF"));
  CHECK_FALSE(is_printable_line("\xC0\xAF"));
  CHECK_FALSE(is_printable_line("\xED\xA0\x80"));
  CHECK_FALSE(is_printable_line("\xE2\x82"));
  CHECK_FALSE(is_printable_line("\xF4\x90\x80\x80"));  // beyond U+10FFFF
}

}  // namespace TROUPE_TEST_FILE
