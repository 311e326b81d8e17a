// The datasets that make elements: range, from_tensor_slices, from_tensors, the generators.
#include "data/nodes.hpp"

#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "troupe/errors.hpp"

namespace troupe::data::nodes {

namespace {

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

}  // namespace

DatasetPtr make_range(std::int64_t start, std::int64_t stop, std::int64_t step) {
  return std::make_shared<RangeDataset>(start, stop, step);
}

DatasetPtr make_slices(std::vector<Tensor> components) {
  return std::make_shared<SlicesDataset>(std::move(components));
}

DatasetPtr make_tensors(std::vector<Tensor> components) {
  return std::make_shared<TensorsDataset>(std::move(components));
}

DatasetPtr make_generator(std::function<std::optional<Element>()> next, std::int64_t cardinality) {
  return std::make_shared<GeneratorDataset>(std::move(next), cardinality);
}

DatasetPtr make_generator_factory(std::function<std::function<std::optional<Element>()>()> make_next,
                                  std::int64_t cardinality) {
  return std::make_shared<GeneratorFactoryDataset>(std::move(make_next), cardinality);
}

void check_cardinality_argument(std::int64_t c, const char* op) {
  if (c < unknown_cardinality) {
    throw std::invalid_argument(std::string(op) + ": cardinality " + str(c) +
                                " is not valid (expected a count >= 0, -1 for infinite or -2 for unknown)");
  }
}

}  // namespace troupe::data::nodes
