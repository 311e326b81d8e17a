#include <algorithm>
#include <chrono>
#include <deque>
#include <stdexcept>
#include <string>

#include "distribute/strategies/step_profile.hpp"
#include "distribute/collectives/worker_group.hpp"
#include "distribute/input/file_split.hpp"
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
  /// The last element's rows over every replica of every worker, where known without a collective.
  virtual std::optional<std::int64_t> global_rows() const { return std::nullopt; }
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

}  // namespace

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

namespace {

// Where each replica's input goes: its device, or the host when fetch_to_device is off.
std::vector<Device> input_devices(std::vector<Device> devices, const InputOptions& options) {
  if (!options.experimental_fetch_to_device) {
    for (Device& d : devices) d = Device();
  }
  return devices;
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

// This worker's replicas' shares of a global batch that every worker read whole (AutoShardPolicy
// DATA or OFF), with the step's rows over every replica of every worker, which each worker knows
// without asking the others.
struct SharedBatch {
  Batch batch;
  std::int64_t global_rows = 0;
};

// Every item is a SharedBatch.
class SharedBatchSource final : public InputSource {
 public:
  SharedBatchSource(Strategy& strategy, std::function<item()> produce, std::int64_t depth)
      : producer_(strategy, std::move(produce), depth) {}
  std::optional<Batch> next() override {
    item x = producer_.next();
    if (!x) {
      rows_.reset();
      return std::nullopt;
    }
    const auto* shared = static_cast<const SharedBatch*>(x.get());
    rows_ = shared->global_rows;
    return shared->batch;
  }
  std::chrono::nanoseconds waited() const override { return producer_.waited(); }
  std::optional<std::int64_t> global_rows() const override { return rows_; }

 private:
  Producer producer_;
  std::optional<std::int64_t> rows_;
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
    // The empty batches are cut from the donor before any element is moved out of `got`.
    const data::Element empty = slice_element(*shape_donor, 0, 0, "distribute_datasets_from_function");
    std::vector<data::Element> parts(n);
    for (std::size_t r = 0; r < n; ++r) parts[r] = got[r] ? std::move(*got[r]) : empty;
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

// The end of the data agreed across workers (TensorFlow's get_next_as_optional under
// MultiWorkerMirroredStrategy): every call, each worker tells the others whether it has a step of
// input, what its elements look like, or that reading failed (one row each, gathered). The
// pass goes on while any worker has data; a worker whose own data has ended gives its replicas
// empty batches shaped like the others' (0 rows), so every worker runs the same steps and no one
// waits in a collective for a worker that has stopped. It ends on every worker at the same call.
class AgreedSource final : public InputSource {
 public:
  AgreedSource(std::shared_ptr<InputSource> inner, WorkerGroup& workers, std::vector<Device> devices)
      : inner_(std::move(inner)), workers_(&workers), devices_(std::move(devices)) {}

  std::optional<Batch> next() override {
    if (ended_) return std::nullopt;
    std::optional<Batch> mine;
    std::exception_ptr failure;
    try {
      mine = inner_->next();
    } catch (...) {
      failure = std::current_exception();
    }
    // One row per worker: state (0 ended, 1 data, 2 failed), components, the rows of its
    // replicas' elements, and for each component its dtype code and rank and sizes.
    std::vector<std::int64_t> row(static_cast<std::size_t>(cols), 0);
    if (mine && !failure) {
      try {
        describe(*mine, row);  // elements that cannot be described fail every worker, not only this one
      } catch (...) {
        failure = std::current_exception();
        std::fill(row.begin(), row.end(), 0);
      }
    }
    row[0] = failure ? 2 : mine ? 1 : 0;
    // Each worker's row in its own slot of a zeroed table, summed over the workers: one small
    // all-reduce gathers every row (an all-gather of unknown sizes would take two exchanges).
    const int n = workers_->size();
    std::vector<std::int64_t> slots(static_cast<std::size_t>(n) * cols, 0);
    std::copy(row.begin(), row.end(), slots.begin() + static_cast<std::ptrdiff_t>(workers_->rank()) * cols);
    const std::vector<std::int64_t> all =
        workers_->sum(Tensor::from_vector(slots, {static_cast<std::int64_t>(slots.size())})).to_vector<std::int64_t>();
    if (static_cast<std::int64_t>(all.size()) != static_cast<std::int64_t>(n) * cols) {
      throw std::runtime_error("distributed input: the workers' descriptions of their input came back as " +
                               std::to_string(all.size()) + " numbers, expected " + std::to_string(n * cols));
    }
    int donor = -1;
    std::int64_t rows = 0;
    for (int w = 0; w < n; ++w) {
      const std::int64_t* r = all.data() + static_cast<std::size_t>(w) * cols;
      if (r[0] == 2) {
        if (failure) std::rethrow_exception(failure);
        throw std::runtime_error("distributed input: worker " + std::to_string(w) +
                                 " failed to read its input (its own log names the cause); every worker stops "
                                 "at this step");
      }
      if (r[0] != 0 && r[0] != 1) throw malformed(w, "state " + std::to_string(r[0]));
      if (r[0] == 1) {
        check_row(w, r);
        rows += r[2];
        if (donor < 0) {
          donor = w;
        } else {
          check_same_structure(donor, all.data() + static_cast<std::size_t>(donor) * cols, w, r);
        }
      }
    }
    if (donor < 0) {
      ended_ = true;
      rows_.reset();
      return std::nullopt;
    }
    rows_ = rows;
    if (mine) return mine;
    return empty_like(all.data() + static_cast<std::size_t>(donor) * cols);
  }

  std::chrono::nanoseconds waited() const override { return inner_->waited(); }
  std::optional<std::int64_t> global_rows() const override { return rows_; }

 private:
  static constexpr int max_components = 8;
  static constexpr int max_rank = 8;
  static constexpr int per_component = 2 + max_rank;
  static constexpr int header = 3;  // state, components, this worker's rows
  static constexpr int cols = header + max_components * per_component;

  static std::runtime_error malformed(int worker, const std::string& what) {
    return std::runtime_error("distributed input: worker " + std::to_string(worker) +
                              " sent a malformed description of its input (" + what + ")");
  }

  // This worker's first replica's element: its components' dtypes and shapes.
  void describe(const Batch& batch, std::vector<std::int64_t>& row) const {
    const data::Element& e = batch[0];
    if (e.empty() || static_cast<int>(e.size()) > max_components) {
      throw std::invalid_argument("distributed input across workers: an element has " + std::to_string(e.size()) +
                                  " components (expected 1.." + std::to_string(max_components) + ")");
    }
    row[1] = static_cast<std::int64_t>(e.size());
    for (const data::Element& part : batch.values()) row[2] += part.empty() || part[0].rank() < 1 ? 0 : part[0].shape()[0];
    for (std::size_t c = 0; c < e.size(); ++c) {
      const Tensor& t = e[c];
      if (t.rank() < 1 || t.rank() > max_rank) {
        throw std::invalid_argument("distributed input across workers: component " + std::to_string(c) +
                                    " of an element has rank " + std::to_string(t.rank()) + " (expected a batch: rank 1.." +
                                    std::to_string(max_rank) + "); batch the dataset before distributing it");
      }
      std::int64_t* p = row.data() + header + c * per_component;
      p[0] = static_cast<std::int64_t>(t.dtype()) + 1;
      p[1] = t.rank();
      for (int d = 0; d < t.rank(); ++d) p[2 + d] = t.shape()[static_cast<std::size_t>(d)];
    }
  }

  // A peer's row is checked before it means anything.
  static void check_row(int w, const std::int64_t* r) {
    if (r[1] < 1 || r[1] > max_components) throw malformed(w, std::to_string(r[1]) + " components");
    if (r[2] < 0) throw malformed(w, std::to_string(r[2]) + " rows");
    for (int c = 0; c < r[1]; ++c) {
      const std::int64_t* p = r + header + c * per_component;
      if (p[0] < 1 || p[0] > 4) throw malformed(w, "dtype code " + std::to_string(p[0]));
      if (p[1] < 1 || p[1] > max_rank) throw malformed(w, "rank " + std::to_string(p[1]));
      for (int d = 0; d < p[1]; ++d) {
        if (p[2 + d] < 0) throw malformed(w, "size " + std::to_string(p[2 + d]));
      }
    }
  }

  static std::string structure(const std::int64_t* r) {
    std::string out;
    for (int c = 0; c < r[1]; ++c) {
      const std::int64_t* p = r + header + c * per_component;
      Shape rest(p + 3, p + 2 + p[1]);  // every size but the rows
      out += (c ? ", " : "") + std::string(dtype_name(static_cast<DType>(p[0] - 1))) + " [rows" +
             (rest.empty() ? "" : ", " + shape_to_string(rest).substr(1, shape_to_string(rest).size() - 2)) + "]";
    }
    return "{" + out + "}";
  }

  static void check_same_structure(int a, const std::int64_t* ra, int b, const std::int64_t* rb) {
    bool same = ra[1] == rb[1];
    for (int c = 0; same && c < ra[1]; ++c) {
      const std::int64_t* p = ra + header + c * per_component;
      const std::int64_t* q = rb + header + c * per_component;
      same = p[0] == q[0] && p[1] == q[1] && std::equal(p + 3, p + 2 + p[1], q + 3);
    }
    if (!same) {
      throw std::invalid_argument("distributed input: worker " + std::to_string(a) + " reads elements " + structure(ra) +
                                  ", worker " + std::to_string(b) + " reads " + structure(rb) +
                                  "; every worker's dataset must give elements of one structure");
    }
  }

  // Empty batches (0 rows) shaped like the donor's elements, for every local replica.
  Batch empty_like(const std::int64_t* r) const {
    std::vector<data::Element> parts(devices_.size());
    for (auto& part : parts) {
      for (int c = 0; c < r[1]; ++c) {
        const std::int64_t* p = r + header + c * per_component;
        Shape shape(p + 2, p + 2 + p[1]);
        shape[0] = 0;
        part.push_back(Tensor::zeros(shape, static_cast<DType>(p[0] - 1)));
      }
    }
    Batch b(std::move(parts));
    place(b, devices_);
    return b;
  }

  std::shared_ptr<InputSource> inner_;
  WorkerGroup* workers_;
  std::vector<Device> devices_;
  bool ended_ = false;
  std::optional<std::int64_t> rows_;  // the last step's rows over every worker
};

// With several workers, the end of the data is agreed across them (see AgreedSource).
std::shared_ptr<InputSource> agreed(std::shared_ptr<InputSource> source, WorkerGroup& workers,
                                    const std::vector<Device>& devices) {
  if (workers.size() == 1) return source;
  return std::make_shared<AgreedSource>(std::move(source), workers, devices);
}

// The rest of a pass begun over a different number of workers (file_split.hpp): every worker
// reads the same joined global batches, `steps`, and keeps its own replicas' rows of each, as
// DATA sharding does; every worker knows the step's rows, and the end is the same step everywhere.
std::shared_ptr<InputSource> joined_source(Strategy& strategy, std::function<std::optional<data::Element>()> steps,
                                           std::int64_t global_batch, const InputOptions& options,
                                           const std::vector<Device>& devices) {
  const int replicas = strategy.num_replicas_in_sync();
  const int first = strategy.backend().first_replica_id();
  const int local = strategy.num_local_replicas();
  auto produce = [steps = std::move(steps), global_batch, replicas, first, local, devices]() mutable -> item {
    std::optional<data::Element> e = steps();
    if (!e) return nullptr;
    const std::int64_t rows = (*e)[0].shape()[0];  // join_steps joins rows: a first dimension
    if (global_batch == 0) global_batch = rows;
    auto step = std::make_shared<SharedBatch>();
    step->batch = split_global_batch(*e, global_batch, replicas, first, local);
    step->global_rows = rows;
    place(step->batch, devices);
    return step;
  };
  return std::make_shared<SharedBatchSource>(strategy, std::move(produce), options.experimental_prefetch_to_device);
}

}  // namespace
}  // namespace detail

DistributedIterator::DistributedIterator(std::shared_ptr<detail::InputSource> source, std::int64_t split_workers)
    : source_(std::move(source)), split_workers_(split_workers) {}

std::optional<PerReplica<data::Element>> DistributedIterator::get_next_as_optional() { return source_->next(); }

PerReplica<data::Element> DistributedIterator::get_next() {
  auto x = source_->next();
  if (!x) throw OutOfRange("get_next: the end of the distributed dataset was reached");
  return std::move(*x);
}

std::chrono::nanoseconds DistributedIterator::time_waiting() const { return source_->waited(); }

std::optional<std::int64_t> DistributedIterator::last_global_rows() const { return source_->global_rows(); }

namespace {

// AUTO's choice for a pass begun over `workers` workers of a dataset that reads `files` files
// (TensorFlow's rule): FILE when every worker has a file of its own, else DATA.
bool auto_reads_files(std::int64_t files, int workers) { return workers > 1 && files >= workers; }

// The auto-shard policy in effect for a dataset over `workers` workers: FILE needs a file-based
// dataset with a file for every worker; AUTO is FILE when that holds, else DATA.
AutoShardPolicy effective_policy(AutoShardPolicy policy, const data::Dataset& dataset, int workers) {
  const std::int64_t files = dataset.impl()->num_files();
  if (policy == AutoShardPolicy::file) {
    if (files == 0) {
      throw std::invalid_argument(
          "experimental_distribute_dataset: AutoShardPolicy::file needs a dataset that reads files (build it with "
          "files_dataset or csv_files_dataset); this one reads none: use AutoShardPolicy::data or off");
    }
    if (files < workers) {
      throw std::invalid_argument("experimental_distribute_dataset: AutoShardPolicy::file: the dataset reads " +
                                  std::to_string(files) + " file(s), fewer than the " + std::to_string(workers) +
                                  " workers; give every worker a file, or use AutoShardPolicy::data");
    }
    return AutoShardPolicy::file;
  }
  if (policy == AutoShardPolicy::automatic) {
    return auto_reads_files(files, workers) ? AutoShardPolicy::file : AutoShardPolicy::data;
  }
  return policy;
}

// Pass `pass` of a FILE split begun over `over` workers. Each worker reads only its own files
// (w, w + W, ...) and splits each global batch it reads into the replicas' shares as DATA does,
// its own replicas' shares first and then the other workers' shares, one step each: a global
// batch from its files feeds W steps of its replicas, each replica getting global_batch /
// replicas_in_sync rows. The workers' files hold different amounts of data, so the end is agreed
// across them. A pass begun over another number of workers than there are now (an elastic
// cluster's change) is file_split.hpp's joined steps.
DistributedIterator file_pass(Strategy& strategy, detail::FileSplit& split, int over, std::int64_t pass,
                              std::int64_t declared, const InputOptions& options, const std::vector<Device>& devices) {
  detail::WorkerGroup& group = strategy.backend().workers();
  const int now = group.size();
  if (over != now) {
    return DistributedIterator(detail::joined_source(strategy, split.global_steps(over, pass), declared, options, devices),
                               over);
  }
  auto produce = [steps = split.own_steps(now, group.rank(), pass), devices]() mutable -> detail::item {
    std::optional<detail::Batch> step = steps();
    if (!step) return nullptr;
    auto batch = std::make_shared<detail::Batch>(std::move(*step));
    detail::place(*batch, devices);
    return batch;
  };
  return DistributedIterator(
      detail::agreed(
          std::make_shared<detail::BatchSource>(strategy, std::move(produce), options.experimental_prefetch_to_device),
          group, devices),
      now);
}

// A DATA or OFF pass over the global batches `open` gives (made when the pass is first read).
// DATA: every worker reads the same global batches and keeps the rows of its own replicas
// (sharding by data at row granularity: the workers see the same number of steps, so the end of
// the data is the same step everywhere). OFF: each worker splits whole global batches over its
// local replicas instead. Either way every worker knows the step's rows over the cluster: the
// global batch's rows (DATA; some workers may hold more of them than others, or none), or each
// worker's whole global batch, the same on every worker (OFF). The split is read when the
// iterator is made: after an elastic change, over the workers that continue (the global batch
// stays the same).
DistributedIterator data_pass(Strategy& strategy, std::function<std::shared_ptr<data::Iterator>()> open, bool off,
                              std::int64_t declared, std::int64_t split_workers, const InputOptions& options,
                              const std::vector<Device>& devices) {
  const int local = strategy.num_local_replicas();
  const int replicas = off ? local : strategy.num_replicas_in_sync();
  const int first = off ? 0 : strategy.backend().first_replica_id();
  const std::int64_t copies = off ? strategy.backend().workers().size() : 1;
  auto produce = [open = std::move(open), replicas, first, local, devices, copies, it = std::shared_ptr<data::Iterator>(),
                  global_batch = declared]() mutable -> detail::item {
    if (!it) it = open();
    auto e = it->get_next_as_optional();
    if (!e) return nullptr;
    if (global_batch == 0 && !e->empty() && (*e)[0].rank() > 0) global_batch = (*e)[0].shape()[0];
    auto step = std::make_shared<detail::SharedBatch>();
    step->batch = detail::split_global_batch(*e, global_batch, replicas, first, local);
    step->global_rows = (*e)[0].shape()[0] * copies;  // split_global_batch checked a first dimension
    detail::place(step->batch, devices);
    return step;
  };
  return DistributedIterator(
      std::make_shared<detail::SharedBatchSource>(strategy, std::move(produce), options.experimental_prefetch_to_device),
      split_workers);
}

}  // namespace

DistributedDataset Strategy::experimental_distribute_dataset(data::Dataset dataset, InputOptions options) {
  const int workers = backend_->workers().size();
  const AutoShardPolicy policy = effective_policy(options.auto_shard_policy, dataset, workers);
  const int local = num_local_replicas();
  const std::vector<Device> devices = detail::input_devices(backend_->devices(), options);
  const std::int64_t declared = dataset.impl()->batch_size().value_or(0);
  const std::int64_t files = dataset.impl()->num_files();
  if (options.auto_shard_policy == AutoShardPolicy::automatic && files > 0) {
    // AUTO over files chooses when each pass begins, from the workers it begins over, and a pass
    // taken up (make_iterator(split_workers)) keeps the choice it began with (file_split.hpp).
    auto split = std::make_shared<detail::FileSplit>(dataset, local);
    return DistributedDataset([this, split, options, devices, declared, files](std::int64_t split_workers) {
      const int over = split_workers > 0 ? static_cast<int>(split_workers) : backend_->workers().size();
      const std::int64_t pass = split->next_pass();
      if (auto_reads_files(files, over)) return file_pass(*this, *split, over, pass, declared, options, devices);
      auto it = split->whole(pass);
      return data_pass(*this, [it] { return it; }, false, declared, over, options, devices);
    }, [split] { split->rewind(); });
  }
  if (policy == AutoShardPolicy::file && workers > 1) {
    // The split is read when an iterator is made; a pass taken up after a change of membership is
    // file_split.hpp's.
    auto split = std::make_shared<detail::FileSplit>(dataset, local);
    return DistributedDataset([this, split, options, devices, declared](std::int64_t split_workers) {
      const int over = split_workers > 0 ? static_cast<int>(split_workers) : backend_->workers().size();
      return file_pass(*this, *split, over, split->next_pass(), declared, options, devices);
    }, [split] { split->rewind(); });
  }
  const bool off = policy == AutoShardPolicy::off;
  return DistributedDataset([this, dataset, options, off, devices, declared](std::int64_t) {
    return data_pass(*this, [dataset] { return std::make_shared<data::Iterator>(dataset.make_iterator()); }, off,
                     declared, 0, options, devices);
  }, [dataset] { dataset.impl()->rewind(); });
}

namespace {

// A pipeline's steps for join_steps: up to `per_step` elements each, one a replica.
std::function<std::optional<detail::Batch>()> element_steps(const data::Dataset& ds, int per_step) {
  return [it = std::make_shared<data::Iterator>(ds.make_iterator()), per_step]() -> std::optional<detail::Batch> {
    std::vector<data::Element> parts;
    for (int r = 0; r < per_step; ++r) {
      auto e = it->get_next_as_optional();
      if (!e) break;
      parts.push_back(std::move(*e));
    }
    if (parts.empty()) return std::nullopt;
    return detail::Batch(std::move(parts));
  };
}

}  // namespace

DistributedDataset Strategy::distribute_datasets_from_function(
    std::function<data::Dataset(const InputContext&)> dataset_fn, InputOptions options) {
  const int replicas = num_local_replicas();
  const std::vector<Device> devices = detail::input_devices(backend_->devices(), options);
  const bool per_replica = options.experimental_replication_mode == InputReplicationMode::per_replica;
  // The input contexts are read when an iterator is made. A pass taken up after a change of
  // membership from a different number of workers calls dataset_fn for every input context of
  // then, and every worker joins their steps and keeps its replicas' rows (file_split.hpp).
  auto taken_up = [this, dataset_fn, options, replicas, devices, per_replica](int over) {
    std::vector<std::function<std::optional<detail::Batch>()>> pipelines;
    const int n = per_replica ? over * replicas : over;
    for (int id = 0; id < n; ++id) {
      pipelines.push_back(element_steps(dataset_fn(InputContext{n, id, over * replicas}), per_replica ? 1 : replicas));
    }
    return DistributedIterator(detail::joined_source(*this, detail::join_steps(std::move(pipelines)), 0, options, devices),
                               over);
  };
  // Each worker's dataset_fn may give it more or fewer steps than the others: the end is agreed.
  if (per_replica) {
    return DistributedDataset([this, dataset_fn, options, replicas, devices, taken_up](std::int64_t split_workers) {
      detail::WorkerGroup& group = backend_->workers();
      const int workers = group.size();
      const int worker = group.rank();
      if (split_workers > 0 && split_workers != workers) return taken_up(static_cast<int>(split_workers));
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
      return DistributedIterator(
          detail::agreed(std::make_shared<detail::PerReplicaSource>(std::move(producers), devices), group, devices),
          workers);
    });
  }
  return DistributedDataset([this, dataset_fn, options, replicas, devices, taken_up](std::int64_t split_workers) {
    detail::WorkerGroup& group = backend_->workers();
    const int workers = group.size();
    if (split_workers > 0 && split_workers != workers) return taken_up(static_cast<int>(split_workers));
    InputContext ctx{workers, group.rank(), num_replicas_in_sync()};
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
    return DistributedIterator(
        detail::agreed(
            std::make_shared<detail::BatchSource>(*this, std::move(produce), options.experimental_prefetch_to_device),
            group, devices),
        workers);
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
