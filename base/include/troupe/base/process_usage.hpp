#pragma once
// This process's CPU and resident memory, as /proc reports them (Linux): the dashboard's row for
// the process serving it, and the report every worker's heartbeat carries to the chief.

#include <chrono>
#include <cstdint>

namespace troupe::base {

/// One reading of process_usage.
struct usage_sample {
  double cpu_percent = -1;      ///< CPU time per wall time since the previous sample (100: one core); -1 unknown
  std::int64_t rss_bytes = -1;  ///< resident memory; -1 unknown
};

/// Samples /proc/self; keeps the previous CPU time to give a rate. Not thread-safe: one owner.
class process_usage {
 public:
  /// Reads /proc/self/stat and /proc/self/statm. The first sample's CPU is unknown (-1); a sample
  /// within 200 ms of the previous one repeats its CPU (too few clock ticks to tell).
  usage_sample sample();

 private:
  std::int64_t last_ticks_ = -1;
  std::chrono::steady_clock::time_point last_at_{};
  double last_percent_ = -1;
};

}  // namespace troupe::base
