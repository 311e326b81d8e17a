// AutoShardPolicy::file across changes of membership: the steps a pass gives each worker, and
// the rest of a pass taken up by a different number of workers.
//
// A FILE pass over W workers reads, on worker w, only the files w, w + W, ... (shard_files(W, w)),
// and splits each global batch it reads into W steps of its local replicas' shares (its own
// replicas' first, then the other workers'). Step s of the pass over the cluster is the union of
// every worker's step s: at most one global batch of rows (fewer once some workers' files ended),
// the same rows whichever process computes them. That is what a change of membership keeps:
//
//   1. The commit records the step s within the pass and W, the workers the pass's files were
//      split over (DistributedIterator::split_workers).
//   2. Taken up by W workers again (a loss and a join, whoever holds which rank now), each reads
//      its own files from step s on, as before: worker w's steps depend only on W and w.
//   3. Taken up by W' != W workers, every worker reads the files of all W (the steps of each old
//      worker, rebuilt from its files), joins their step s, s + 1, ... into one global batch each
//      and keeps its own replicas' rows of it, as DATA sharding does, until the pass ends; the
//      next pass splits the files over the W' workers. No row of the pass is left out or read
//      twice, at the cost of every worker reading every file for the rest of that pass.
//
// The shuffles of a file-sharded graph count their passes as any graph does (each draws a new
// order per pass), but each split has graphs of its own: the pass number is kept here, for the
// dataset, and each graph is brought to it before it is read (rewound and replayed when it
// stands past it), so pass p reads the orders of pass p whichever splits the passes before used.
//
// AutoShardPolicy::automatic over a file-based dataset chooses FILE or DATA when each pass
// begins, from the workers W it begins over: FILE when W > 1 and the dataset reads at least W
// files, else DATA (TensorFlow's rule, which it applies once: an elastic cluster's W changes, and
// a worker that joins distributes its dataset over the workers of then). The pass records W
// whichever it chose (DistributedIterator::split_workers), so a pass taken up after a change is
// read by the policy it began with on every worker, the joiner's included. Its DATA passes read
// the whole dataset (whole()), numbered with its FILE passes, so either reads the orders of its
// pass.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "troupe/data/dataset.hpp"
#include "troupe/distribute/per_replica.hpp"

namespace troupe::distribute::detail {

/// The steps of several workers' input, each step joined into one element: every component of
/// every replica's share of every worker that still has data, concatenated along the rows in the
/// order given; nullopt once every one of them ended.
std::function<std::optional<data::Element>()> join_steps(
    std::vector<std::function<std::optional<PerReplica<data::Element>>()>> workers);

/// The shares of a global batch `e` of `global_batch` rows split over `replicas` replicas, of
/// the `local` replicas from `first` on (detail::split_rows's rule); checks that every component
/// has the same rows.
PerReplica<data::Element> split_global_batch(const data::Element& e, std::int64_t global_batch, int replicas,
                                             int first, int local);

class FileSplit {
 public:
  /// `dataset` reads files (num_files() > 0); every worker has `local_replicas` replicas.
  FileSplit(data::Dataset dataset, int local_replicas);

  /// A new pass: its number (0, 1, ...).
  std::int64_t next_pass();
  /// Back to pass 0, as a dataset just made (DistributedDataset::rewind_passes).
  void rewind();

  /// Worker `rank` of `workers`'s steps of pass `pass`: each its local replicas' shares of a
  /// global batch read from its own files; nullopt once they ended.
  std::function<std::optional<PerReplica<data::Element>>()> own_steps(int workers, int rank, std::int64_t pass);
  /// The steps of pass `pass` over `workers` workers, each the union of every worker's rows of
  /// that step in one element (worker 0's rows first); nullopt once every worker's files ended.
  std::function<std::optional<data::Element>()> global_steps(int workers, std::int64_t pass);
  /// The whole dataset (every file, as one worker reads it) at pass `pass`: a DATA pass of an
  /// AUTO-sharded dataset, whose passes count with its FILE passes (AutoSplit below).
  std::shared_ptr<data::Iterator> whole(std::int64_t pass) { return iterate(1, 0, pass); }

 private:
  // Worker `rank` of `workers`'s pipeline at pass `pass`, over its own graph.
  std::shared_ptr<data::Iterator> iterate(int workers, int rank, std::int64_t pass);

  data::Dataset dataset_;
  int local_;
  std::mutex mutex_;
  std::int64_t passes_ = 0;
  struct Graph {
    data::Dataset dataset;
    std::int64_t passes = 0;  // iterators made over it since it was built or rewound
  };
  std::map<std::pair<int, int>, Graph> graphs_;
};

}  // namespace troupe::distribute::detail
