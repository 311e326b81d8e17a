#pragma once
// The monitors' own step-boundary exchange, for a custom training loop (Monitor::on_step_end)
// under MultiWorkerMirroredStrategy: one small cross-worker sum of a table with a row per replica,
// zero except the worker's own rows. The chief's first row carries the dashboard's command (and
// whether more wait); every row carries its worker's timings and replica losses. A sum of rows that
// are zero except one's own is exact, so every worker reads the same table and applies the same
// command after the same step. (With Model::fit the monitor makes no collective: fit's own
// reduction carries both.)

#include <cstdint>
#include <vector>

#include "distribute/strategies/step_profile.hpp"
#include "monitor/commands.hpp"
#include "troupe/actors/metrics_stream.hpp"

namespace troupe::distribute::detail {
class StrategyBackend;
}

namespace troupe::detail {

class StepExchange {
 public:
  /// For the worker whose backend is `backend`, its replicas' step records in `profile`.
  StepExchange(distribute::detail::StrategyBackend& backend, const distribute::detail::StepProfile& profile);

  /// What this worker puts in its rows besides the profile's records.
  struct Mine {
    std::int64_t step = 0;
    /// This worker's replicas' shares of the global mean loss (Model::train_step's), or null.
    const std::vector<double>* replica_shares = nullptr;
    const actors::worker_metrics* metrics = nullptr;      ///< input, other, samples/s, paused
  };
  /// Joins the exchange (a collective: every worker calls it at the same boundary). `command` is
  /// the chief's (ignored elsewhere). Fills event.replica_loss and event.workers from every row;
  /// returns the chief's command as every worker read it.
  Taken exchange(const Taken& command, const Mine& mine, actors::step_event& event);

 private:
  distribute::detail::StrategyBackend& backend_;
  const distribute::detail::StepProfile& profile_;
  int worker_;
  int workers_;
  int local_replicas_;
  int replicas_in_sync_;
  std::vector<double> rows_;  // the table, reused
};

}  // namespace troupe::detail
