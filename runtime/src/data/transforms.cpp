// The datasets that transform their input: batch, repeat, shuffle, map, filter, take, skip, shard.
#include "data/nodes.hpp"

#include <algorithm>
#include <atomic>
#include <limits>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "storage.hpp"
#include "troupe/errors.hpp"

namespace troupe::data::nodes {

namespace {

// ---- batch ------------------------------------------------------------------------------------

class BatchIterator final : public IteratorImpl {
 public:
  BatchIterator(std::unique_ptr<IteratorImpl> input, std::int64_t n, bool drop_remainder)
      : input_(std::move(input)), n_(n), drop_remainder_(drop_remainder) {}
  std::optional<Element> next() override {
    if (done_) return std::nullopt;
    std::vector<Element> rows;
    std::size_t held = 0;
    try {
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
        held = rows.size();
      }
    } catch (const std::bad_alloc& e) {
      // A batch far larger than memory fills it with its elements before one tensor is made:
      // named, with what the elements held, once they are let go of.
      std::vector<Element>().swap(rows);
      const std::string tensor = dynamic_cast<const troupe::detail::named_bad_alloc*>(&e) != nullptr ? e.what() : "";
      throw troupe::detail::named_bad_alloc("batch of " + std::to_string(n_) + " elements: out of memory after " +
                                    std::to_string(held) + " of them" + (tensor.empty() ? "" : " (" + tensor + ")") +
                                    "; a smaller batch needs less");
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

  void rewind() const override { input_->rewind(); }

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

  void rewind() const override { input_->rewind(); }

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

  void rewind() const override {
    passes_ = 0;
    input_->rewind();
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

  void rewind() const override { input_->rewind(); }

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

  void rewind() const override { input_->rewind(); }

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

  void rewind() const override { input_->rewind(); }

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

  void rewind() const override { input_->rewind(); }

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

  void rewind() const override { input_->rewind(); }

 private:
  DatasetPtr input_;
  std::int64_t num_shards_, index_;
};

}  // namespace

DatasetPtr make_batch(DatasetPtr input, std::int64_t n, bool drop_remainder) {
  return std::make_shared<BatchDataset>(std::move(input), n, drop_remainder);
}

DatasetPtr make_repeat(DatasetPtr input, std::int64_t count) {
  return std::make_shared<RepeatDataset>(std::move(input), count);
}

DatasetPtr make_shuffle(DatasetPtr input, std::int64_t buffer_size, std::uint64_t seed) {
  return std::make_shared<ShuffleDataset>(std::move(input), buffer_size, seed);
}

DatasetPtr make_map(DatasetPtr input, std::function<Element(const Element&)> fn) {
  return std::make_shared<MapDataset>(std::move(input), std::move(fn));
}

DatasetPtr make_filter(DatasetPtr input, std::function<bool(const Element&)> predicate) {
  return std::make_shared<FilterDataset>(std::move(input), std::move(predicate));
}

DatasetPtr make_take(DatasetPtr input, std::int64_t n) { return std::make_shared<TakeDataset>(std::move(input), n); }

DatasetPtr make_skip(DatasetPtr input, std::int64_t n) { return std::make_shared<SkipDataset>(std::move(input), n); }

DatasetPtr make_shard(DatasetPtr input, std::int64_t num_shards, std::int64_t index) {
  return std::make_shared<ShardDataset>(std::move(input), num_shards, index);
}

}  // namespace troupe::data::nodes
