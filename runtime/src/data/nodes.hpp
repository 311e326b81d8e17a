#pragma once
// What the dataset nodes share: the node interfaces' short names, the cancellation of prefetch
// producers, cardinality arithmetic, the messages' helpers, and one factory per node. The nodes
// live in three files: sources (range, slices, tensors, generators), transforms (batch, repeat,
// shuffle, map, filter, take, skip, shard) and prefetch; dataset.cpp holds the public Dataset.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/data/dataset.hpp"

namespace troupe::data::nodes {

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

inline thread_local const std::atomic<bool>* cancel_flag = nullptr;

/// Not a std::exception, so that nothing between the throw and the producer's catch mistakes it
/// for an error to report.
struct cancelled {};

inline void throw_if_cancelled() {
  if (cancel_flag != nullptr && cancel_flag->load(std::memory_order_relaxed)) throw cancelled{};
}

inline std::string str(std::int64_t v) { return std::to_string(v); }

inline std::string describe(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + " " + shape_to_string(t.shape());
}

// Cardinality arithmetic. Counts are non-negative; -1 and -2 are the two special values.
inline bool is_count(std::int64_t c) { return c >= 0; }

void check_cardinality_argument(std::int64_t c, const char* op);

// ---- The nodes (arguments checked by Dataset's methods) ----------------------------------------

DatasetPtr make_range(std::int64_t start, std::int64_t stop, std::int64_t step);
DatasetPtr make_slices(std::vector<Tensor> components);
DatasetPtr make_tensors(std::vector<Tensor> components);
DatasetPtr make_generator(std::function<std::optional<Element>()> next, std::int64_t cardinality);
DatasetPtr make_generator_factory(std::function<std::function<std::optional<Element>()>()> make_next,
                                  std::int64_t cardinality);

DatasetPtr make_batch(DatasetPtr input, std::int64_t n, bool drop_remainder);
DatasetPtr make_repeat(DatasetPtr input, std::int64_t count);
DatasetPtr make_shuffle(DatasetPtr input, std::int64_t buffer_size, std::uint64_t seed);
DatasetPtr make_map(DatasetPtr input, std::function<Element(const Element&)> fn);
DatasetPtr make_filter(DatasetPtr input, std::function<bool(const Element&)> predicate);
DatasetPtr make_take(DatasetPtr input, std::int64_t n);
DatasetPtr make_skip(DatasetPtr input, std::int64_t n);
DatasetPtr make_shard(DatasetPtr input, std::int64_t num_shards, std::int64_t index);

DatasetPtr make_prefetch(DatasetPtr input, std::int64_t n);

}  // namespace troupe::data::nodes
