#include "troupe/actors/worker_report.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using troupe::actors::check_worker_report;
using troupe::actors::log_tail;
using troupe::actors::worker_report;
using troupe::actors::worker_report_limits;

namespace {

worker_report good() {
  worker_report r;
  r.cpu_percent = 97.5;
  r.rss_bytes = 512 << 20;
  r.lines_total = 12;
  r.lines = {"paused after step 40", "learning rate 0.001 from step 41"};
  return r;
}

// The refusal of `r`, or "" when it is taken.
std::string refusal(const worker_report& r) { return check_worker_report(r).value_or(""); }

}  // namespace

TEST_CASE("worker report: values inside the bounds are taken, unknown usage (-1) included") {
  CHECK(refusal(good()) == "");
  worker_report unknown;  // the first beat: no CPU rate yet, no lines
  CHECK(refusal(unknown) == "");
  worker_report edge = good();
  edge.cpu_percent = worker_report_limits::max_cpu_percent;
  edge.rss_bytes = worker_report_limits::max_rss_bytes;
  edge.lines_total = worker_report_limits::max_lines;
  edge.lines.assign(worker_report_limits::max_lines, std::string(worker_report_limits::max_line_bytes, 'x'));
  CHECK(refusal(edge) == "");
  edge.lines.back() = std::string(worker_report_limits::max_line_bytes - 3, 'x') + "\xE2\x82\xAC";  // UTF-8 at the end
  CHECK(refusal(edge) == "");
}

TEST_CASE("worker report: CPU and memory out of range are refused, naming the field and the range") {
  worker_report r = good();
  r.cpu_percent = std::nan("");
  CHECK(refusal(r) == "cpu_percent nan (expected -1 for unknown, or 0..6553600)");
  r.cpu_percent = std::numeric_limits<double>::infinity();
  CHECK(refusal(r).find("cpu_percent inf") == 0);
  r.cpu_percent = -0.5;
  CHECK(refusal(r).find("cpu_percent -0.5") == 0);
  r.cpu_percent = worker_report_limits::max_cpu_percent * 2;
  CHECK(refusal(r).find("cpu_percent 13107200") == 0);
  r = good();
  r.rss_bytes = -2;
  CHECK(refusal(r) == "rss_bytes -2 (expected -1 for unknown, or 0..1125899906842624)");
  r.rss_bytes = worker_report_limits::max_rss_bytes + 1;
  CHECK(refusal(r).find("rss_bytes 1125899906842625") == 0);
}

TEST_CASE("worker report: too many lines, lines beyond the total, a long line or one a page cannot show are refused") {
  worker_report r = good();
  r.lines.assign(worker_report_limits::max_lines + 1, "x");
  r.lines_total = 100;
  CHECK(refusal(r) == "6 lines of 100 (expected at most 5, and no more than the total)");
  r = good();
  r.lines_total = 1;  // two lines, one taken: a lie
  CHECK(refusal(r) == "2 lines of 1 (expected at most 5, and no more than the total)");
  r = good();
  r.lines[1] = std::string(worker_report_limits::max_line_bytes + 1, 'x');
  CHECK(refusal(r) == "line 1 of 257 bytes (expected at most 256)");
  r = good();
  r.lines[0] = "<script>\nalert(1)";
  CHECK(refusal(r) == "line 0 '<script>\\nalert(1)' (expected valid UTF-8 without control characters)");
  r.lines[0] = "caf\xE9";  // Latin-1, not UTF-8
  CHECK(refusal(r).find("line 0 ") == 0);
  r.lines[0] = "\x1b[2J";  // a terminal escape
  CHECK(refusal(r) == "line 0 '\\x1b[2J' (expected valid UTF-8 without control characters)");
  r.lines[0] = std::string("a\0b", 3);
  CHECK(refusal(r) == "line 0 'a\\0b' (expected valid UTF-8 without control characters)");
}

TEST_CASE("log tail keeps the last 5 lines, each made printable and cut, and counts every line") {
  log_tail tail;
  CHECK(tail.total() == 0);
  CHECK(tail.lines().empty());
  for (int i = 1; i <= 7; ++i) tail.add("line " + std::to_string(i));
  CHECK(tail.total() == 7);
  CHECK(tail.lines() == std::vector<std::string>{"line 3", "line 4", "line 5", "line 6", "line 7"});
  tail.add("two\nlines\xFF");
  tail.add(std::string(10'000, 'y'));
  const auto lines = tail.lines();
  REQUIRE(lines.size() == 5);
  CHECK(lines[3] == "two\xEF\xBF\xBDlines\xEF\xBF\xBD");
  CHECK(lines[4] == std::string(worker_report_limits::max_line_bytes - 3, 'y') + "...");
  // What the tail holds always passes the chief's check.
  worker_report r;
  tail.fill(r, 0);
  CHECK(refusal(r) == "");
}

TEST_CASE("log tail fills a report's lines only when lines came since the report before") {
  log_tail tail;
  worker_report r;
  tail.fill(r, 0);
  CHECK(r.lines_total == 0);
  CHECK(r.lines.empty());
  tail.add("paused after step 3");
  tail.fill(r, 0);
  CHECK(r.lines_total == 1);
  CHECK(r.lines == std::vector<std::string>{"paused after step 3"});
  tail.fill(r, 1);  // nothing new: the beat travels without lines
  CHECK(r.lines_total == 1);
  CHECK(r.lines.empty());
  tail.add("resumed after step 3");
  tail.fill(r, 1);
  CHECK(r.lines == std::vector<std::string>{"paused after step 3", "resumed after step 3"});
}

}  // namespace TROUPE_TEST_FILE
