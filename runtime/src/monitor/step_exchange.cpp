#include "monitor/step_exchange.hpp"

#include <algorithm>
#include <cmath>

#include "troupe/distribute/strategy.hpp"
#include "distribute/collectives/worker_group.hpp"
#include "troupe/tensor.hpp"

namespace troupe::detail {
namespace {

// The columns of one replica's row. The chief's first replica carries the command.
enum Column : int {
  c_command,
  c_argument,
  c_worker,
  c_step,
  c_replica_loss,
  c_compute_ms,
  c_collective_ms,
  c_collective_bytes,
  c_collectives,
  c_input_ms,
  c_other_ms,
  c_samples_per_s,
  c_paused,
  c_more,  // the chief has more commands: every worker exchanges again at this boundary
  columns
};

}  // namespace

StepExchange::StepExchange(distribute::detail::StrategyBackend& backend, const distribute::detail::StepProfile& profile)
    : backend_(backend),
      profile_(profile),
      worker_(backend.workers().rank()),
      workers_(backend.workers().size()),
      local_replicas_(static_cast<int>(backend.devices().size())),
      replicas_in_sync_(backend.num_replicas_in_sync()),
      rows_(static_cast<std::size_t>(replicas_in_sync_) * columns, 0.0) {}

Taken StepExchange::exchange(const Taken& command, const Mine& mine, actors::step_event& event) {
  const int first = backend_.first_replica_id();
  std::fill(rows_.begin(), rows_.end(), 0.0);
  for (int r = 0; r < local_replicas_; ++r) {
    double* row = &rows_[static_cast<std::size_t>((first + r) * columns)];
    const auto& rec = profile_.replica(r);
    if (worker_ == 0 && r == 0) {
      row[c_command] = command.code;
      row[c_argument] = command.argument;
      row[c_more] = command.more ? 1.0 : 0.0;
    }
    row[c_worker] = worker_;
    row[c_step] = static_cast<double>(mine.step);
    row[c_replica_loss] =
        mine.replica_shares ? (*mine.replica_shares)[static_cast<std::size_t>(r)] * replicas_in_sync_ : NAN;
    row[c_compute_ms] = static_cast<double>(rec.end_ns - rec.start_ns - rec.collective_ns) / 1e6;
    row[c_collective_ms] = static_cast<double>(rec.collective_ns) / 1e6;
    row[c_collective_bytes] = static_cast<double>(rec.collective_bytes);
    row[c_collectives] = rec.collectives;
    row[c_input_ms] = mine.metrics->input_ms;
    row[c_other_ms] = mine.metrics->other_ms;
    row[c_samples_per_s] = mine.metrics->samples_per_s;
    row[c_paused] = mine.metrics->paused ? 1.0 : 0.0;
  }
  const Tensor table = backend_.workers().sum(
      Tensor::from_vector(rows_, {static_cast<std::int64_t>(replicas_in_sync_), static_cast<std::int64_t>(columns)}));
  const std::vector<double> all = table.to_vector<double>();
  const int per_worker = local_replicas_;
  event.replica_loss.assign(static_cast<std::size_t>(replicas_in_sync_), NAN);
  event.workers.assign(static_cast<std::size_t>(workers_), actors::worker_metrics{});
  for (int g = 0; g < replicas_in_sync_; ++g) {
    const double* row = &all[static_cast<std::size_t>(g * columns)];
    event.replica_loss[static_cast<std::size_t>(g)] = row[c_replica_loss];
    actors::worker_metrics& w = event.workers[static_cast<std::size_t>(g / per_worker)];
    w.worker = g / per_worker;
    w.step = static_cast<std::int64_t>(row[c_step]);
    w.compute_ms = std::max(w.compute_ms, row[c_compute_ms]);
    w.all_reduce_ms = std::max(w.all_reduce_ms, row[c_collective_ms]);
    w.all_reduce_bytes = static_cast<std::uint64_t>(row[c_collective_bytes]);
    w.collectives = static_cast<int>(row[c_collectives]);
    w.input_ms = row[c_input_ms];
    w.other_ms = row[c_other_ms];
    w.samples_per_s = row[c_samples_per_s];
    w.paused = row[c_paused] != 0.0;
  }
  return {static_cast<int>(all[c_command]), all[c_argument], all[c_more] != 0.0};
}

}  // namespace troupe::detail
