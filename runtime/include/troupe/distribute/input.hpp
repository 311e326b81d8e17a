#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/data/dataset.hpp"
#include "troupe/distribute/context.hpp"
#include "troupe/distribute/per_replica.hpp"

namespace troupe::distribute {

class Strategy;

/// How input pipelines map onto replicas (tf.distribute.InputReplicationMode).
enum class InputReplicationMode {
  per_worker,   ///< one pipeline per worker; its elements go to the local replicas in turn
  per_replica,  ///< one pipeline per replica (MirroredStrategy)
};

/// How experimental_distribute_dataset splits a dataset between workers
/// (tf.data.experimental.AutoShardPolicy).
enum class AutoShardPolicy {
  automatic,  ///< file when the dataset reads at least one file per worker, else data
  file,       ///< each worker reads only its own files of a file-based dataset (data::files_dataset)
  data,       ///< every worker reads every global batch and keeps its own replicas' rows
  off,        ///< every worker reads everything and splits each global batch over its own replicas
};

/// Options of experimental_distribute_dataset and distribute_datasets_from_function.
struct InputOptions {
  /// Steps of input the input pipeline keeps ready ahead of the consumer; 0 prepares each only
  /// when it is asked for.
  std::int64_t experimental_prefetch_to_device = 2;
  /// Whether a GPU replica's input is copied to its GPU by the input pipeline, ahead of the step
  /// that takes it (while earlier steps compute; through the pipeline thread's own stream and
  /// pinned staging buffers), as TensorFlow's default does. false leaves every replica's input in
  /// host memory. CPU replicas are unaffected.
  bool experimental_fetch_to_device = true;
  InputReplicationMode experimental_replication_mode = InputReplicationMode::per_worker;
  AutoShardPolicy auto_shard_policy = AutoShardPolicy::automatic;
};

namespace detail {
class InputSource;

/// How a global batch of `rows` rows is split over `replicas` replicas for a dataset batched by
/// `global_batch` (the declared batch size; rows < global_batch for a last partial batch): replica
/// r can take global_batch/replicas rows, one more for the first global_batch % replicas, and a
/// partial batch fills the replicas in order. Returns each replica's [begin, end) rows.
std::vector<std::pair<std::int64_t, std::int64_t>> split_rows(std::int64_t rows, std::int64_t global_batch,
                                                               int replicas);
}  // namespace detail

/// One pass over a distributed dataset: every step, one element per local replica.
class DistributedIterator {
 public:
  /// `split_workers`: the workers this pass's input was split over when it began, where the split
  /// depends on them (see split_workers()); 0 where it does not.
  explicit DistributedIterator(std::shared_ptr<detail::InputSource> source, std::int64_t split_workers = 0);
  /// The next per-replica element; at the end troupe::OutOfRange. An error raised while reading
  /// (a bad file, a throwing map) is rethrown here with its cause.
  PerReplica<data::Element> get_next();
  /// The next per-replica element, or nullopt at the end.
  std::optional<PerReplica<data::Element>> get_next_as_optional();
  /// Time spent waiting for input in get_next, for benchmarks.
  std::chrono::nanoseconds time_waiting() const;
  /// The rows (the first dimension of the first component) of the element the last get_next
  /// returned, summed over every replica of every worker: known under experimental_distribute_dataset
  /// (every worker read the global batch) and, over several workers, wherever the input agrees on
  /// the end of the data across them; nullopt elsewhere (one worker's input: its replicas' rows).
  std::optional<std::int64_t> last_global_rows() const;
  /// The workers this pass's input was split over when it began, where the split depends on them:
  /// AutoShardPolicy::file (whose files each read), automatic over a file-based dataset (the
  /// workers its choice of file or data was made over, whichever it chose) and
  /// distribute_datasets_from_function (the input contexts given to dataset_fn); 0 under data and
  /// off sharding, whose global batches are the same for any number of workers. An elastic
  /// cluster's commit records it, and DistributedDataset::make_iterator(split_workers) takes the
  /// pass up after a change, by the policy it began with.
  std::int64_t split_workers() const { return split_workers_; }

  /// Range-for support.
  class range_iterator {
   public:
    range_iterator() = default;
    explicit range_iterator(DistributedIterator* it) : it_(it) { ++*this; }
    const PerReplica<data::Element>& operator*() const { return *current_; }
    const PerReplica<data::Element>* operator->() const { return &*current_; }
    range_iterator& operator++() {
      current_ = it_->get_next_as_optional();
      return *this;
    }
    friend bool operator==(const range_iterator& a, const range_iterator& b) { return !a.current_ && !b.current_; }
    friend bool operator!=(const range_iterator& a, const range_iterator& b) { return !(a == b); }

   private:
    DistributedIterator* it_ = nullptr;
    std::optional<PerReplica<data::Element>> current_;
  };
  range_iterator begin() { return range_iterator(this); }
  range_iterator end() { return range_iterator(); }

 private:
  std::shared_ptr<detail::InputSource> source_;
  std::int64_t split_workers_ = 0;
};

/// A dataset distributed over a strategy's replicas; each iteration is a new pass with its own
/// input pipeline actor(s). for (const PerReplica<data::Element>& x : dist) strategy.run(fn, x);
class DistributedDataset {
 public:
  /// Makes a pass: over the workers there are now when given 0, else taking up a pass begun with
  /// its input split over that many workers (make_iterator(split_workers)).
  using factory = std::function<DistributedIterator(std::int64_t split_workers)>;
  /// `rewind` sets the dataset's shuffles back to their first pass (rewind_passes); none: nothing to.
  explicit DistributedDataset(factory make_source, std::function<void()> rewind = {})
      : make_source_(std::move(make_source)), rewind_(std::move(rewind)) {}

  /// A new pass, split over the workers there are now.
  DistributedIterator make_iterator() const { return make_source_(0); }
  /// A new pass that takes up one begun with its input split over `split_workers` workers
  /// (DistributedIterator::split_workers of that pass; 0 is make_iterator()), as an elastic
  /// cluster does after a change of membership: skipping the steps taken before gives the rest of
  /// that pass's rows, each once, split over the workers there are now.
  /// - data, off: the same global batches as any pass (split_workers is ignored).
  /// - automatic over a file-based dataset: chosen when each pass begins, from the workers it
  ///   begins over (file when there are several, each with a file; else data); a pass taken up
  ///   keeps the choice made over `split_workers`, whatever the workers there are now would choose.
  /// - file, as many workers as then: each reads its own files again (worker w's steps depend
  ///   only on w and the number of workers). Fewer or more: every worker reads the files of all
  ///   of them, joins their steps into one global batch each and keeps its replicas' rows, as
  ///   under data sharding, for the rest of that pass; the next pass splits the files anew.
  /// - distribute_datasets_from_function: the same, with dataset_fn called for each of the input
  ///   contexts of then (its dataset must give each context the same elements every time).
  DistributedIterator make_iterator(std::int64_t split_workers) const {
    if (split_workers < 0) {
      throw std::invalid_argument("DistributedDataset::make_iterator: split_workers " + std::to_string(split_workers) +
                                  " (expected 0, or the workers a pass began over)");
    }
    return make_source_(split_workers);
  }

  /// Sets the shuffles of the dataset it distributes back to their first pass, as in a dataset
  /// just made: each shuffle draws a new order for every pass it makes (reshuffle_each_iteration),
  /// counted per dataset, so a process that takes an input position up again rewinds, replays
  /// the passes before it and skips to it (what Model::fit does after an elastic change). Call
  /// it with no iterator of the dataset alive.
  void rewind_passes() const {
    if (rewind_) rewind_();
  }

  /// Range-for support: each begin() starts a new pass, which the returned iterator owns.
  class range_iterator {
   public:
    range_iterator() = default;
    explicit range_iterator(std::shared_ptr<DistributedIterator> it) : it_(std::move(it)), inner_(it_->begin()) {}
    const PerReplica<data::Element>& operator*() const { return *inner_; }
    const PerReplica<data::Element>* operator->() const { return &*inner_; }
    range_iterator& operator++() {
      ++inner_;
      return *this;
    }
    friend bool operator==(const range_iterator& a, const range_iterator& b) { return a.inner_ == b.inner_; }
    friend bool operator!=(const range_iterator& a, const range_iterator& b) { return !(a == b); }

   private:
    std::shared_ptr<DistributedIterator> it_;
    DistributedIterator::range_iterator inner_;
  };
  range_iterator begin() const { return range_iterator(std::make_shared<DistributedIterator>(make_iterator())); }
  range_iterator end() const { return range_iterator(); }

 private:
  factory make_source_;
  std::function<void()> rewind_;
};

}  // namespace troupe::distribute
