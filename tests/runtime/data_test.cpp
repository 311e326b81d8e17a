#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test_util.hpp"
#include "troupe/data/dataset.hpp"
#include "troupe/errors.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::data;
using troupe::testing::contains;
using troupe::testing::message_of;

namespace {

using Ints = std::vector<std::int64_t>;

/// The scalar i64 first components of every element of one pass.
Ints scalars(const Dataset& ds) {
  Ints out;
  for (const Element& e : ds) out.push_back(e.at(0).item<std::int64_t>());
  return out;
}

/// The first component of every element of one pass, as i64 vectors.
std::vector<Ints> vectors(const Dataset& ds) {
  std::vector<Ints> out;
  for (const Element& e : ds) out.push_back(e.at(0).to_vector<std::int64_t>());
  return out;
}

Ints iota(std::int64_t begin, std::int64_t end) {
  Ints out;
  for (std::int64_t i = begin; i < end; ++i) out.push_back(i);
  return out;
}

/// An exception type of the test's own, to check that user errors arrive unchanged.
struct user_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A generator of scalar i64 elements begin..end-1 with its own position.
std::function<std::optional<Element>()> counter(std::int64_t begin, std::int64_t end) {
  auto next = std::make_shared<std::int64_t>(begin);
  return [next, end]() -> std::optional<Element> {
    if (*next >= end) return std::nullopt;
    return Element{Tensor::scalar<std::int64_t>((*next)++)};
  };
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE("range yields scalar int64 elements 0..n-1") {
  Dataset ds = Dataset::range(5);
  CHECK(scalars(ds) == Ints{0, 1, 2, 3, 4});
  for (const Element& e : ds) {
    REQUIRE(e.size() == 1);
    CHECK(e[0].dtype() == DType::i64);
    CHECK(e[0].rank() == 0);
  }
  CHECK(ds.cardinality() == 5);
  CHECK(scalars(Dataset::range(0)).empty());
  CHECK(scalars(Dataset::range(-3)).empty());
  CHECK(Dataset::range(-3).cardinality() == 0);
}

TEST_CASE("range with start, stop and step counts up or down and rejects step 0") {
  CHECK(scalars(Dataset::range(2, 11, 3)) == Ints{2, 5, 8});
  CHECK(Dataset::range(2, 11, 3).cardinality() == 3);
  CHECK(scalars(Dataset::range(5, 0, -2)) == Ints{5, 3, 1});
  CHECK(Dataset::range(5, 0, -2).cardinality() == 3);
  CHECK(scalars(Dataset::range(3, 3)).empty());
  CHECK(scalars(Dataset::range(0, 5, -1)).empty());
  CHECK_THROWS_AS(Dataset::range(0, 5, 0), std::invalid_argument);
  CHECK(contains(message_of([] { Dataset::range(0, 5, 0); }), "step 0"));
}

TEST_CASE("range(4).batch(2) gives [0, 1] then [2, 3]") {
  Dataset ds = Dataset::range(4).batch(2);
  std::vector<Tensor> batches;
  for (const Element& e : ds) batches.push_back(e.at(0));
  REQUIRE(batches.size() == 2);
  CHECK(batches[0].shape() == Shape{2});
  CHECK(batches[0].dtype() == DType::i64);
  CHECK(batches[0].to_vector<std::int64_t>() == Ints{0, 1});
  CHECK(batches[1].to_vector<std::int64_t>() == Ints{2, 3});
}

TEST_CASE("batch keeps the smaller last batch unless drop_remainder") {
  CHECK(vectors(Dataset::range(10).batch(3)) == std::vector<Ints>{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9}});
  CHECK(vectors(Dataset::range(10).batch(3, true)) == std::vector<Ints>{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}});
  CHECK(vectors(Dataset::range(2).batch(3, true)).empty());
  CHECK(vectors(Dataset::range(2).batch(3)) == std::vector<Ints>{{0, 1}});
  CHECK(vectors(Dataset::range(0).batch(3)).empty());
}

TEST_CASE("batch stacks every component along a new axis 0") {
  Tensor features = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  Tensor labels = Tensor::from_vector<std::int32_t>({10, 11, 12, 13});
  std::vector<Element> out;
  for (const Element& e : Dataset::from_tensor_slices({features, labels}).batch(3)) out.push_back(e);
  REQUIRE(out.size() == 2);
  REQUIRE(out[0].size() == 2);
  CHECK(out[0][0].shape() == Shape{3, 2});
  CHECK(out[0][0].to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(out[0][1].shape() == Shape{3});
  CHECK(out[0][1].to_vector<std::int32_t>() == std::vector<std::int32_t>{10, 11, 12});
  CHECK(out[1][0].shape() == Shape{1, 2});
  CHECK(out[1][0].to_vector<float>() == std::vector<float>{7, 8});
  CHECK(out[1][1].to_vector<std::int32_t>() == std::vector<std::int32_t>{13});
}

TEST_CASE("batch rejects a size below 1") {
  CHECK_THROWS_AS(Dataset::range(4).batch(0), std::invalid_argument);
  CHECK_THROWS_AS(Dataset::range(4).batch(-2), std::invalid_argument);
  CHECK(contains(message_of([] { Dataset::range(4).batch(0); }), "batch size 0"));
}

TEST_CASE("batch of elements whose shapes differ names both shapes") {
  Dataset ragged = Dataset::range(1, 4).map([](const Element& e) {
    return Element{Tensor::range(e[0].item<std::int64_t>())};
  });
  Iterator it = ragged.batch(2).make_iterator();
  std::string msg = message_of([&] { it.get_next(); });
  CHECK(contains(msg, "batch"));
  CHECK(contains(msg, "[1]"));
  CHECK(contains(msg, "[2]"));
  CHECK_THROWS_AS(Dataset::range(1, 4).map([](const Element& e) { return Element{Tensor::range(e[0].item<std::int64_t>())}; })
                      .batch(2)
                      .make_iterator()
                      .get_next(),
                  std::invalid_argument);
}

TEST_CASE("from_tensor_slices slices every component along axis 0 without copying") {
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor y = Tensor::from_vector<std::int64_t>({7, 8, 9});
  Dataset ds = Dataset::from_tensor_slices({x, y});
  CHECK(ds.cardinality() == 3);
  std::vector<Element> out;
  for (const Element& e : ds) out.push_back(e);
  REQUIRE(out.size() == 3);
  CHECK(out[1][0].shape() == Shape{2});
  CHECK(out[1][0].to_vector<float>() == std::vector<float>{3, 4});
  CHECK(out[1][1].rank() == 0);
  CHECK(out[1][1].item<std::int64_t>() == 8);
  CHECK(out[2][0].shares_storage_with(x));
  CHECK(out[2][1].shares_storage_with(y));
}

TEST_CASE("from_tensor_slices with different first dimensions names both") {
  Tensor a = Tensor::zeros({4, 2});
  Tensor b = Tensor::zeros({3});
  std::string msg = message_of([&] { Dataset::from_tensor_slices({a, b}); });
  CHECK(contains(msg, "from_tensor_slices"));
  CHECK(contains(msg, "[4, 2]"));
  CHECK(contains(msg, "[3]"));
  CHECK_THROWS_AS(Dataset::from_tensor_slices({a, b}), std::invalid_argument);
  CHECK_THROWS_AS(Dataset::from_tensor_slices({Tensor::scalar<float>(1.0f)}), std::invalid_argument);
  CHECK_THROWS_AS(Dataset::from_tensor_slices({}), std::invalid_argument);
}

TEST_CASE("from_tensors yields the components as one element") {
  Tensor x = Tensor::from_vector<float>({1, 2, 3});
  Dataset ds = Dataset::from_tensors({x, Tensor::scalar<std::int32_t>(5)});
  CHECK(ds.cardinality() == 1);
  std::vector<Element> out;
  for (const Element& e : ds) out.push_back(e);
  REQUIRE(out.size() == 1);
  CHECK(out[0][0].equals(x));
  CHECK(out[0][1].item<std::int32_t>() == 5);
  CHECK(scalars(Dataset::from_tensors({Tensor::scalar<std::int64_t>(9)}).repeat(3)) == Ints{9, 9, 9});
}

TEST_CASE("repeat repeats count times, repeat(0) is empty and repeat(-1) goes on forever") {
  CHECK(scalars(Dataset::range(3).repeat(2)) == Ints{0, 1, 2, 0, 1, 2});
  CHECK(scalars(Dataset::range(3).repeat(1)) == Ints{0, 1, 2});
  CHECK(scalars(Dataset::range(3).repeat(0)).empty());
  CHECK(scalars(Dataset::range(3).repeat().take(8)) == Ints{0, 1, 2, 0, 1, 2, 0, 1});
  CHECK(scalars(Dataset::range(3).repeat(-1).take(4)) == Ints{0, 1, 2, 0});
  CHECK_THROWS_AS(Dataset::range(3).repeat(-2), std::invalid_argument);
}

TEST_CASE("repeating an empty dataset forever ends instead of hanging") {
  CHECK(scalars(Dataset::range(0).repeat()).empty());
  CHECK(scalars(Dataset::range(5).filter([](const Element&) { return false; }).repeat()).empty());
}

TEST_CASE("shuffle with one seed gives the same permutation twice") {
  const Ints first = scalars(Dataset::range(50).shuffle(50, 42));
  const Ints again = scalars(Dataset::range(50).shuffle(50, 42));
  CHECK(first == again);
  Ints sorted = first;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == iota(0, 50));
  CHECK(first != iota(0, 50));
  CHECK(scalars(Dataset::range(50).shuffle(50, 7)) != first);
  CHECK(Dataset::range(50).shuffle(50, 42).cardinality() == 50);
}

TEST_CASE("shuffle draws a new order on each pass, derived from the seed") {
  Dataset a = Dataset::range(30).shuffle(30, 5);
  Dataset b = Dataset::range(30).shuffle(30, 5);
  const Ints a1 = scalars(a), a2 = scalars(a);
  const Ints b1 = scalars(b), b2 = scalars(b);
  CHECK(a1 != a2);
  CHECK(a1 == b1);
  CHECK(a2 == b2);

  // Under repeat each epoch is a pass: a different permutation per epoch, the same every run.
  const Ints epochs = scalars(Dataset::range(30).shuffle(30, 5).repeat(2));
  REQUIRE(epochs.size() == 60);
  const Ints e1(epochs.begin(), epochs.begin() + 30), e2(epochs.begin() + 30, epochs.end());
  CHECK(e1 == a1);
  CHECK(e2 == a2);
  Ints sorted = e2;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == iota(0, 30));
}

TEST_CASE("shuffle with a small buffer only moves elements within its window") {
  CHECK(scalars(Dataset::range(20).shuffle(1, 3)) == iota(0, 20));
  const Ints out = scalars(Dataset::range(100).shuffle(4, 11));
  REQUIRE(out.size() == 100);
  // With a buffer of 4, output position i can only hold one of the first i + 4 elements.
  for (std::size_t i = 0; i < out.size(); ++i) CHECK(out[i] < static_cast<std::int64_t>(i) + 4);
  Ints sorted = out;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == iota(0, 100));
  CHECK_THROWS_AS(Dataset::range(3).shuffle(0, 1), std::invalid_argument);
}

TEST_CASE("shard takes every num_shards-th element starting at index") {
  CHECK(scalars(Dataset::range(10).shard(3, 0)) == Ints{0, 3, 6, 9});
  CHECK(scalars(Dataset::range(10).shard(3, 1)) == Ints{1, 4, 7});
  CHECK(scalars(Dataset::range(10).shard(3, 2)) == Ints{2, 5, 8});
  CHECK(scalars(Dataset::range(10).shard(1, 0)) == iota(0, 10));
  CHECK(scalars(Dataset::range(2).shard(4, 3)).empty());
}

TEST_CASE("shard with a bad count or index says what is expected") {
  CHECK_THROWS_AS(Dataset::range(10).shard(0, 0), std::invalid_argument);
  CHECK_THROWS_AS(Dataset::range(10).shard(3, 3), std::invalid_argument);
  CHECK_THROWS_AS(Dataset::range(10).shard(3, -1), std::invalid_argument);
  std::string msg = message_of([] { Dataset::range(10).shard(3, 3); });
  CHECK(contains(msg, "index 3"));
  CHECK(contains(msg, "0..2"));
  CHECK(contains(message_of([] { Dataset::range(10).shard(0, 0); }), "num_shards 0"));
}

TEST_CASE("take keeps the first n elements and skip drops them") {
  CHECK(scalars(Dataset::range(10).take(3)) == Ints{0, 1, 2});
  CHECK(scalars(Dataset::range(10).take(0)).empty());
  CHECK(scalars(Dataset::range(3).take(10)) == Ints{0, 1, 2});
  CHECK(scalars(Dataset::range(4).take(-1)) == Ints{0, 1, 2, 3});
  CHECK(scalars(Dataset::range(10).skip(7)) == Ints{7, 8, 9});
  CHECK(scalars(Dataset::range(10).skip(0)) == iota(0, 10));
  CHECK(scalars(Dataset::range(3).skip(10)).empty());
  CHECK(scalars(Dataset::range(3).skip(-1)).empty());
  CHECK(scalars(Dataset::range(10).skip(2).take(3)) == Ints{2, 3, 4});
  CHECK_THROWS_AS(Dataset::range(3).take(-2), std::invalid_argument);
  CHECK_THROWS_AS(Dataset::range(3).skip(-2), std::invalid_argument);
}

TEST_CASE("filter keeps the elements the predicate accepts") {
  Dataset even = Dataset::range(10).filter([](const Element& e) { return e[0].item<std::int64_t>() % 2 == 0; });
  CHECK(scalars(even) == Ints{0, 2, 4, 6, 8});
  CHECK(scalars(Dataset::range(10).filter([](const Element&) { return false; })).empty());
}

TEST_CASE("map transforms every element and may change its components") {
  Dataset squared = Dataset::range(4).map([](const Element& e) { return Element{e[0] * e[0]}; });
  CHECK(scalars(squared) == Ints{0, 1, 4, 9});
  Dataset pairs = Dataset::range(3).map([](const Element& e) { return Element{e[0], e[0].cast(DType::f32) * 0.5}; });
  std::vector<float> halves;
  for (const Element& e : pairs) {
    REQUIRE(e.size() == 2);
    halves.push_back(e[1].item<float>());
  }
  CHECK(halves == std::vector<float>{0.0f, 0.5f, 1.0f});
}

TEST_CASE("errors thrown by map, filter and generators reach the caller unchanged") {
  auto failing_map = Dataset::range(5).map([](const Element& e) -> Element {
    if (e[0].item<std::int64_t>() == 2) throw user_error("map failed at 2");
    return e;
  });
  Iterator it = failing_map.make_iterator();
  CHECK(it.get_next()[0].item<std::int64_t>() == 0);
  CHECK(it.get_next()[0].item<std::int64_t>() == 1);
  CHECK_THROWS_WITH_AS(it.get_next(), "map failed at 2", user_error);

  auto failing_filter = Dataset::range(5).filter([](const Element&) -> bool { throw user_error("filter failed"); });
  CHECK_THROWS_WITH_AS(failing_filter.make_iterator().get_next(), "filter failed", user_error);

  auto failing_generator = Dataset::from_generator([]() -> std::optional<Element> { throw user_error("generator failed"); });
  CHECK_THROWS_WITH_AS(failing_generator.make_iterator().get_next(), "generator failed", user_error);
  CHECK_THROWS_AS(scalars(failing_generator.batch(2)), user_error);
}

TEST_CASE("prefetch yields the same elements in the same order") {
  Dataset base = Dataset::range(200).map([](const Element& e) { return Element{e[0] * 3}; });
  CHECK(scalars(base.prefetch(1)) == scalars(base));
  CHECK(scalars(base.prefetch(8)) == scalars(base));
  CHECK(vectors(Dataset::range(10).batch(4).prefetch(2)) == std::vector<Ints>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}});
  CHECK(scalars(Dataset::range(0).prefetch(2)).empty());
  CHECK(scalars(Dataset::range(5).prefetch(2).prefetch(3)) == iota(0, 5));
  CHECK_THROWS_AS(Dataset::range(3).prefetch(0), std::invalid_argument);
}

TEST_CASE("an exception in a map upstream of prefetch reaches the consumer after the elements before it") {
  Dataset ds = Dataset::range(10)
                   .map([](const Element& e) -> Element {
                     if (e[0].item<std::int64_t>() == 3) throw user_error("bad element 3");
                     return e;
                   })
                   .prefetch(4);
  Iterator it = ds.make_iterator();
  CHECK(it.get_next()[0].item<std::int64_t>() == 0);
  CHECK(it.get_next()[0].item<std::int64_t>() == 1);
  CHECK(it.get_next()[0].item<std::int64_t>() == 2);
  CHECK_THROWS_WITH_AS(it.get_next(), "bad element 3", user_error);
  // As without prefetch, the pass goes on after the failed element.
  CHECK(it.get_next()[0].item<std::int64_t>() == 4);
}

TEST_CASE("destroying an iterator over an infinite prefetched dataset returns promptly") {
  Dataset forever = Dataset::range(3).repeat().prefetch(4);
  CHECK(forever.cardinality() == infinite_cardinality);
  const auto start = std::chrono::steady_clock::now();
  {
    Iterator it = forever.make_iterator();
    CHECK(it.get_next()[0].item<std::int64_t>() == 0);
    CHECK(it.get_next()[0].item<std::int64_t>() == 1);
    // Let the producer fill its buffer and block on it.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  {
    int seen = 0;
    for (const Element& e : forever) {
      CHECK(e[0].item<std::int64_t>() == seen % 3);
      if (++seen == 5) break;  // the range-for's iterator is destroyed here
    }
    CHECK(seen == 5);
  }
  CHECK(seconds_since(start) < 1.0);
}

TEST_CASE("destroying a prefetching iterator stops an upstream that never yields") {
  auto never = [](const Element&) { return false; };
  const auto start = std::chrono::steady_clock::now();
  {
    // The producer is inside filter's endless loop over an infinite input when we stop it.
    Iterator it = Dataset::range(10).repeat().filter(never).prefetch(2).make_iterator();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {
    // Nested: the outer producer waits on the inner prefetch, whose producer filters forever.
    Iterator it = Dataset::range(10).repeat().filter(never).prefetch(2).filter(never).prefetch(2).make_iterator();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {
    Iterator it = Dataset::range(10).repeat().skip(-1).prefetch(2).make_iterator();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(seconds_since(start) < 1.0);
}

TEST_CASE("take stops a prefetching input once it has its elements") {
  CHECK(scalars(Dataset::range(1000000000).prefetch(8).take(3)) == Ints{0, 1, 2});
  CHECK(scalars(Dataset::range(4).repeat().prefetch(2).take(6)) == Ints{0, 1, 2, 3, 0, 1});
}

TEST_CASE("cardinality follows tf.data's rules") {
  CHECK(Dataset::range(10).cardinality() == 10);
  CHECK(Dataset::range(10).batch(3).cardinality() == 4);
  CHECK(Dataset::range(10).batch(3, true).cardinality() == 3);
  CHECK(Dataset::range(9).batch(3).cardinality() == 3);
  CHECK(Dataset::range(10).repeat(-1).cardinality() == infinite_cardinality);
  CHECK(Dataset::range(5).repeat(3).cardinality() == 15);
  CHECK(Dataset::range(5).repeat(0).cardinality() == 0);
  CHECK(Dataset::range(0).repeat().cardinality() == 0);
  CHECK(Dataset::range(10).repeat().take(7).cardinality() == 7);
  CHECK(Dataset::range(10).repeat().skip(7).cardinality() == infinite_cardinality);
  CHECK(Dataset::range(10).repeat().batch(4).cardinality() == infinite_cardinality);
  CHECK(Dataset::range(10).take(3).cardinality() == 3);
  CHECK(Dataset::range(2).take(3).cardinality() == 2);
  CHECK(Dataset::range(10).take(-1).cardinality() == 10);
  CHECK(Dataset::range(10).skip(3).cardinality() == 7);
  CHECK(Dataset::range(2).skip(3).cardinality() == 0);
  CHECK(Dataset::range(10).skip(-1).cardinality() == 0);
  CHECK(Dataset::range(10).shard(3, 0).cardinality() == 4);
  CHECK(Dataset::range(10).shard(3, 1).cardinality() == 3);
  CHECK(Dataset::range(10).shard(3, 2).cardinality() == 3);
  CHECK(Dataset::range(10).map([](const Element& e) { return e; }).cardinality() == 10);
  CHECK(Dataset::range(10).prefetch(2).cardinality() == 10);
  CHECK(Dataset::range(10).shuffle(4, 1).cardinality() == 10);

  const Dataset filtered = Dataset::range(10).filter([](const Element&) { return true; });
  CHECK(filtered.cardinality() == unknown_cardinality);
  CHECK(filtered.batch(2).cardinality() == unknown_cardinality);
  CHECK(filtered.take(3).cardinality() == unknown_cardinality);
  CHECK(filtered.take(0).cardinality() == 0);
  CHECK(filtered.repeat(2).cardinality() == unknown_cardinality);
  CHECK(filtered.repeat().cardinality() == infinite_cardinality);
  CHECK(Dataset::from_generator(counter(0, 3)).cardinality() == unknown_cardinality);
  CHECK(Dataset::from_generator(counter(0, 3), 3).cardinality() == 3);
  CHECK(Dataset::from_generator(counter(0, 3), 3).batch(2).cardinality() == 2);
}

TEST_CASE("get_next throws OutOfRange at the end and get_next_as_optional returns nullopt") {
  Iterator it = Dataset::range(2).make_iterator();
  CHECK(it.get_next()[0].item<std::int64_t>() == 0);
  std::optional<Element> second = it.get_next_as_optional();
  REQUIRE(second.has_value());
  CHECK((*second)[0].item<std::int64_t>() == 1);
  CHECK_FALSE(it.get_next_as_optional().has_value());
  CHECK_THROWS_AS(it.get_next(), OutOfRange);
  CHECK(contains(message_of([&] { it.get_next(); }), "end of the dataset"));
  CHECK_FALSE(it.get_next_as_optional().has_value());
}

TEST_CASE("from_generator shares one callable between passes") {
  Dataset ds = Dataset::from_generator(counter(0, 5));
  Iterator first = ds.make_iterator();
  CHECK(first.get_next()[0].item<std::int64_t>() == 0);
  CHECK(first.get_next()[0].item<std::int64_t>() == 1);
  // A second pass continues where the first stopped.
  CHECK(scalars(ds) == Ints{2, 3, 4});
  CHECK(scalars(ds).empty());
  CHECK_FALSE(first.get_next_as_optional().has_value());
  CHECK_THROWS_AS(Dataset::from_generator(nullptr), std::invalid_argument);
  CHECK_THROWS_AS(Dataset::from_generator(counter(0, 1), -3), std::invalid_argument);
}

TEST_CASE("from_generator serialises concurrent passes over its callable") {
  Dataset ds = Dataset::from_generator(counter(0, 2000));
  Ints a, b;
  std::thread other([&] { a = scalars(ds); });
  b = scalars(ds);
  other.join();
  Ints all = a;
  all.insert(all.end(), b.begin(), b.end());
  std::sort(all.begin(), all.end());
  CHECK(all == iota(0, 2000));
  CHECK(std::is_sorted(a.begin(), a.end()));
  CHECK(std::is_sorted(b.begin(), b.end()));
}

TEST_CASE("from_generator_factory gives every pass a fresh callable") {
  std::atomic<int> made{0};
  Dataset ds = Dataset::from_generator_factory(
      [&made] {
        ++made;
        return counter(0, 3);
      },
      3);
  CHECK(ds.cardinality() == 3);
  CHECK(scalars(ds) == Ints{0, 1, 2});
  CHECK(scalars(ds) == Ints{0, 1, 2});
  CHECK(scalars(ds.repeat(2)) == Ints{0, 1, 2, 0, 1, 2});
  CHECK(made.load() == 4);
  CHECK(ds.repeat(2).cardinality() == 6);
  CHECK_THROWS_AS(Dataset::from_generator_factory(nullptr), std::invalid_argument);
}

TEST_CASE("datasets are immutable and their passes independent") {
  Dataset ds = Dataset::range(5);
  Dataset doubled = ds.map([](const Element& e) { return Element{e[0] * 2}; });
  CHECK(scalars(doubled) == Ints{0, 2, 4, 6, 8});
  CHECK(scalars(ds) == iota(0, 5));
  Iterator a = ds.make_iterator();
  Iterator b = ds.make_iterator();
  CHECK(a.get_next()[0].item<std::int64_t>() == 0);
  CHECK(a.get_next()[0].item<std::int64_t>() == 1);
  CHECK(b.get_next()[0].item<std::int64_t>() == 0);
  CHECK(a.get_next()[0].item<std::int64_t>() == 2);
  CHECK_THROWS_AS(Dataset(nullptr), std::invalid_argument);
}

TEST_CASE("a training pipeline shuffles, batches and repeats with known cardinality") {
  Tensor x = Tensor::range(12, DType::f32).reshape({6, 2});
  Tensor y = Tensor::range(6, DType::i64);
  Dataset ds = Dataset::from_tensor_slices({x, y}).shuffle(6, 1).batch(4, true).repeat(2).prefetch(2);
  CHECK(ds.cardinality() == 2);
  std::vector<std::int64_t> labels;
  for (const Element& e : ds) {
    CHECK(e[0].shape() == Shape{4, 2});
    CHECK(e[1].shape() == Shape{4});
    const auto feats = e[0].to_vector<float>();
    const auto ls = e[1].to_vector<std::int64_t>();
    for (std::size_t i = 0; i < ls.size(); ++i) {
      // Features and labels stay paired through the shuffle.
      CHECK(feats[2 * i] == static_cast<float>(2 * ls[i]));
      labels.push_back(ls[i]);
    }
  }
  CHECK(labels.size() == 8);
  std::set<std::int64_t> distinct(labels.begin(), labels.begin() + 4);
  CHECK(distinct.size() == 4);
}

}  // namespace TROUPE_TEST_FILE
