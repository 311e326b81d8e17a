#pragma once

// How every worker of a MultiWorkerMirroredStrategy applies a request (stop, pause, resume,
// checkpoint, learning rate) at the same step boundary, although it reached one worker only.
//
// 1. At the start of a step each worker takes the requests made since the last step and encodes
//    them as request_fields numbers: its row of the agreement table.
// 2. The row rides in the step's own reduction (fit's table of per-step numbers, StepTable below):
//    each worker writes its row at its rank's place, zeros elsewhere, so the SUM is every row.
// 3. Every worker reads the same reduced table and decides alike (decide): a stop or checkpoint
//    anywhere counts everywhere; for the pause state and the learning rate the lowest rank that
//    asked wins; only the chief's row can ask to admit workers waiting to join (elastic
//    membership); a worker's row can ask that it leave the elastic cluster (every worker reads
//    who asked, and the chief decides at that boundary).
// 4. While training is paused no step runs: agree_now carries the rows in a small collective of
//    its own (a concat over the workers), every worker calling it at the same boundary.
//
// One worker needs no table: its requests are the decision (agree_alone).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe::distribute::detail {

class WorkerGroup;

/// One worker's requests since the last step boundary.
struct StepRequests {
  bool stop = false;
  std::string stop_reason;
  std::uint32_t stop_code = 0;  ///< the reason's code (< 2^31), which is what travels
  bool checkpoint = false;
  std::optional<bool> pause;  ///< true: pause, false: resume
  std::optional<double> learning_rate;
  /// The chief's, under elastic membership: workers waiting to join.
  std::uint32_t joiners = 0;
  /// Under elastic membership: this worker asks to leave the cluster (SIGUSR2; troupe-launch's
  /// host discovery sends it to a worker it removes).
  bool leave = false;
};

/// What every worker agreed to do at a step boundary.
struct StepAgreement {
  bool stop = false;
  std::string stop_reason;      ///< this worker's own reason, or "stop requested by worker W"
  std::uint32_t stop_code = 0;  ///< the code of the first stopping worker's reason
  bool checkpoint = false;
  std::optional<bool> pause;
  std::optional<double> learning_rate;
  bool admit = false;  ///< the chief admits the workers waiting to join, at this boundary
  std::vector<int> leaving;  ///< the ranks that ask to leave the elastic cluster, in rank order
};

/// Numbers in a worker's row of requests.
constexpr std::size_t request_fields = 7;
/// Numbers of a worker's step-time parts of the step before (input, compute, all-reduce, whole
/// step, in ms) that ride after its requests in the step's table.
constexpr std::size_t part_fields = 4;
/// A worker's row in the step's table: its requests, then its parts.
constexpr std::size_t worker_fields = request_fields + part_fields;

/// Writes `r` as the request_fields numbers of a row.
void encode_requests(const StepRequests& r, double* row);

/// The decision every worker reads from the same table of `workers` rows, `stride` numbers apart,
/// in rank order; `mine` gives this worker's own stop reason.
StepAgreement decide(const double* table, int workers, const StepRequests& mine, std::size_t stride);

/// One worker's requests as the decision.
StepAgreement agree_alone(StepRequests mine);

/// Agrees on `mine` with every other worker of `group` in a collective of its own (one worker:
/// agree_alone). Every worker calls it at the same boundary.
StepAgreement agree_now(StepRequests mine, WorkerGroup& group);

/// The layout of the float64 vector that each replica returns from a fit step and the strategy
/// sums: {its share of the loss, its correct predictions}, then (with several workers) one row of
/// worker_fields per worker, then {mean loss, 1} per replica of the sync group.
struct StepTable {
  int workers = 1;
  int replicas_per_worker = 1;

  /// Numbers in the table.
  std::size_t size() const {
    return workers > 1 ? replica_at(workers * replicas_per_worker) : 2;
  }
  /// Where worker `w`'s row starts.
  std::size_t worker_row(int w) const { return 2 + worker_fields * static_cast<std::size_t>(w); }
  /// Where the pair of replica `id` (in the sync group) starts.
  std::size_t replica_at(int id) const { return worker_row(workers) + 2 * static_cast<std::size_t>(id); }
};

}  // namespace troupe::distribute::detail
