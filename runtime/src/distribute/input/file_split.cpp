#include "distribute/input/file_split.hpp"

#include <deque>
#include <stdexcept>
#include <string>

#include "troupe/distribute/input.hpp"

namespace troupe::distribute::detail {

using Batch = PerReplica<data::Element>;

std::function<std::optional<data::Element>()> join_steps(std::vector<std::function<std::optional<Batch>()>> workers) {
  return [workers = std::move(workers), ended = std::vector<bool>()]() mutable -> std::optional<data::Element> {
    ended.resize(workers.size(), false);
    std::vector<std::vector<Tensor>> components;
    for (std::size_t w = 0; w < workers.size(); ++w) {
      if (ended[w]) continue;
      std::optional<Batch> step = workers[w]();
      if (!step) {
        ended[w] = true;
        continue;
      }
      for (const data::Element& part : step->values()) {
        if (part.empty() || part[0].rank() < 1 || part[0].shape()[0] == 0) continue;  // a replica without rows
        if (components.empty()) components.resize(part.size());
        if (part.size() != components.size()) {
          throw std::invalid_argument("distributed input: the rest of a pass joins elements of " +
                                      std::to_string(components.size()) + " and of " + std::to_string(part.size()) +
                                      " components; every worker's input must give elements of one structure");
        }
        for (std::size_t c = 0; c < part.size(); ++c) components[c].push_back(part[c]);
      }
    }
    if (components.empty()) return std::nullopt;  // every worker's input ended (a step has rows while any has data)
    data::Element out;
    out.reserve(components.size());
    for (const auto& parts : components) out.push_back(parts.size() == 1 ? parts.front() : concat(parts, 0));
    return out;
  };
}

FileSplit::FileSplit(data::Dataset dataset, int local_replicas) : dataset_(std::move(dataset)), local_(local_replicas) {
  if (dataset_.impl()->num_files() == 0) {
    throw std::invalid_argument("AutoShardPolicy::file: the dataset reads no files (expected a files_dataset upstream)");
  }
  if (local_ < 1) throw std::invalid_argument("AutoShardPolicy::file: a worker needs at least one replica");
}

std::int64_t FileSplit::next_pass() {
  std::lock_guard<std::mutex> lock(mutex_);
  return passes_++;
}

void FileSplit::rewind() {
  std::lock_guard<std::mutex> lock(mutex_);
  passes_ = 0;
}

std::shared_ptr<data::Iterator> FileSplit::iterate(int workers, int rank, std::int64_t pass) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = graphs_.find({workers, rank});
  if (found == graphs_.end()) {
    found = graphs_.emplace(std::make_pair(workers, rank), Graph{data::Dataset(dataset_.impl()->shard_files(workers, rank)), 0})
                .first;
  }
  Graph& g = found->second;
  if (g.passes > pass) {
    g.dataset.impl()->rewind();
    g.passes = 0;
  }
  // The passes before this one, each begun (its shuffles draw their orders as it starts) and dropped.
  for (; g.passes < pass; ++g.passes) g.dataset.make_iterator().get_next_as_optional();
  ++g.passes;
  return std::make_shared<data::Iterator>(g.dataset.make_iterator());
}

std::function<std::optional<Batch>()> FileSplit::own_steps(int workers, int rank, std::int64_t pass) {
  if (workers < 1 || rank < 0 || rank >= workers) {
    throw std::invalid_argument("AutoShardPolicy::file: worker " + std::to_string(rank) + " of " +
                                std::to_string(workers) + " (expected 0 <= rank < workers)");
  }
  return [it = iterate(workers, rank, pass), pending = std::deque<Batch>(), workers, rank, local = local_,
          global_batch = dataset_.impl()->batch_size().value_or(0)]() mutable -> std::optional<Batch> {
    while (pending.empty()) {
      std::optional<data::Element> e = it->get_next_as_optional();
      if (!e) return std::nullopt;
      if (global_batch == 0 && !e->empty() && (*e)[0].rank() > 0) global_batch = (*e)[0].shape()[0];
      // One global batch of this worker's files feeds a step of every worker's replicas' shares,
      // its own first; a share without rows (a last partial batch) is no step.
      for (int k = 0; k < workers; ++k) {
        const int first = ((rank + k) % workers) * local;
        Batch part = split_global_batch(*e, global_batch, workers * local, first, local);
        bool any = false;
        for (int r = 0; r < local; ++r) any = any || (!part[r].empty() && part[r][0].shape()[0] > 0);
        if (any) pending.push_back(std::move(part));
      }
    }
    Batch out = std::move(pending.front());
    pending.pop_front();
    return out;
  };
}

std::function<std::optional<data::Element>()> FileSplit::global_steps(int workers, std::int64_t pass) {
  std::vector<std::function<std::optional<Batch>()>> each;
  for (int w = 0; w < workers; ++w) each.push_back(own_steps(workers, w, pass));
  return join_steps(std::move(each));
}

}  // namespace troupe::distribute::detail
