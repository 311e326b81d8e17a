// Dataset::prefetch: a producer thread a bounded number of elements ahead, and its cancellation.
#include "data/nodes.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "troupe/errors.hpp"

namespace troupe::data::nodes {

namespace {

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

  void rewind() const override { input_->rewind(); }

 private:
  DatasetPtr input_;
  std::size_t n_;
};

}  // namespace

DatasetPtr make_prefetch(DatasetPtr input, std::int64_t n) {
  return std::make_shared<PrefetchDataset>(std::move(input), n);
}

}  // namespace troupe::data::nodes
