#include "nn/epoch_end.hpp"

#include <algorithm>
#include <string>

namespace troupe::nn::detail {

void close_epoch(const EpochEndContext& loop, int epoch, const EpochSums& sums, double seconds, Logs& epoch_logs) {
  History& history = loop.history;
  const double epoch_loss = sums.loss / static_cast<double>(sums.steps);
  const double rate = seconds > 0 ? static_cast<double>(sums.samples) / seconds : 0.0;
  // An epoch run again (training rolled back to an earlier checkpoint): its entry and those after
  // it go, so that the History keeps one entry per epoch, the latest.
  const auto again = std::find_if(history.epoch.begin(), history.epoch.end(), [&](int e) { return e >= epoch; });
  if (again != history.epoch.end()) {
    const auto keep = static_cast<std::size_t>(again - history.epoch.begin());
    const auto cut = [keep](std::vector<double>& v) {
      if (v.size() > keep) v.resize(keep);
    };
    history.epoch.resize(keep);
    cut(history.loss);
    cut(history.seconds);
    cut(history.samples_per_second);
    for (auto& [name, values] : history.history) cut(values);
  }
  history.epoch.push_back(epoch);
  history.loss.push_back(epoch_loss);
  history.seconds.push_back(seconds);
  history.samples_per_second.push_back(rate);
  history.steps += sums.steps;
  history.samples += sums.samples;
  epoch_logs["loss"] = epoch_loss;
  for (const std::string& m : loop.model.metrics()) {
    epoch_logs[m] = sums.samples > 0 ? sums.hits / static_cast<double>(sums.samples) : 0.0;
  }
  const bool poisoned = history.non_finite_step != 0 && loop.stopped;
  if (loop.options.validation_data && !poisoned) {
    // Under ParameterServerStrategy, on the chief, reading the variables from the ps tasks once
    // the epoch's closures are done.
    const EvaluateResult v = loop.model.evaluate(*loop.options.validation_data);
    epoch_logs["val_loss"] = v.loss;
    for (const std::string& m : loop.model.metrics()) epoch_logs["val_" + m] = v.accuracy;
  }
  for (const auto& [name, value] : epoch_logs) history.history[name].push_back(value);
  epoch_logs["learning_rate"] = loop.model.optimizer()->learning_rate();
  epoch_logs["samples_per_second"] = rate;
  if (poisoned) return;
  for (const auto& c : loop.callbacks) c->on_epoch_end(epoch, epoch_logs);
  // Only a callback's own stop_training acts here: requests wait for the next step boundary.
  if (auto reason = loop.control.take_immediate_stop(); reason && !loop.stopped) {
    loop.stopped = true;
    history.stop_reason = *reason;
    history.stopped_at_step = loop.step;
  }
}

}  // namespace troupe::nn::detail
