#include "troupe/data/dataset.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "troupe/errors.hpp"

namespace troupe::data {

namespace {

using detail::DatasetImpl;
using detail::IteratorImpl;
using DatasetPtr = std::shared_ptr<const DatasetImpl>;

// An operator over `input` rebuilt over its input's file-sharded graph (AutoShardPolicy::file):
// the same operator, with the same arguments, above a source that reads fewer files.
template <class Node, class... Args>
DatasetPtr over_sharded_files(const DatasetPtr& input, std::int64_t num_shards, std::int64_t index,
                              const Args&... args) {
  DatasetPtr sharded = input->shard_files(num_shards, index);
  if (!sharded) return nullptr;
  return std::make_shared<Node>(std::move(sharded), args...);
}

// ---- Cancellation of prefetch producers --------------------------------------------------------
//
// A prefetch producer thread may be inside an upstream next() that loops for a long time, e.g. a
// filter that rejects every element of an infinite input. Destroying the prefetching iterator must
// still return promptly, so the producer thread publishes its stop flag here and the operators
// that loop over their input (filter, skip, shard, repeat, and a nested prefetch waiting for its
// producer) poll it, unwinding with `cancelled` when it is set. The flag is only ever set on
// producer threads, which catch `cancelled`; it never reaches a user.

thread_local const std::atomic<bool>* cancel_flag = nullptr;

/// Not a std::exception, so that nothing between the throw and the producer's catch mistakes it
/// for an error to report.
struct cancelled {};

void throw_if_cancelled() {
  if (cancel_flag != nullptr && cancel_flag->load(std::memory_order_relaxed)) throw cancelled{};
}

std::string str(std::int64_t v) { return std::to_string(v); }

std::string describe(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + " " + shape_to_string(t.shape());
}

// Cardinality arithmetic. Counts are non-negative; -1 and -2 are the two special values.
bool is_count(std::int64_t c) { return c >= 0; }

void check_cardinality_argument(std::int64_t c, const char* op) {
  if (c < unknown_cardinality) {
    throw std::invalid_argument(std::string(op) + ": cardinality " + str(c) +
                                " is not valid (expected a count >= 0, -1 for infinite or -2 for unknown)");
  }
}

// ---- range ------------------------------------------------------------------------------------

class RangeIterator final : public IteratorImpl {
 public:
  RangeIterator(std::int64_t start, std::int64_t step, std::int64_t count)
      : start_(start), step_(step), count_(count) {}
  std::optional<Element> next() override {
    if (index_ >= count_) return std::nullopt;
    // Unsigned arithmetic: the value stays in range, intermediate products may not.
    const auto value = static_cast<std::int64_t>(static_cast<std::uint64_t>(start_) +
                                                 static_cast<std::uint64_t>(index_) * static_cast<std::uint64_t>(step_));
    ++index_;
    return Element{Tensor::scalar<std::int64_t>(value)};
  }

 private:
  std::int64_t start_, step_, count_;
  std::int64_t index_ = 0;
};

class RangeDataset final : public DatasetImpl {
 public:
  RangeDataset(std::int64_t start, std::int64_t stop, std::int64_t step) : start_(start), step_(step) {
    if (step == 0) throw std::invalid_argument("range: step 0 would never reach stop (expected a non-zero step)");
    std::uint64_t distance = 0;  // |stop - start| in the direction of step, without overflow
    if (step > 0 && stop > start) distance = static_cast<std::uint64_t>(stop) - static_cast<std::uint64_t>(start);
    if (step < 0 && stop < start) distance = static_cast<std::uint64_t>(start) - static_cast<std::uint64_t>(stop);
    const std::uint64_t magnitude = step > 0 ? static_cast<std::uint64_t>(step) : 0 - static_cast<std::uint64_t>(step);
    const std::uint64_t count = distance == 0 ? 0 : (distance - 1) / magnitude + 1;
    if (count > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      throw std::invalid_argument("range: [" + str(start) + ", " + str(stop) + ") with step " + str(step) +
                                  " has more than 2^63-1 elements");
    }
    count_ = static_cast<std::int64_t>(count);
  }
  std::unique_ptr<IteratorImpl> make_iterator() const override {
    return std::make_unique<RangeIterator>(start_, step_, count_);
  }
  std::int64_t cardinality() const override { return count_; }

 private:
  std::int64_t start_, step_;
  std::int64_t count_ = 0;
};

// ---- from_tensor_slices / from_tensors ----------------------------------------------------------

using Components = std::shared_ptr<const std::vector<Tensor>>;

class SlicesIterator final : public IteratorImpl {
 public:
  SlicesIterator(Components components, std::int64_t rows) : components_(std::move(components)), rows_(rows) {}
  std::optional<Element> next() override {
    if (row_ >= rows_) return std::nullopt;
    Element out;
    out.reserve(components_->size());
    for (const Tensor& c : *components_) {
      Shape row_shape(c.shape().begin() + 1, c.shape().end());
      out.push_back(c.slice(row_, row_ + 1).reshape(std::move(row_shape)));
    }
    ++row_;
    return out;
  }

 private:
  Components components_;
  std::int64_t rows_;
  std::int64_t row_ = 0;
};

class SlicesDataset final : public DatasetImpl {
 public:
  explicit SlicesDataset(std::vector<Tensor> components) {
    if (components.empty()) {
      throw std::invalid_argument("from_tensor_slices: no components (expected at least one tensor)");
    }
    for (std::size_t i = 0; i < components.size(); ++i) {
      if (components[i].rank() == 0) {
        throw std::invalid_argument("from_tensor_slices: component " + std::to_string(i) +
                                    " is a scalar and has no axis 0 to slice (expected rank >= 1)");
      }
      if (components[i].shape()[0] != components[0].shape()[0]) {
        throw std::invalid_argument("from_tensor_slices: component 0 has " + str(components[0].shape()[0]) +
                                    " rows (shape " + shape_to_string(components[0].shape()) + "), component " +
                                    std::to_string(i) + " has " + str(components[i].shape()[0]) + " rows (shape " +
                                    shape_to_string(components[i].shape()) +
                                    "); every component needs the same first dimension");
      }
    }
    rows_ = components[0].shape()[0];
    components_ = std::make_shared<const std::vector<Tensor>>(std::move(components));
  }
  std::unique_ptr<IteratorImpl> make_iterator() const override {
    return std::make_unique<SlicesIterator>(components_, rows_);
  }
  std::int64_t cardinality() const override { return rows_; }

 private:
  Components components_;
  std::int64_t rows_ = 0;
};

class TensorsIterator final : public IteratorImpl {
 public:
  explicit TensorsIterator(Element element) : element_(std::move(element)) {}
  std::optional<Element> next() override {
    if (done_) return std::nullopt;
    done_ = true;
    return element_;
  }

 private:
  Element element_;
  bool done_ = false;
};

class TensorsDataset final : public DatasetImpl {
 public:
  explicit TensorsDataset(Element element) : element_(std::move(element)) {
    if (element_.empty()) throw std::invalid_argument("from_tensors: no components (expected at least one tensor)");
  }
  std::unique_ptr<IteratorImpl> make_iterator() const override { return std::make_unique<TensorsIterator>(element_); }
  std::int64_t cardinality() const override { return 1; }

 private:
  Element element_;
};

// ---- from_generator / from_generator_factory ----------------------------------------------------

using Generator = std::function<std::optional<Element>()>;

/// One callable shared by every pass; calls are serialised.
struct SharedGenerator {
  std::mutex mutex;
  Generator next;
};

class SharedGeneratorIterator final : public IteratorImpl {
 public:
  explicit SharedGeneratorIterator(std::shared_ptr<SharedGenerator> generator) : generator_(std::move(generator)) {}
  std::optional<Element> next() override {
    if (done_) return std::nullopt;
    std::optional<Element> out;
    {
      std::lock_guard<std::mutex> lock(generator_->mutex);
      out = generator_->next();
    }
    if (!out) done_ = true;
    return out;
  }

 private:
  std::shared_ptr<SharedGenerator> generator_;
  bool done_ = false;
};

class GeneratorDataset final : public DatasetImpl {
 public:
  GeneratorDataset(Generator next, std::int64_t cardinality)
      : generator_(std::make_shared<SharedGenerator>()), cardinality_(cardinality) {
    if (!next) throw std::invalid_argument("from_generator: the generator is empty (expected a callable)");
    check_cardinality_argument(cardinality, "from_generator");
    generator_->next = std::move(next);
  }
  std::unique_ptr<IteratorImpl> make_iterator() const override {
    return std::make_unique<SharedGeneratorIterator>(generator_);
  }
  std::int64_t cardinality() const override { return cardinality_; }

 private:
  std::shared_ptr<SharedGenerator> generator_;
  std::int64_t cardinality_;
};

class OwnGeneratorIterator final : public IteratorImpl {
 public:
  explicit OwnGeneratorIterator(Generator next) : next_(std::move(next)) {}
  std::optional<Element> next() override {
    if (done_) return std::nullopt;
    std::optional<Element> out = next_();
    if (!out) done_ = true;
    return out;
  }

 private:
  Generator next_;
  bool done_ = false;
};

class GeneratorFactoryDataset final : public DatasetImpl {
 public:
  GeneratorFactoryDataset(std::function<Generator()> make_next, std::int64_t cardinality)
      : make_next_(std::move(make_next)), cardinality_(cardinality) {
    if (!make_next_) {
      throw std::invalid_argument("from_generator_factory: the factory is empty (expected a callable)");
    }
    check_cardinality_argument(cardinality, "from_generator_factory");
  }
  std::unique_ptr<IteratorImpl> make_iterator() const override {
    Generator next = make_next_();
    if (!next) {
      throw std::invalid_argument("from_generator_factory: the factory returned an empty callable");
    }
    return std::make_unique<OwnGeneratorIterator>(std::move(next));
  }
  std::int64_t cardinality() const override { return cardinality_; }

 private:
  std::function<Generator()> make_next_;
  std::int64_t cardinality_;
};

// ---- batch ------------------------------------------------------------------------------------

class BatchIterator final : public IteratorImpl {
 public:
  BatchIterator(std::unique_ptr<IteratorImpl> input, std::int64_t n, bool drop_remainder)
      : input_(std::move(input)), n_(n), drop_remainder_(drop_remainder) {}
  std::optional<Element> next() override {
    if (done_) return std::nullopt;
    std::vector<Element> rows;
    rows.reserve(static_cast<std::size_t>(std::min<std::int64_t>(n_, 1024)));
    while (static_cast<std::int64_t>(rows.size()) < n_) {
      std::optional<Element> e = input_->next();
      if (!e) {
        done_ = true;
        input_.reset();
        break;
      }
      if (!rows.empty()) check_compatible(rows.front(), *e, rows.size());
      rows.push_back(std::move(*e));
    }
    if (rows.empty()) return std::nullopt;
    if (drop_remainder_ && static_cast<std::int64_t>(rows.size()) < n_) return std::nullopt;
    Element out;
    out.reserve(rows.front().size());
    std::vector<Tensor> parts(rows.size());
    for (std::size_t c = 0; c < rows.front().size(); ++c) {
      for (std::size_t r = 0; r < rows.size(); ++r) parts[r] = std::move(rows[r][c]);
      out.push_back(stack(parts));
    }
    return out;
  }

 private:
  static void check_compatible(const Element& first, const Element& e, std::size_t position) {
    if (e.size() != first.size()) {
      throw std::invalid_argument("batch: element " + std::to_string(position) + " of a batch has " +
                                  std::to_string(e.size()) + " components, element 0 has " +
                                  std::to_string(first.size()) + "; batched elements need the same components");
    }
    for (std::size_t c = 0; c < e.size(); ++c) {
      if (e[c].shape() != first[c].shape() || e[c].dtype() != first[c].dtype()) {
        throw std::invalid_argument("batch: component " + std::to_string(c) + " is " + describe(first[c]) +
                                    " in element 0 of a batch but " + describe(e[c]) + " in element " +
                                    std::to_string(position) +
                                    "; batched elements need one shape and dtype (map them to a common shape first)");
      }
    }
  }

  std::unique_ptr<IteratorImpl> input_;
  std::int64_t n_;
  bool drop_remainder_;
  bool done_ = false;
};

class BatchDataset final : public DatasetImpl {
 public:
  BatchDataset(DatasetPtr input, std::int64_t n, bool drop_remainder)
      : input_(std::move(input)), n_(n), drop_remainder_(drop_remainder) {}
  std::unique_ptr<IteratorImpl> make_iterator() const override {
    return std::make_unique<BatchIterator>(input_->make_iterator(), n_, drop_remainder_);
  }
  std::int64_t cardinality() const override {
    const std::int64_t c = input_->cardinality();
    if (!is_count(c)) return c;
    return drop_remainder_ ? c / n_ : c / n_ + (c % n_ != 0 ? 1 : 0);
  }

  std::optional<std::int64_t> batch_size() const override { return n_; }

  std::int64_t num_files() const override { return input_->num_files(); }
  DatasetPtr shard_files(std::int64_t num_shards, std::int64_t index) const override {
    return over_sharded_files<BatchDataset>(input_, num_shards, index, n_, drop_remainder_);
  }

 private:
  DatasetPtr input_;
  std::int64_t n_;
  bool drop_remainder_;
};

// ---- repeat -----------------------------------------------------------------------------------

class RepeatIterator final : public IteratorImpl {
 public:
  RepeatIterator(DatasetPtr input, std::int64_t count) : input_(std::move(input)), count_(count) {}
  std::optional<Element> next() override {
    while (!done_) {
      if (count_ >= 0 && pass_ >= count_) break;
      if (!current_) {
        current_ = input_->make_iterator();
        pass_produced_ = false;
      }
      std::optional<Element> e = current_->next();
      if (e) {
        pass_produced_ = true;
        return e;
      }
      current_.reset();
      ++pass_;
      // An empty pass would repeat into an endless loop of empty passes: the input is exhausted.
      if (!pass_produced_) break;
      throw_if_cancelled();
    }
    done_ = true;
    current_.reset();
    return std::nullopt;
  }

 private:
  DatasetPtr input_;
  std::int64_t count_;
  std::int64_t pass_ = 0;
  bool pass_produced_ = false;
  bool done_ = false;
  std::unique_ptr<IteratorImpl> current_;
};

class RepeatDataset final : public DatasetImpl {
 public:
  RepeatDataset(DatasetPtr input, std::int64_t count) : input_(std::move(input)), count_(count) {}
  std::unique_ptr<IteratorImpl> make_iterator() const override {
    return std::make_unique<RepeatIterator>(input_, count_);
  }
  std::int64_t cardinality() const override {
    // As tf.data: repeating forever is infinite unless the input is known to be empty.
    const std::int64_t c = input_->cardinality();
    if (count_ == 0 || c == 0) return 0;
    if (count_ < 0) return infinite_cardinality;
    if (!is_count(c)) return c;
    if (c > std::numeric_limits<std::int64_t>::max() / count_) return unknown_cardinality;
    return c * count_;
  }

  std::optional<std::int64_t> batch_size() const override { return input_->batch_size(); }

  std::int64_t num_files() const override { return input_->num_files(); }
  DatasetPtr shard_files(std::int64_t num_shards, std::int64_t index) const override {
    return over_sharded_files<RepeatDataset>(input_, num_shards, index, count_);
  }

 private:
  DatasetPtr input_;
  std::int64_t count_;
};

// ---- shuffle ----------------------------------------------------------------------------------

/// A uniform draw in [0, n) that does not depend on the standard library's distributions (which
/// differ between implementations), so a seed gives the same order everywhere.
std::size_t uniform_index(std::mt19937_64& rng, std::size_t n) {
  const std::uint64_t bound = n;
  const std::uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound: reject the biased low part
  std::uint64_t r = rng();
  while (r < threshold) r = rng();
  return static_cast<std::size_t>(r % bound);
}

class ShuffleIterator final : public IteratorImpl {
 public:
  ShuffleIterator(std::unique_ptr<IteratorImpl> input, std::size_t buffer_size, std::uint64_t seed, std::uint64_t pass)
      : input_(std::move(input)), buffer_size_(buffer_size) {
    // seed_seq and mt19937_64 are fully specified by the standard: the same on every platform.
    std::seed_seq seq{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                      static_cast<std::uint32_t>(pass), static_cast<std::uint32_t>(pass >> 32)};
    rng_.seed(seq);
  }
  std::optional<Element> next() override {
    while (input_ && buffer_.size() < buffer_size_) {
      std::optional<Element> e = input_->next();
      if (!e) {
        input_.reset();
        break;
      }
      buffer_.push_back(std::move(*e));
    }
    if (buffer_.empty()) return std::nullopt;
    const std::size_t i = uniform_index(rng_, buffer_.size());
    Element out = std::move(buffer_[i]);
    if (i + 1 != buffer_.size()) buffer_[i] = std::move(buffer_.back());
    buffer_.pop_back();
    return out;
  }

 private:
  std::unique_ptr<IteratorImpl> input_;  // null once exhausted
  std::size_t buffer_size_;
  std::vector<Element> buffer_;
  std::mt19937_64 rng_;
};

class ShuffleDataset final : public DatasetImpl {
 public:
  ShuffleDataset(DatasetPtr input, std::int64_t buffer_size, std::uint64_t seed)
      : input_(std::move(input)), buffer_size_(static_cast<std::size_t>(buffer_size)), seed_(seed) {}
  std::unique_ptr<IteratorImpl> make_iterator() const override {
    const std::uint64_t pass = passes_.fetch_add(1, std::memory_order_relaxed);
    return std::make_unique<ShuffleIterator>(input_->make_iterator(), buffer_size_, seed_, pass);
  }
  std::int64_t cardinality() const override { return input_->cardinality(); }

  std::optional<std::int64_t> batch_size() const override { return input_->batch_size(); }

  std::int64_t num_files() const override { return input_->num_files(); }
  DatasetPtr shard_files(std::int64_t num_shards, std::int64_t index) const override {
    return over_sharded_files<ShuffleDataset>(input_, num_shards, index, static_cast<std::int64_t>(buffer_size_), seed_);
  }

 private:
  DatasetPtr input_;
  std::size_t buffer_size_;
  std::uint64_t seed_;
  // Passes made so far: each pass (a new epoch under repeat, or a new loop) gets its own order,
  // as tf.data's reshuffle_each_iteration.
  mutable std::atomic<std::uint64_t> passes_{0};
};

// ---- map / filter -----------------------------------------------------------------------------

class MapIterator final : public IteratorImpl {
 public:
  MapIterator(std::unique_ptr<IteratorImpl> input, const std::function<Element(const Element&)>& fn)
      : input_(std::move(input)), fn_(fn) {}
  std::optional<Element> next() override {
    std::optional<Element> e = input_->next();
    if (!e) return std::nullopt;
    return fn_(*e);
  }

 private:
  std::unique_ptr<IteratorImpl> input_;
  std::function<Element(const Element&)> fn_;
};

class MapDataset final : public DatasetImpl {
 public:
  MapDataset(DatasetPtr input, std::function<Element(const Element&)> fn) : input_(std::move(input)), fn_(std::move(fn)) {
    if (!fn_) throw std::invalid_argument("map: the function is empty (expected a callable)");
  }
  std::unique_ptr<IteratorImpl> make_iterator() const override {
    return std::make_unique<MapIterator>(input_->make_iterator(), fn_);
  }
  std::int64_t cardinality() const override { return input_->cardinality(); }

  std::optional<std::int64_t> batch_size() const override { return input_->batch_size(); }

  std::int64_t num_files() const override { return input_->num_files(); }
  DatasetPtr shard_files(std::int64_t num_shards, std::int64_t index) const override {
    return over_sharded_files<MapDataset>(input_, num_shards, index, fn_);
  }

 private:
  DatasetPtr input_;
  std::function<Element(const Element&)> fn_;
};

class FilterIterator final : public IteratorImpl {
 public:
  FilterIterator(std::unique_ptr<IteratorImpl> input, const std::function<bool(const Element&)>& predicate)
      : input_(std::move(input)), predicate_(predicate) {}
  std::optional<Element> next() override {
    while (true) {
      std::optional<Element> e = input_->next();
      if (!e || predicate_(*e)) return e;
      throw_if_cancelled();
    }
  }

 private:
  std::unique_ptr<IteratorImpl> input_;
  std::function<bool(const Element&)> predicate_;
};

class FilterDataset final : public DatasetImpl {
 public:
  FilterDataset(DatasetPtr input, std::function<bool(const Element&)> predicate)
      : input_(std::move(input)), predicate_(std::move(predicate)) {
    if (!predicate_) throw std::invalid_argument("filter: the predicate is empty (expected a callable)");
  }
  std::unique_ptr<IteratorImpl> make_iterator() const override {
    return std::make_unique<FilterIterator>(input_->make_iterator(), predicate_);
  }
  std::int64_t cardinality() const override { return unknown_cardinality; }

  std::optional<std::int64_t> batch_size() const override { return input_->batch_size(); }

  std::int64_t num_files() const override { return input_->num_files(); }
  DatasetPtr shard_files(std::int64_t num_shards, std::int64_t index) const override {
    return over_sharded_files<FilterDataset>(input_, num_shards, index, predicate_);
  }

 private:
  DatasetPtr input_;
  std::function<bool(const Element&)> predicate_;
};

// ---- take / skip / shard ----------------------------------------------------------------------

class TakeIterator final : public IteratorImpl {
 public:
  TakeIterator(std::unique_ptr<IteratorImpl> input, std::int64_t n) : input_(std::move(input)), left_(n) {}
  std::optional<Element> next() override {
    if (!input_) return std::nullopt;
    std::optional<Element> e;
    if (left_ != 0) e = input_->next();
    if (!e) {
      input_.reset();  // stops a prefetching input early
      return std::nullopt;
    }
    if (left_ > 0) --left_;
    return e;
  }

 private:
  std::unique_ptr<IteratorImpl> input_;
  std::int64_t left_;  // -1: all
};

class TakeDataset final : public DatasetImpl {
 public:
  TakeDataset(DatasetPtr input, std::int64_t n) : input_(std::move(input)), n_(n) {}
  std::unique_ptr<IteratorImpl> make_iterator() const override {
    return std::make_unique<TakeIterator>(input_->make_iterator(), n_);
  }
  std::int64_t cardinality() const override {
    const std::int64_t c = input_->cardinality();
    if (n_ < 0) return c;
    if (c == infinite_cardinality) return n_;
    if (c == unknown_cardinality) return n_ == 0 ? 0 : unknown_cardinality;
    return std::min(c, n_);
  }

  std::optional<std::int64_t> batch_size() const override { return input_->batch_size(); }

  std::int64_t num_files() const override { return input_->num_files(); }
  DatasetPtr shard_files(std::int64_t num_shards, std::int64_t index) const override {
    return over_sharded_files<TakeDataset>(input_, num_shards, index, n_);
  }

 private:
  DatasetPtr input_;
  std::int64_t n_;
};

class SkipIterator final : public IteratorImpl {
 public:
  SkipIterator(std::unique_ptr<IteratorImpl> input, std::int64_t n) : input_(std::move(input)), to_skip_(n) {}
  std::optional<Element> next() override {
    while (to_skip_ != 0) {
      if (!input_->next()) {
        to_skip_ = 0;
        return std::nullopt;
      }
      if (to_skip_ > 0) --to_skip_;
      throw_if_cancelled();
    }
    return input_->next();
  }

 private:
  std::unique_ptr<IteratorImpl> input_;
  std::int64_t to_skip_;  // -1: all
};

class SkipDataset final : public DatasetImpl {
 public:
  SkipDataset(DatasetPtr input, std::int64_t n) : input_(std::move(input)), n_(n) {}
  std::unique_ptr<IteratorImpl> make_iterator() const override {
    return std::make_unique<SkipIterator>(input_->make_iterator(), n_);
  }
  std::int64_t cardinality() const override {
    const std::int64_t c = input_->cardinality();
    if (!is_count(c)) return c;
    if (n_ < 0) return 0;
    return std::max<std::int64_t>(0, c - n_);
  }

  std::optional<std::int64_t> batch_size() const override { return input_->batch_size(); }

  std::int64_t num_files() const override { return input_->num_files(); }
  DatasetPtr shard_files(std::int64_t num_shards, std::int64_t index) const override {
    return over_sharded_files<SkipDataset>(input_, num_shards, index, n_);
  }

 private:
  DatasetPtr input_;
  std::int64_t n_;
};

class ShardIterator final : public IteratorImpl {
 public:
  ShardIterator(std::unique_ptr<IteratorImpl> input, std::int64_t num_shards, std::int64_t index)
      : input_(std::move(input)), num_shards_(num_shards), index_(index) {}
  std::optional<Element> next() override {
    while (true) {
      std::optional<Element> e = input_->next();
      if (!e) return std::nullopt;
      const bool mine = position_ % num_shards_ == index_;
      ++position_;
      if (mine) return e;
      throw_if_cancelled();
    }
  }

 private:
  std::unique_ptr<IteratorImpl> input_;
  std::int64_t num_shards_, index_;
  std::int64_t position_ = 0;
};

class ShardDataset final : public DatasetImpl {
 public:
  ShardDataset(DatasetPtr input, std::int64_t num_shards, std::int64_t index)
      : input_(std::move(input)), num_shards_(num_shards), index_(index) {}
  std::unique_ptr<IteratorImpl> make_iterator() const override {
    return std::make_unique<ShardIterator>(input_->make_iterator(), num_shards_, index_);
  }
  std::int64_t cardinality() const override {
    const std::int64_t c = input_->cardinality();
    if (!is_count(c)) return c;
    return c / num_shards_ + (index_ < c % num_shards_ ? 1 : 0);
  }

  std::optional<std::int64_t> batch_size() const override { return input_->batch_size(); }

  std::int64_t num_files() const override { return input_->num_files(); }
  DatasetPtr shard_files(std::int64_t num_shards, std::int64_t index) const override {
    return over_sharded_files<ShardDataset>(input_, num_shards, index, num_shards_, index_);
  }

 private:
  DatasetPtr input_;
  std::int64_t num_shards_, index_;
};

// ---- prefetch ---------------------------------------------------------------------------------

/// Runs the input on a producer thread that keeps up to `capacity` results (elements or errors)
/// ready. The producer stops at the end of the input; the destructor stops it at any point.
class PrefetchIterator final : public IteratorImpl {
 public:
  PrefetchIterator(std::unique_ptr<IteratorImpl> input, std::size_t capacity)
      : input_(std::move(input)), capacity_(capacity) {
    producer_ = std::thread([this] { produce(); });
  }
  ~PrefetchIterator() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_.store(true, std::memory_order_relaxed);
    }
    not_full_.notify_all();
    producer_.join();
  }
  PrefetchIterator(const PrefetchIterator&) = delete;
  PrefetchIterator& operator=(const PrefetchIterator&) = delete;

  std::optional<Element> next() override {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto ready = [this] { return !buffer_.empty() || input_done_; };
    if (cancel_flag == nullptr) {
      not_empty_.wait(lock, ready);
    } else {
      // This consumer is itself the producer of an outer prefetch: wake up now and then to
      // notice that the outer one is being destroyed.
      while (!not_empty_.wait_for(lock, std::chrono::milliseconds(5), ready)) {
        lock.unlock();
        throw_if_cancelled();
        lock.lock();
      }
    }
    if (buffer_.empty()) return std::nullopt;
    Result result = std::move(buffer_.front());
    buffer_.pop_front();
    lock.unlock();
    not_full_.notify_one();
    if (result.error) std::rethrow_exception(result.error);
    return std::move(result.element);
  }

 private:
  struct Result {
    std::optional<Element> element;
    std::exception_ptr error;
  };

  void produce() {
    cancel_flag = &stop_;
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        not_full_.wait(lock, [this] { return stop_.load(std::memory_order_relaxed) || buffer_.size() < capacity_; });
        if (stop_.load(std::memory_order_relaxed)) return;
      }
      Result result;
      try {
        result.element = input_->next();
      } catch (const cancelled&) {
        return;
      } catch (...) {
        // Kept in order and handed to the consumer; the input may go on after an error, exactly
        // as it would without prefetch.
        result.error = std::current_exception();
      }
      const bool end = !result.element && !result.error;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (end) {
          input_done_ = true;
        } else {
          buffer_.push_back(std::move(result));
        }
      }
      not_empty_.notify_one();
      if (end) return;
    }
  }

  std::unique_ptr<IteratorImpl> input_;  // used by the producer thread only, until it is joined
  std::size_t capacity_;
  std::mutex mutex_;
  std::condition_variable not_empty_;
  std::condition_variable not_full_;
  std::deque<Result> buffer_;
  bool input_done_ = false;
  std::atomic<bool> stop_{false};
  std::thread producer_;  // last: started once everything above exists
};

class PrefetchDataset final : public DatasetImpl {
 public:
  PrefetchDataset(DatasetPtr input, std::int64_t n) : input_(std::move(input)), n_(static_cast<std::size_t>(n)) {}
  std::unique_ptr<IteratorImpl> make_iterator() const override {
    return std::make_unique<PrefetchIterator>(input_->make_iterator(), n_);
  }
  std::int64_t cardinality() const override { return input_->cardinality(); }

  std::optional<std::int64_t> batch_size() const override { return input_->batch_size(); }

  std::int64_t num_files() const override { return input_->num_files(); }
  DatasetPtr shard_files(std::int64_t num_shards, std::int64_t index) const override {
    return over_sharded_files<PrefetchDataset>(input_, num_shards, index, static_cast<std::int64_t>(n_));
  }

 private:
  DatasetPtr input_;
  std::size_t n_;
};

}  // namespace

// ---- Iterator ---------------------------------------------------------------------------------

Iterator::Iterator(std::unique_ptr<detail::IteratorImpl> impl) : impl_(std::move(impl)) {
  if (!impl_) throw std::invalid_argument("Iterator: null implementation (expected a pass from make_iterator)");
}

Element Iterator::get_next() {
  std::optional<Element> e = impl_->next();
  if (!e) {
    throw OutOfRange(
        "get_next: the end of the dataset was reached (use get_next_as_optional or a range-for to stop "
        "without an exception)");
  }
  return std::move(*e);
}

std::optional<Element> Iterator::get_next_as_optional() { return impl_->next(); }

// ---- Dataset ----------------------------------------------------------------------------------

Dataset::Dataset(std::shared_ptr<const detail::DatasetImpl> impl) : impl_(std::move(impl)) {
  if (!impl_) throw std::invalid_argument("Dataset: null implementation (expected a dataset node)");
}

Dataset Dataset::range(std::int64_t n) { return range(0, n, 1); }

Dataset Dataset::range(std::int64_t start, std::int64_t stop, std::int64_t step) {
  return Dataset(std::make_shared<RangeDataset>(start, stop, step));
}

Dataset Dataset::from_tensor_slices(std::vector<Tensor> components) {
  return Dataset(std::make_shared<SlicesDataset>(std::move(components)));
}

Dataset Dataset::from_tensors(std::vector<Tensor> components) {
  return Dataset(std::make_shared<TensorsDataset>(std::move(components)));
}

Dataset Dataset::from_generator(std::function<std::optional<Element>()> next, std::int64_t cardinality) {
  return Dataset(std::make_shared<GeneratorDataset>(std::move(next), cardinality));
}

Dataset Dataset::from_generator_factory(std::function<std::function<std::optional<Element>()>()> make_next,
                                        std::int64_t cardinality) {
  return Dataset(std::make_shared<GeneratorFactoryDataset>(std::move(make_next), cardinality));
}

Dataset Dataset::batch(std::int64_t n, bool drop_remainder) const {
  if (n < 1) throw std::invalid_argument("batch: batch size " + str(n) + " is not positive (expected n >= 1)");
  return Dataset(std::make_shared<BatchDataset>(impl_, n, drop_remainder));
}

Dataset Dataset::repeat(std::int64_t count) const {
  if (count < -1) {
    throw std::invalid_argument("repeat: count " + str(count) + " is not valid (expected a count >= 0, or -1 for forever)");
  }
  return Dataset(std::make_shared<RepeatDataset>(impl_, count));
}

Dataset Dataset::shuffle(std::int64_t buffer_size, std::uint64_t seed) const {
  if (buffer_size < 1) {
    throw std::invalid_argument("shuffle: buffer size " + str(buffer_size) + " is not positive (expected >= 1)");
  }
  return Dataset(std::make_shared<ShuffleDataset>(impl_, buffer_size, seed));
}

Dataset Dataset::map(std::function<Element(const Element&)> fn) const {
  return Dataset(std::make_shared<MapDataset>(impl_, std::move(fn)));
}

Dataset Dataset::filter(std::function<bool(const Element&)> predicate) const {
  return Dataset(std::make_shared<FilterDataset>(impl_, std::move(predicate)));
}

Dataset Dataset::take(std::int64_t n) const {
  if (n < -1) throw std::invalid_argument("take: count " + str(n) + " is not valid (expected a count >= 0, or -1 for all)");
  return Dataset(std::make_shared<TakeDataset>(impl_, n));
}

Dataset Dataset::skip(std::int64_t n) const {
  if (n < -1) throw std::invalid_argument("skip: count " + str(n) + " is not valid (expected a count >= 0, or -1 for all)");
  return Dataset(std::make_shared<SkipDataset>(impl_, n));
}

Dataset Dataset::shard(std::int64_t num_shards, std::int64_t index) const {
  if (num_shards < 1) {
    throw std::invalid_argument("shard: num_shards " + str(num_shards) + " is not positive (expected >= 1)");
  }
  if (index < 0 || index >= num_shards) {
    throw std::invalid_argument("shard: index " + str(index) + " out of range for " + str(num_shards) +
                                " shards (expected 0.." + str(num_shards - 1) + ")");
  }
  return Dataset(std::make_shared<ShardDataset>(impl_, num_shards, index));
}

Dataset Dataset::prefetch(std::int64_t n) const {
  if (n < 1) throw std::invalid_argument("prefetch: buffer size " + str(n) + " is not positive (expected >= 1)");
  return Dataset(std::make_shared<PrefetchDataset>(impl_, n));
}

std::int64_t Dataset::cardinality() const { return impl_->cardinality(); }

Iterator Dataset::make_iterator() const { return Iterator(impl_->make_iterator()); }

Dataset::const_iterator::const_iterator(std::shared_ptr<detail::IteratorImpl> impl) : impl_(std::move(impl)) {
  if (impl_) ++*this;
}

Dataset::const_iterator& Dataset::const_iterator::operator++() {
  current_.reset();  // the previous element's tensors are released before the next is made
  if (impl_) current_ = impl_->next();
  if (!current_) impl_.reset();  // the pass is over: stop a prefetching producer now
  return *this;
}

Dataset::const_iterator Dataset::begin() const {
  return const_iterator(std::shared_ptr<detail::IteratorImpl>(impl_->make_iterator()));
}

}  // namespace troupe::data
