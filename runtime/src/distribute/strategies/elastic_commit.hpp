#pragma once

// An elastic cluster's in-memory commit of the training state (Horovod's State.commit): what
// every worker rolls back to when the membership changes, without a process restart or a
// checkpoint read. A commit copies every tracked variable (the model's weights, the optimizer's
// slots and iteration count), the random engines tracked, and where training stands (the step
// and the input position). Two commits are kept: when a worker is lost the survivors stand at
// most one step apart, so the newest commit all of them hold is one of the last two on each
// (actors::common_commit). Each slot's host buffers are made by its first commit and reused by
// the later ones, so a commit after the first allocates nothing for CPU variables: it is one
// memcpy per variable (bench/elastic_commit_bench.cpp measures it).

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "troupe/tensor.hpp"
#include "troupe/variable.hpp"

namespace troupe::distribute::detail {

/// Where training stands at a commit (the fields of nn::TrainingPosition).
struct CommitPosition {
  std::int64_t step = 0;               ///< steps done in all
  std::int64_t epoch = 0;              ///< the epoch in progress, from 0
  std::int64_t step_in_epoch = 0;      ///< steps of that epoch done
  std::int64_t iterator_position = 0;  ///< elements taken from the current input iterator
  std::int64_t input_passes = 0;       ///< iterators made over the dataset before the current one
  /// The workers the current iterator's input was split over when its pass began
  /// (DistributedIterator::split_workers); 0: none, or a split that does not depend on them.
  std::int64_t input_split = 0;
};

/// The last two commits of this worker's training state.
class CommittedState {
 public:
  /// Tracks variables (Model::variables()); a name tracked already throws std::invalid_argument.
  /// Before the first commit.
  void track(const std::map<std::string, Variable>& variables);
  /// Tracks a random engine (which must outlive this object).
  void track_rng(const std::string& name, std::mt19937_64& engine);
  /// Commits now, at `at`: overwrites the older of the two commits. A step already committed is
  /// committed again in its slot. Throws std::logic_error when a variable's shape or dtype changed
  /// since the first commit.
  void commit(const CommitPosition& at);
  /// The steps committed, oldest first (0, 1 or 2 of them).
  std::vector<std::int64_t> steps() const;
  /// Whether a commit of `step` is held.
  bool holds(std::int64_t step) const;
  /// Restores the commit of `step` into every tracked variable and engine (in cross-replica
  /// context: every component is written) and returns its position. A step not held throws
  /// std::out_of_range naming the steps held.
  CommitPosition restore(std::int64_t step);
  /// Bytes one commit holds (its variables').
  std::size_t bytes() const noexcept;
  /// Commits made so far.
  std::int64_t commits() const noexcept { return commits_; }

 private:
  struct Slot {
    std::optional<CommitPosition> at;
    std::vector<Tensor> values;  // by tracked variable, host buffers reused between commits
    std::vector<std::mt19937_64> engines;
  };
  std::vector<std::pair<std::string, Variable>> variables_;
  std::vector<std::pair<std::string, std::mt19937_64*>> engines_;
  std::array<Slot, 2> slots_;
  std::int64_t commits_ = 0;
};

}  // namespace troupe::distribute::detail
