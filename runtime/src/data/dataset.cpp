#include "troupe/data/dataset.hpp"

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "data/nodes.hpp"
#include "troupe/errors.hpp"

namespace troupe::data {

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
  return Dataset(nodes::make_range(start, stop, step));
}

Dataset Dataset::from_tensor_slices(std::vector<Tensor> components) {
  return Dataset(nodes::make_slices(std::move(components)));
}

Dataset Dataset::from_tensors(std::vector<Tensor> components) {
  return Dataset(nodes::make_tensors(std::move(components)));
}

Dataset Dataset::from_generator(std::function<std::optional<Element>()> next, std::int64_t cardinality) {
  return Dataset(nodes::make_generator(std::move(next), cardinality));
}

Dataset Dataset::from_generator_factory(std::function<std::function<std::optional<Element>()>()> make_next,
                                        std::int64_t cardinality) {
  return Dataset(nodes::make_generator_factory(std::move(make_next), cardinality));
}

Dataset Dataset::batch(std::int64_t n, bool drop_remainder) const {
  if (n < 1) throw std::invalid_argument("batch: batch size " + nodes::str(n) + " is not positive (expected n >= 1)");
  return Dataset(nodes::make_batch(impl_, n, drop_remainder));
}

Dataset Dataset::repeat(std::int64_t count) const {
  if (count < -1) {
    throw std::invalid_argument("repeat: count " + nodes::str(count) + " is not valid (expected a count >= 0, or -1 for forever)");
  }
  return Dataset(nodes::make_repeat(impl_, count));
}

Dataset Dataset::shuffle(std::int64_t buffer_size, std::uint64_t seed) const {
  if (buffer_size < 1) {
    throw std::invalid_argument("shuffle: buffer size " + nodes::str(buffer_size) + " is not positive (expected >= 1)");
  }
  return Dataset(nodes::make_shuffle(impl_, buffer_size, seed));
}

Dataset Dataset::map(std::function<Element(const Element&)> fn) const {
  return Dataset(nodes::make_map(impl_, std::move(fn)));
}

Dataset Dataset::filter(std::function<bool(const Element&)> predicate) const {
  return Dataset(nodes::make_filter(impl_, std::move(predicate)));
}

Dataset Dataset::take(std::int64_t n) const {
  if (n < -1) throw std::invalid_argument("take: count " + nodes::str(n) + " is not valid (expected a count >= 0, or -1 for all)");
  return Dataset(nodes::make_take(impl_, n));
}

Dataset Dataset::skip(std::int64_t n) const {
  if (n < -1) throw std::invalid_argument("skip: count " + nodes::str(n) + " is not valid (expected a count >= 0, or -1 for all)");
  return Dataset(nodes::make_skip(impl_, n));
}

Dataset Dataset::shard(std::int64_t num_shards, std::int64_t index) const {
  if (num_shards < 1) {
    throw std::invalid_argument("shard: num_shards " + nodes::str(num_shards) + " is not positive (expected >= 1)");
  }
  if (index < 0 || index >= num_shards) {
    throw std::invalid_argument("shard: index " + nodes::str(index) + " out of range for " + nodes::str(num_shards) +
                                " shards (expected 0.." + nodes::str(num_shards - 1) + ")");
  }
  return Dataset(nodes::make_shard(impl_, num_shards, index));
}

Dataset Dataset::prefetch(std::int64_t n) const {
  if (n < 1) throw std::invalid_argument("prefetch: buffer size " + nodes::str(n) + " is not positive (expected >= 1)");
  return Dataset(nodes::make_prefetch(impl_, n));
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
