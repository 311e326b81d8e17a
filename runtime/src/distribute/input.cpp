#include <chrono>
#include <stdexcept>
#include <string>

#include "distribute/step_profile.hpp"
#include "distribute/worker_group.hpp"
#include "troupe/actors/input_pipeline.hpp"
#include "troupe/distribute/input.hpp"
#include "troupe/distribute/strategy.hpp"
#include "troupe/errors.hpp"
#include "troupe/runtime.hpp"

namespace troupe::distribute {
namespace detail {

using Batch = PerReplica<data::Element>;

/// Where a DistributedIterator's per-replica elements come from.
class InputSource {
 public:
  virtual ~InputSource() = default;
  /// The next per-replica element, nullopt at the end; rethrows a reading error.
  virtual std::optional<Batch> next() = 0;
  virtual std::chrono::nanoseconds waited() const = 0;
};

std::vector<std::pair<std::int64_t, std::int64_t>> split_rows(std::int64_t rows, std::int64_t global_batch,
                                                               int replicas) {
  if (replicas < 1) throw std::invalid_argument("split_rows: need at least one replica");
  if (global_batch < rows) global_batch = rows;
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  out.reserve(static_cast<std::size_t>(replicas));
  std::int64_t begin = 0;
  for (int r = 0; r < replicas; ++r) {
    const std::int64_t capacity = global_batch / replicas + (r < global_batch % replicas ? 1 : 0);
    const std::int64_t take = std::min(capacity, rows - begin);
    out.emplace_back(begin, begin + take);
    begin += take;
  }
  return out;
}

namespace {

using item = actors::input_pipeline::item;

// Rows [begin, end) of every component.
data::Element slice_element(const data::Element& e, std::int64_t begin, std::int64_t end, const char* who) {
  data::Element out;
  out.reserve(e.size());
  for (std::size_t c = 0; c < e.size(); ++c) {
    if (e[c].rank() == 0) {
      throw std::invalid_argument(std::string(who) + ": component " + std::to_string(c) +
                                  " of an element is a scalar; batch the dataset before distributing it");
    }
    out.push_back(e[c].slice(begin, end));
  }
  return out;
}

// Splits a global batch over `replicas` replicas and keeps `local` of them from `first` on.
Batch split_global_batch(const data::Element& e, std::int64_t global_batch, int replicas, int first, int local) {
  const char* who = "experimental_distribute_dataset";
  if (e.empty()) throw std::invalid_argument(std::string(who) + ": an element has no components");
  if (e[0].rank() == 0) slice_element(e, 0, 0, who);  // throws the scalar error
  const std::int64_t rows = e[0].shape()[0];
  for (std::size_t c = 1; c < e.size(); ++c) {
    if (e[c].rank() == 0 || e[c].shape()[0] != rows) {
      throw std::invalid_argument(std::string(who) + ": component 0 has " + std::to_string(rows) +
                                  " rows, component " + std::to_string(c) + " has shape " +
                                  shape_to_string(e[c].shape()) + "; every component of a batch needs the same rows");
    }
  }
  const auto bounds = split_rows(rows, global_batch, replicas);
  std::vector<data::Element> parts;
  parts.reserve(static_cast<std::size_t>(local));
  for (int r = first; r < first + local; ++r) {
    parts.push_back(slice_element(e, bounds[static_cast<std::size_t>(r)].first, bounds[static_cast<std::size_t>(r)].second, who));
  }
  return Batch(std::move(parts));
}

// Places each replica's tensors on its device.
void place(Batch& batch, const std::vector<Device>& devices) {
  for (int r = 0; r < batch.num_replicas(); ++r) {
    for (Tensor& t : batch[r]) t = t.with_device(devices[static_cast<std::size_t>(r)]);
  }
}

// Produces items on the consumer's thread (the default strategy has no actors).
class InlineProducer {
 public:
  explicit InlineProducer(std::function<item()> produce) : produce_(std::move(produce)) {}
  item next() {
    if (done_) return nullptr;
    item x = produce_();
    if (!x) done_ = true;
    return x;
  }
  std::chrono::nanoseconds waited() const { return std::chrono::nanoseconds{0}; }

 private:
  std::function<item()> produce_;
  bool done_ = false;
};

// One producer: an input pipeline actor when the strategy has a runtime, else inline.
class Producer {
 public:
  Producer(Strategy& strategy, std::function<item()> produce, std::int64_t depth) : backend_(&strategy.backend()) {
    if (Runtime* rt = strategy.backend().runtime()) {
      actor_ = std::make_unique<actors::input_pipeline>(rt->system(), std::move(produce),
                                                        static_cast<std::size_t>(std::max<std::int64_t>(0, depth)),
                                                        std::chrono::microseconds(rt->options().spin_us));
    } else {
      inline_ = std::make_unique<InlineProducer>(std::move(produce));
    }
  }
  item next() {
    StepProfile* profile = backend_->step_profile();
    if (!profile) return actor_ ? actor_->next() : inline_->next();
    const std::int64_t start = profile_now_ns();
    item x = actor_ ? actor_->next() : inline_->next();
    profile->input_wait(start, profile_now_ns() - start);
    return x;
  }
  std::chrono::nanoseconds waited() const { return actor_ ? actor_->waited() : inline_->waited(); }

 private:
  StrategyBackend* backend_;
  std::unique_ptr<actors::input_pipeline> actor_;
  std::unique_ptr<InlineProducer> inline_;
};

// Every item is a whole per-replica Batch.
class BatchSource final : public InputSource {
 public:
  BatchSource(Strategy& strategy, std::function<item()> produce, std::int64_t depth)
      : producer_(strategy, std::move(produce), depth) {}
  std::optional<Batch> next() override {
    item x = producer_.next();
    if (!x) return std::nullopt;
    return *static_cast<const Batch*>(x.get());
  }
  std::chrono::nanoseconds waited() const override { return producer_.waited(); }

 private:
  Producer producer_;
};

// One pipeline per replica; every item is one replica's Element.
class PerReplicaSource final : public InputSource {
 public:
  PerReplicaSource(std::vector<std::unique_ptr<Producer>> producers, std::vector<Device> devices)
      : producers_(std::move(producers)), ended_(producers_.size(), false), devices_(std::move(devices)) {}

  std::optional<Batch> next() override {
    const std::size_t n = producers_.size();
    std::vector<std::optional<data::Element>> got(n);
    const data::Element* shape_donor = nullptr;
    for (std::size_t r = 0; r < n; ++r) {
      if (ended_[r]) continue;
      item x = producers_[r]->next();
      if (!x) {
        ended_[r] = true;
        continue;
      }
      got[r] = *static_cast<const data::Element*>(x.get());
      if (!shape_donor) shape_donor = &*got[r];
    }
    if (!shape_donor) return std::nullopt;  // every pipeline has ended: the end, for all at once
    std::vector<data::Element> parts(n);
    for (std::size_t r = 0; r < n; ++r) {
      parts[r] = got[r] ? std::move(*got[r])
                        : slice_element(*shape_donor, 0, 0, "distribute_datasets_from_function");
    }
    Batch b(std::move(parts));
    place(b, devices_);
    return b;
  }

  std::chrono::nanoseconds waited() const override {
    std::chrono::nanoseconds total{0};
    for (const auto& p : producers_) total += p->waited();
    return total;
  }

 private:
  std::vector<std::unique_ptr<Producer>> producers_;
  std::vector<bool> ended_;
  std::vector<Device> devices_;
};

}  // namespace
}  // namespace detail

DistributedIterator::DistributedIterator(std::shared_ptr<detail::InputSource> source) : source_(std::move(source)) {}

std::optional<PerReplica<data::Element>> DistributedIterator::get_next_as_optional() { return source_->next(); }

PerReplica<data::Element> DistributedIterator::get_next() {
  auto x = source_->next();
  if (!x) throw OutOfRange("get_next: the end of the distributed dataset was reached");
  return std::move(*x);
}

std::chrono::nanoseconds DistributedIterator::time_waiting() const { return source_->waited(); }

DistributedDataset Strategy::experimental_distribute_dataset(data::Dataset dataset, InputOptions options) {
  // Every worker reads the same global batches and keeps the rows of its own replicas (sharding
  // by data at row granularity: the workers see the same number of steps, so the end of the data
  // is the same step everywhere). With AutoShardPolicy::off each worker splits whole global
  // batches over its local replicas instead.
  const bool off = options.auto_shard_policy == AutoShardPolicy::off;
  const int local = num_local_replicas();
  const int replicas = off ? local : num_replicas_in_sync();
  const int first = off ? 0 : backend_->first_replica_id();
  const std::vector<Device> devices = backend_->devices();
  data::Dataset sharded = dataset;
  return DistributedDataset([this, sharded, options, replicas, first, local, devices] {
    auto produce = [sharded, replicas, first, local, devices, it = std::shared_ptr<data::Iterator>(),
                    global_batch = sharded.impl()->batch_size().value_or(0)]() mutable -> detail::item {
      if (!it) it = std::make_shared<data::Iterator>(sharded.make_iterator());
      auto e = it->get_next_as_optional();
      if (!e) return nullptr;
      if (global_batch == 0 && !e->empty() && (*e)[0].rank() > 0) global_batch = (*e)[0].shape()[0];
      auto batch =
          std::make_shared<detail::Batch>(detail::split_global_batch(*e, global_batch, replicas, first, local));
      detail::place(*batch, devices);
      return batch;
    };
    return std::make_shared<detail::BatchSource>(*this, std::move(produce), options.experimental_prefetch_to_device);
  });
}

DistributedDataset Strategy::distribute_datasets_from_function(
    std::function<data::Dataset(const InputContext&)> dataset_fn, InputOptions options) {
  const int replicas = num_local_replicas();
  const std::vector<Device> devices = backend_->devices();
  const int workers = backend_->workers().size();
  const int worker = backend_->workers().rank();
  if (options.experimental_replication_mode == InputReplicationMode::per_replica) {
    return DistributedDataset([this, dataset_fn, options, replicas, devices, workers, worker] {
      std::vector<std::unique_ptr<detail::Producer>> producers;
      for (int r = 0; r < replicas; ++r) {
        InputContext ctx{workers * replicas, worker * replicas + r, workers * replicas};
        data::Dataset ds = dataset_fn(ctx);
        auto produce = [ds, it = std::shared_ptr<data::Iterator>()]() mutable -> detail::item {
          if (!it) it = std::make_shared<data::Iterator>(ds.make_iterator());
          auto e = it->get_next_as_optional();
          if (!e) return nullptr;
          return std::make_shared<data::Element>(std::move(*e));
        };
        producers.push_back(
            std::make_unique<detail::Producer>(*this, std::move(produce), options.experimental_prefetch_to_device));
      }
      return std::make_shared<detail::PerReplicaSource>(std::move(producers), devices);
    });
  }
  return DistributedDataset([this, dataset_fn, options, replicas, devices, workers, worker] {
    InputContext ctx{workers, worker, num_replicas_in_sync()};
    data::Dataset ds = dataset_fn(ctx);
    auto produce = [ds, replicas, devices, it = std::shared_ptr<data::Iterator>()]() mutable -> detail::item {
      if (!it) it = std::make_shared<data::Iterator>(ds.make_iterator());
      std::vector<data::Element> parts;
      parts.reserve(static_cast<std::size_t>(replicas));
      for (int r = 0; r < replicas; ++r) {
        auto e = it->get_next_as_optional();
        if (!e) break;
        parts.push_back(std::move(*e));
      }
      if (parts.empty()) return nullptr;
      // The data ended inside this step: the replicas left over get empty batches.
      const data::Element donor = parts.front();
      while (static_cast<int>(parts.size()) < replicas) {
        parts.push_back(detail::slice_element(donor, 0, 0, "distribute_datasets_from_function"));
      }
      auto batch = std::make_shared<detail::Batch>(std::move(parts));
      detail::place(*batch, devices);
      return batch;
    };
    return std::make_shared<detail::BatchSource>(*this, std::move(produce), options.experimental_prefetch_to_device);
  });
}

DistributedIterator Strategy::make_dataset_iterator(data::Dataset dataset) {
  return experimental_distribute_dataset(std::move(dataset)).make_iterator();
}

DistributedIterator Strategy::make_input_fn_iterator(std::function<data::Dataset(const InputContext&)> input_fn,
                                                     InputReplicationMode mode) {
  InputOptions options;
  options.experimental_replication_mode = mode;
  return distribute_datasets_from_function(std::move(input_fn), options).make_iterator();
}

data::Dataset Strategy::experimental_make_numpy_dataset(std::vector<Tensor> arrays) {
  return data::Dataset::from_tensor_slices(std::move(arrays));
}

}  // namespace troupe::distribute
