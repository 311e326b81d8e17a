#pragma once

#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

#include "troupe/tensor.hpp"

namespace troupe::data {

/// One element of a dataset: one or more components (features, labels...).
using Element = std::vector<Tensor>;

/// Cardinality values that are not counts.
inline constexpr std::int64_t infinite_cardinality = -1;
inline constexpr std::int64_t unknown_cardinality = -2;

namespace detail {

/// A pass over a dataset. next() returns the following element, or nullopt at the end (and
/// keeps returning nullopt); errors raised by user functions or files propagate from next().
class IteratorImpl {
 public:
  virtual ~IteratorImpl() = default;
  virtual std::optional<Element> next() = 0;
};

/// A node of a dataset's graph: makes independent passes over its elements.
class DatasetImpl {
 public:
  virtual ~DatasetImpl() = default;
  virtual std::unique_ptr<IteratorImpl> make_iterator() const = 0;
  /// A count, infinite_cardinality or unknown_cardinality.
  virtual std::int64_t cardinality() const = 0;
  /// The batch size of the last batch() upstream whose batches pass through unchanged (through
  /// repeat, take, skip, shard, shuffle, filter and prefetch), if known: how a distributed
  /// dataset splits a last partial batch.
  virtual std::optional<std::int64_t> batch_size() const { return std::nullopt; }
  /// The files read by a file-based source upstream (files_dataset), through every operator; 0
  /// when no source reads files.
  virtual std::int64_t num_files() const { return 0; }
  /// This graph with that source reading only its files index, index + num_shards, ... (what
  /// AutoShardPolicy::file gives each worker); nullptr when num_files() is 0.
  virtual std::shared_ptr<const DatasetImpl> shard_files(std::int64_t num_shards, std::int64_t index) const {
    (void)num_shards;
    (void)index;
    return nullptr;
  }
  /// Sets every shuffle upstream back to its first pass, as in a graph just built: the next
  /// iterator gives the orders of the first pass again (reshuffle_each_iteration counts passes
  /// per dataset). For a position taken up again in a process that iterated the graph already.
  virtual void rewind() const {}
};

}  // namespace detail

/// One pass over a Dataset (tf.data's iterator).
class Iterator {
 public:
  explicit Iterator(std::unique_ptr<detail::IteratorImpl> impl);
  /// The next element; at the end troupe::OutOfRange.
  Element get_next();
  /// The next element, or nullopt at the end.
  std::optional<Element> get_next_as_optional();

 private:
  std::unique_ptr<detail::IteratorImpl> impl_;
};

/// An immutable, composable sequence of elements (tf.data.Dataset). Operators return new
/// datasets and leave this one unchanged; each iteration is an independent pass.
class Dataset {
 public:
  /// Scalar i64 elements 0..n-1.
  static Dataset range(std::int64_t n);
  /// start, start+step, ... up to (excluding) stop; step may be negative, not zero.
  static Dataset range(std::int64_t start, std::int64_t stop, std::int64_t step = 1);
  /// Slices every component along axis 0; all components need the same first dimension.
  static Dataset from_tensor_slices(std::vector<Tensor> components);
  /// A single element holding `components`.
  static Dataset from_tensors(std::vector<Tensor> components);
  /// Elements from a callable, until it returns nullopt. It is called from the iterating thread;
  /// every pass shares the one callable (a second pass continues where the first stopped), and
  /// concurrent passes are serialised.
  static Dataset from_generator(std::function<std::optional<Element>()> next,
                                std::int64_t cardinality = unknown_cardinality);
  /// Like from_generator, but every pass calls make_next() for a fresh callable, so the dataset
  /// can be repeated and iterated several times.
  static Dataset from_generator_factory(std::function<std::function<std::optional<Element>()>()> make_next,
                                        std::int64_t cardinality = unknown_cardinality);
  /// A dataset built on a node of one's own.
  explicit Dataset(std::shared_ptr<const detail::DatasetImpl> impl);

  /// Groups n consecutive elements, stacking each component along a new axis 0; the last
  /// smaller batch is kept unless drop_remainder.
  Dataset batch(std::int64_t n, bool drop_remainder = false) const;
  /// Repeats the dataset `count` times; -1 repeats forever.
  Dataset repeat(std::int64_t count = -1) const;
  /// Fills a buffer of buffer_size elements and draws from it at random; the same seed gives the
  /// same order, and each pass over the dataset draws a new order from that seed.
  Dataset shuffle(std::int64_t buffer_size, std::uint64_t seed) const;
  /// Applies fn to every element; what fn throws reaches the caller of next() unchanged.
  Dataset map(std::function<Element(const Element&)> fn) const;
  /// Keeps the elements for which predicate is true (cardinality becomes unknown).
  Dataset filter(std::function<bool(const Element&)> predicate) const;
  /// The first n elements; -1 takes all, as tf.data.
  Dataset take(std::int64_t n) const;
  /// All but the first n elements; -1 skips all, as tf.data.
  Dataset skip(std::int64_t n) const;
  /// Every num_shards-th element starting at index.
  Dataset shard(std::int64_t num_shards, std::int64_t index) const;
  /// Produces up to n elements ahead of the consumer on a background thread (which then runs the
  /// upstream functions). Upstream errors are rethrown by next() in order; destroying the
  /// iterator stops and joins the thread.
  Dataset prefetch(std::int64_t n) const;

  /// A count, infinite_cardinality (-1) or unknown_cardinality (-2).
  std::int64_t cardinality() const;
  /// A new pass over the elements.
  Iterator make_iterator() const;

  /// Range-for support: for (const Element& e : dataset).
  class const_iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Element;
    using difference_type = std::ptrdiff_t;
    using pointer = const Element*;
    using reference = const Element&;
    const_iterator() = default;
    explicit const_iterator(std::shared_ptr<detail::IteratorImpl> impl);
    reference operator*() const { return *current_; }
    pointer operator->() const { return &*current_; }
    const_iterator& operator++();
    friend bool operator==(const const_iterator& a, const const_iterator& b) {
      return !a.current_ && !b.current_;
    }
    friend bool operator!=(const const_iterator& a, const const_iterator& b) { return !(a == b); }

   private:
    std::shared_ptr<detail::IteratorImpl> impl_;
    std::optional<Element> current_;
  };
  const_iterator begin() const;
  const_iterator end() const { return const_iterator(); }

  const std::shared_ptr<const detail::DatasetImpl>& impl() const noexcept { return impl_; }

 private:
  std::shared_ptr<const detail::DatasetImpl> impl_;
};

}  // namespace troupe::data
