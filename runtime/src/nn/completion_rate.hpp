#pragma once

// Model::fit's throughput under ParameterServerStrategy, over the last few closures taken.
//
// fit keeps 2 closures per worker in flight and takes their results in the order it scheduled
// them. The workers finish in any order, so a result that arrived while fit still waited for an
// older one is taken at once after it: measured from the previous take alone, its interval is a
// few microseconds and the rate a spike hundreds of times the real one (and the one before it, a
// dip). Over a window of at least `min_results` results and `min_span`, the bursts average out:
// the rate is the samples taken since the window's start over the time since then.
//
// A plain class: time is passed in, so tests decide it.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>

namespace troupe::nn::detail {

class CompletionRate {
 public:
  using Clock = std::chrono::steady_clock;

  /// The window holds at least `min_results` results and `min_span` (when it has that many).
  CompletionRate(std::size_t min_results, Clock::duration min_span)
      : min_results_(min_results < 1 ? 1 : min_results), min_span_(min_span) {}

  /// Starts the window afresh at `now` (the epoch's start, or training going on after a pause):
  /// the time before it counts for nothing.
  void restart(Clock::time_point now) {
    marks_.clear();
    marks_.push_back(Mark{now, 0, 0});
  }

  /// A result of `steps` steps and `samples` samples taken at `now`.
  void add(Clock::time_point now, std::int64_t steps, double samples) {
    if (marks_.empty()) restart(now);
    marks_.push_back(Mark{now, steps, samples});
    // marks_[0] is the window's start; the results after it are counted. The oldest goes while
    // the window keeps enough of both.
    while (marks_.size() > min_results_ + 1 && now - marks_[1].at >= min_span_) marks_.pop_front();
  }

  /// Samples per second over the window (0 before a result, or over no time at all).
  double samples_per_second() const {
    const double s = seconds();
    return s > 0 ? counted(&Mark::samples) / s : 0.0;
  }

  /// Milliseconds per step over the window (0 before a result).
  double step_ms() const {
    const double steps = counted_steps();
    return steps > 0 ? seconds() * 1e3 / steps : 0.0;
  }

 private:
  struct Mark {
    Clock::time_point at;
    std::int64_t steps = 0;
    double samples = 0;
  };

  double seconds() const {
    if (marks_.size() < 2) return 0.0;
    return std::chrono::duration<double>(marks_.back().at - marks_.front().at).count();
  }
  double counted(double Mark::*field) const {
    double sum = 0;
    for (std::size_t i = 1; i < marks_.size(); ++i) sum += marks_[i].*field;
    return sum;
  }
  double counted_steps() const {
    double sum = 0;
    for (std::size_t i = 1; i < marks_.size(); ++i) sum += static_cast<double>(marks_[i].steps);
    return sum;
  }

  std::size_t min_results_;
  Clock::duration min_span_;
  std::deque<Mark> marks_;
};

}  // namespace troupe::nn::detail
