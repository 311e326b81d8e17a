#pragma once
// Where one step's time goes, per local replica: the replica function's span and each collective
// inside it (op, bytes, sequence number), and the calling thread's wait for input. A Monitor
// attaches one to a strategy's backend; without one every hook is a null-pointer test.
//
// Cost: fixed arrays sized once per strategy, no allocation and no lock per step. Each replica
// writes only its own record, on its own thread, during the step; the thread that owns the
// strategy reads them after execute() returns (the coordinator's gathering of the replicas'
// answers orders the writes before the reads). The input wait is written by the calling thread.

#include <array>
#include <chrono>
#include <cstdint>
#include <vector>

namespace troupe::distribute::detail {

/// The kinds of collective a step records.
enum class CollectiveKind : std::uint8_t { all_reduce, all_gather };

inline const char* collective_kind_name(CollectiveKind k) noexcept {
  return k == CollectiveKind::all_reduce ? "all_reduce" : "all_gather";
}

/// Nanoseconds on the steady clock: every timestamp of a profile is one of these.
inline std::int64_t profile_now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// One collective of one replica in one step.
struct CollectiveRecord {
  std::int64_t start_ns = 0;
  std::int64_t duration_ns = 0;
  std::uint64_t bytes = 0;
  std::uint64_t sequence = 0;  ///< the replica's collectives since the profile was attached
  CollectiveKind kind = CollectiveKind::all_reduce;
};

/// One replica's last step. Aligned so that replicas writing their own records share no line.
struct alignas(64) ReplicaStepRecord {
  static constexpr int max_recorded = 32;  ///< collectives kept per step with their timestamps

  std::int64_t start_ns = 0;        ///< the replica function began
  std::int64_t end_ns = 0;          ///< and returned
  std::int64_t collective_ns = 0;   ///< time inside collectives, all of them
  std::uint64_t collective_bytes = 0;
  int collectives = 0;              ///< collectives this step (only the first max_recorded are in records)
  std::uint64_t sequence = 0;       ///< running count over steps
  std::array<CollectiveRecord, max_recorded> records{};
};

class StepProfile {
 public:
  explicit StepProfile(int local_replicas) : replicas_(static_cast<std::size_t>(local_replicas)) {}

  int replicas() const noexcept { return static_cast<int>(replicas_.size()); }

  /// Replica r starts its function (clears its record for the new step).
  void begin_replica(int r) noexcept {
    ReplicaStepRecord& rec = replicas_[static_cast<std::size_t>(r)];
    rec.start_ns = profile_now_ns();
    rec.end_ns = rec.start_ns;
    rec.collective_ns = 0;
    rec.collective_bytes = 0;
    rec.collectives = 0;
  }
  /// Replica r's function returned (or threw).
  void end_replica(int r) noexcept { replicas_[static_cast<std::size_t>(r)].end_ns = profile_now_ns(); }

  /// Replica r ran one collective over `bytes` bytes from start_ns to end_ns.
  void collective(int r, CollectiveKind kind, std::int64_t start_ns, std::int64_t end_ns, std::uint64_t bytes) noexcept {
    ReplicaStepRecord& rec = replicas_[static_cast<std::size_t>(r)];
    const std::int64_t d = end_ns - start_ns;
    if (rec.collectives < ReplicaStepRecord::max_recorded) {
      rec.records[static_cast<std::size_t>(rec.collectives)] = {start_ns, d, bytes, rec.sequence, kind};
    }
    ++rec.collectives;
    ++rec.sequence;
    rec.collective_ns += d;
    rec.collective_bytes += bytes;
  }

  /// The calling thread waited `ns` for the next batch.
  void input_wait(std::int64_t start_ns, std::int64_t ns) noexcept {
    if (input_wait_ns_ == 0) input_start_ns_ = start_ns;
    input_wait_ns_ += ns;
  }
  /// The input wait since the last call, and when it began; resets it.
  std::int64_t take_input_wait(std::int64_t* start_ns) noexcept {
    const std::int64_t w = input_wait_ns_;
    if (start_ns) *start_ns = input_start_ns_;
    input_wait_ns_ = 0;
    return w;
  }

  const ReplicaStepRecord& replica(int r) const noexcept { return replicas_[static_cast<std::size_t>(r)]; }

 private:
  std::vector<ReplicaStepRecord> replicas_;
  std::int64_t input_wait_ns_ = 0;
  std::int64_t input_start_ns_ = 0;
};

}  // namespace troupe::distribute::detail
