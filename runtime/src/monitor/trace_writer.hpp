#pragma once
// The Chrome trace of a range of steps (`{"traceEvents": [...]}`, as Perfetto and chrome://tracing
// open it): process = worker, one track for the worker's steps and input waits, one per replica
// with its span and its collectives, every event a complete event ("ph":"X") with a duration.
// Training thread only; the monitor shows its status.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "distribute/strategies/step_profile.hpp"
#include "troupe/device.hpp"

namespace troupe::detail {

class TraceWriter {
 public:
  static constexpr std::size_t max_events = 4 << 20;

  /// The trace of `worker`, whose local replicas run on `devices` with global ids from
  /// `first_replica` on; times are written relative to `t0_ns` (profile_now_ns()).
  TraceWriter(int worker, int first_replica, std::vector<Device> devices, std::int64_t t0_ns);

  /// The file a worker writes for `base` ("<base>.worker-<i>" on a worker other than the chief).
  std::string path_for(const std::string& base) const;
  /// Records steps first..last (both included) from now on, into path_for(base).
  void start(std::int64_t first, std::int64_t last, const std::string& base);
  /// Whether step is in the range being recorded.
  bool wants(std::int64_t step) const noexcept { return first_ >= 0 && step >= first_ && step <= last_; }
  /// Whether a range is being recorded and has events.
  bool pending() const noexcept { return first_ >= 0 && !events_.empty(); }
  std::int64_t first() const noexcept { return first_; }
  std::int64_t last() const noexcept { return last_; }
  /// The step that ended at boundary_ns (its previous boundary at previous_ns), with what the
  /// profile recorded of its replicas and the input wait.
  void record(std::int64_t step, std::int64_t previous_ns, std::int64_t boundary_ns, std::int64_t input_start_ns,
              std::int64_t input_ns, const distribute::detail::StepProfile& profile);

  /// What write() did.
  struct Written {
    bool ok = false;
    std::string path;     ///< the trace file (ok), or the file that could not be written
    std::string summary;  ///< "trace of steps A..B written to PATH (N events)"
  };
  /// Writes the file (through PATH.tmp, renamed) and ends the range.
  Written write();

 private:
  // One complete event of the trace.
  struct Event {
    const char* name;
    int tid;  // 0: the worker's training thread; 1 + r: local replica r
    std::int64_t ts_ns;
    std::int64_t dur_ns;
    std::int64_t step;
    std::int64_t bytes;     // collectives: bytes, else -1
    std::int64_t sequence;  // collectives: sequence number, else -1
    int replica;            // global replica id, or -1
  };

  int worker_;
  int first_replica_;
  std::vector<Device> devices_;
  std::int64_t t0_ns_;
  std::string path_;
  std::int64_t first_ = -1;
  std::int64_t last_ = -1;
  std::int64_t recorded_last_ = -1;
  std::vector<Event> events_;
};

}  // namespace troupe::detail
