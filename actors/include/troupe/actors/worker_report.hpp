#pragma once

// What every worker's heartbeat carries to the chief beside the beat itself, for the chief's
// dashboard: the worker process's CPU and resident memory, and its last few log lines. A plain
// value without CAF. The chief takes a report from the network only through check_worker_report:
// every field bounded, every line valid UTF-8 without control characters. Lines travel only when
// the worker has new ones, so a quiet worker's beat stays a few dozen bytes.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::actors {

/// The bounds of a report. One beyond them is refused whole.
struct worker_report_limits {
  static constexpr std::size_t max_lines = 5;         ///< lines in one report
  static constexpr std::size_t max_line_bytes = 256;  ///< bytes of one line (UTF-8), "..." included
  static constexpr double max_cpu_percent = 100.0 * 65536;  ///< 65536 cores busy
  static constexpr std::int64_t max_rss_bytes = std::int64_t{1} << 50;  ///< 1 PiB
};

/// A worker's report, as its heartbeat carries it.
struct worker_report {
  double cpu_percent = -1;      ///< CPU time per wall time (100: one core busy); -1 unknown
  std::int64_t rss_bytes = -1;  ///< resident memory; -1 unknown
  std::uint64_t lines_total = 0;  ///< lines the worker's log_tail took since it started
  /// Its last lines, oldest first, at most max_lines; empty when it has none new since the
  /// report before (the chief keeps the last it received).
  std::vector<std::string> lines;
};

/// Why a report from the network is refused (which field, its value, what was expected), or
/// nothing when every field keeps worker_report_limits: cpu_percent -1 or finite in
/// 0..max_cpu_percent, rss_bytes -1 or 0..max_rss_bytes, at most max_lines lines and no more than
/// lines_total, each line at most max_line_bytes of valid UTF-8 without control characters.
std::optional<std::string> check_worker_report(const worker_report& report);

/// A worker's last lines, for its heartbeat to carry. Every line is made printable on the way in
/// (base::printable_line: valid UTF-8, control characters replaced, cut at max_line_bytes), and
/// only the last max_lines are kept. Thread-safe: the training thread adds, the heartbeat reads.
class log_tail {
 public:
  /// Keeps `line` as one printable line.
  void add(std::string_view line);
  /// Lines taken so far (those pushed out included).
  std::uint64_t total() const;
  /// The last lines, oldest first (at most worker_report_limits::max_lines).
  std::vector<std::string> lines() const;
  /// Sets `report`'s lines_total, and its lines to the last ones when some came after the first
  /// `sent` (the total the report before carried), else to none: one look, so the two agree.
  void fill(worker_report& report, std::uint64_t sent) const;

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> lines_;  // oldest first
  std::uint64_t total_ = 0;
};

}  // namespace troupe::actors
