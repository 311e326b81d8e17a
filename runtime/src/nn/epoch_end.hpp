#pragma once

// An epoch's end, the part both fit loops share (fit_loop.hpp on a distributed dataset,
// ps_fit.hpp under ParameterServerStrategy): the epoch's means into the History and the epoch's
// logs, validation, then on_epoch_end and a stop that a callback asked for there. What differs
// stays in each loop: the backup (fit_loop) and the optimizer's iteration count (ps_fit_loop).

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "troupe/nn/callback.hpp"
#include "troupe/nn/model.hpp"

namespace troupe::nn::detail {

/// Seconds from `a` to `b`.
inline double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

/// An epoch's running sums: its steps' losses and metric hits, its steps and rows.
struct EpochSums {
  double loss = 0;
  double hits = 0;
  std::int64_t steps = 0;
  std::int64_t samples = 0;
};

/// The parts of a fit loop that an epoch's end reads and writes.
struct EpochEndContext {
  Model& model;
  const FitOptions& options;
  const std::vector<std::shared_ptr<Callback>>& callbacks;
  TrainingControl& control;
  History& history;
  bool& stopped;       // the loop's "training stopped"; a callback's stop sets it
  std::int64_t step;   // steps done, where a callback's stop is recorded
};

/// Ends an epoch that ran at least one step (sums.steps > 0), `seconds` long: appends its mean
/// loss, time and rate to the History, fills `epoch_logs` (loss, metrics, validation's val_ ones,
/// then learning_rate and samples_per_second, which the History's per-name lists do not get),
/// and, unless a non-finite loss stopped training (no validation then either), calls
/// on_epoch_end and applies a stop_training a callback set there.
void close_epoch(const EpochEndContext& loop, int epoch, const EpochSums& sums, double seconds, Logs& epoch_logs);

}  // namespace troupe::nn::detail
