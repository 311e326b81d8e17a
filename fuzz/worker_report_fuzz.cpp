// The report beside every heartbeat (worker_report.hpp), as the chief takes it from the network,
// and the lines a worker makes printable before they travel. Nothing may throw; a refusal's
// message is bounded; whatever check_worker_report accepts, and whatever a worker's log_tail
// holds, keeps every bound: at most 5 lines of at most 256 bytes, each valid UTF-8 without a
// control character. cluster_health records exactly what the check accepts.

#include <fuzzer/FuzzedDataProvider.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "troupe/actors/cluster_health.hpp"
#include "troupe/actors/worker_report.hpp"
#include "troupe/base/quote.hpp"

namespace {

using namespace troupe::actors;
using troupe::fuzz::check_message;

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "broken: %s\n", what);
    std::abort();
  }
}

bool within_bounds(const std::string& line) {
  return line.size() <= worker_report_limits::max_line_bytes && troupe::base::is_printable_line(line);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  // A report as the network may deliver it.
  worker_report r;
  r.cpu_percent = in.ConsumeBool() ? in.ConsumeFloatingPoint<double>() : in.ConsumeFloatingPointInRange(-1.0, 1000.0);
  r.rss_bytes = in.ConsumeIntegral<std::int64_t>();
  r.lines_total = in.ConsumeIntegralInRange<std::uint64_t>(0, 16);
  const int lines = in.ConsumeIntegralInRange<int>(0, 8);
  for (int i = 0; i < lines; ++i) r.lines.push_back(in.ConsumeRandomLengthString(300));
  const auto refusal = check_worker_report(r);
  if (refusal) {
    check_message(*refusal);
  } else {
    require(r.lines.size() <= worker_report_limits::max_lines, "accepted too many lines");
    for (const auto& line : r.lines) require(within_bounds(line), "accepted a line out of bounds");
  }
  // The chief's record takes exactly what the check takes.
  cluster_health health;
  health.start({"/job:worker/task:0", "/job:worker/task:1"}, std::chrono::milliseconds(100), 2, "",
               cluster_health::clock::now());
  require(health.report(1, r).has_value() == refusal.has_value(), "the record and the check disagree");
  const auto recorded = health.snapshot(cluster_health::clock::now()).workers.at(1);
  require(recorded.reported != refusal.has_value(), "a refused report was recorded, or a taken one was not");

  // A worker's side: every line it says is made printable, and what it sends passes the check.
  log_tail tail;
  for (const auto& line : r.lines) tail.add(line);
  worker_report mine;
  tail.fill(mine, 0);
  require(!check_worker_report(mine).has_value(), "a worker's own report is refused");
  const std::string text = in.ConsumeRandomLengthString(2000);
  const std::size_t max_bytes = in.ConsumeIntegralInRange<std::size_t>(0, 600);
  const std::string line = troupe::base::printable_line(text, max_bytes);
  require(line.size() <= std::max<std::size_t>(max_bytes, 3), "printable_line longer than its bound");
  require(troupe::base::is_printable_line(line), "printable_line made a line that is not printable");
  if (troupe::base::is_printable_line(text) && text.size() <= max_bytes) {
    require(line == text, "printable_line changed a printable line within its bound");
  }
  return 0;
}
