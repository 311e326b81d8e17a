#pragma once
// This process's CPU and memory, as /proc reports them (Linux), for the dashboard's cluster table.

#include <chrono>
#include <cstdint>

namespace troupe::detail {

class ProcessUsage {
 public:
  struct Sample {
    double cpu_percent = -1;    ///< CPU time per wall time since the previous sample (100: one core); -1 unknown
    std::int64_t rss_bytes = -1;  ///< resident memory; -1 unknown
  };
  /// Reads /proc/self/stat and /proc/self/statm. Not thread-safe (one caller: the HTTP thread).
  Sample sample();

 private:
  std::int64_t last_ticks_ = -1;
  std::chrono::steady_clock::time_point last_at_{};
  double last_percent_ = -1;
};

}  // namespace troupe::detail
