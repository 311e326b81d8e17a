#include "distribute/collectives/gradient_buckets.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>

#include "elements.hpp"
#include "troupe/errors.hpp"
#include "troupe/kernels/reduce_kernels.hpp"

namespace troupe::distribute::detail {

namespace {

// Elements per chunk: small enough that several threads share a bucket of one large tensor,
// large enough that claiming a chunk costs nothing next to summing it.
constexpr std::int64_t chunk_bytes = 64 * 1024;

enum : int { collecting = 0, reducing = 1, local_done = 2, complete_state = 3, failed_state = 4 };

std::string describe(const Tensor& t) { return std::string(dtype_name(t.dtype())) + " " + shape_to_string(t.shape()); }

}  // namespace

GradientBuckets::GradientBuckets(int replicas, std::chrono::microseconds spin)
    : replicas_(replicas),
      spin_(spin),
      next_(static_cast<std::size_t>(replicas), 0),
      finished_(static_cast<std::size_t>(replicas), false),
      in_collective_(static_cast<std::size_t>(replicas), false),
      entered_(static_cast<std::size_t>(replicas), 0) {}

GradientBuckets::bucket& GradientBuckets::at(std::size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  return *buckets_[index];
}

std::vector<Tensor>& GradientBuckets::sums(std::size_t index) { return at(index).outputs; }

void GradientBuckets::shut_down() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
}

std::uint64_t GradientBuckets::generation() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return generation_;
}

void GradientBuckets::notify() {
  { std::lock_guard<std::mutex> lock(mutex_); }
  changed_.notify_all();
}

void GradientBuckets::throw_aborted() {
  std::lock_guard<std::mutex> lock(mutex_);
  throw CollectiveAborted(reason_.empty() ? std::string("gradient all-reduce: the step was aborted") : reason_);
}

std::size_t GradientBuckets::start(int replica, ReduceOp op, std::vector<Tensor> values, const Device& device) {
  for (Tensor& v : values) {
    if (v.is_gpu()) v = v.to(device);
  }
  if (aborted_.load(std::memory_order_acquire)) throw_aborted();
  bucket* b = nullptr;
  std::size_t index = 0;
  bool last = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    index = next_[static_cast<std::size_t>(replica)]++;
    if (index == buckets_.size()) {
      auto fresh = std::make_unique<bucket>();
      fresh->op = op;
      fresh->collectives_before = entered_[static_cast<std::size_t>(replica)];
      fresh->inputs.resize(static_cast<std::size_t>(replicas_));
      fresh->outputs.reserve(values.size());
      for (const Tensor& v : values) fresh->outputs.push_back(Tensor::empty(v.shape(), v.dtype(), device));
      buckets_.push_back(std::move(fresh));
      count_.store(buckets_.size(), std::memory_order_release);
    }
    b = buckets_[index].get();
    // Every replica must start the same buckets: the first one's tensors are the reference.
    std::string mismatch;
    if (b->op != op) {
      mismatch = "reduce op " + std::string(reduce_op_name(op)) + " against " + std::string(reduce_op_name(b->op));
    } else if (b->outputs.size() != values.size()) {
      mismatch = std::to_string(values.size()) + " tensor(s) against " + std::to_string(b->outputs.size());
    } else {
      for (std::size_t i = 0; i < values.size() && mismatch.empty(); ++i) {
        if (values[i].dtype() != b->outputs[i].dtype() || values[i].shape() != b->outputs[i].shape()) {
          mismatch = "tensor " + std::to_string(i) + " is " + describe(values[i]) + " against " +
                     describe(b->outputs[i]);
        }
      }
    }
    if (!mismatch.empty()) {
      lock.unlock();
      const std::string why = "gradient all-reduce: replica " + std::to_string(replica) + "'s bucket " +
                              std::to_string(index) + " differs from the other replicas' (" + mismatch +
                              "): every replica must compute the same gradients";
      abort(why);
      throw std::invalid_argument(why);
    }
    b->inputs[static_cast<std::size_t>(replica)] = std::move(values);
    last = ++b->deposited == replicas_;
    if (last) {
      b->all_started = std::chrono::steady_clock::now();
      for (std::size_t i = 0; i < b->outputs.size(); ++i) {
        const std::int64_t n = b->outputs[i].num_elements();
        const std::int64_t step =
            std::max<std::int64_t>(1, chunk_bytes / static_cast<std::int64_t>(dtype_size(b->outputs[i].dtype())));
        for (std::int64_t e = 0; e < n; e += step) b->chunks.push_back({i, e, std::min(n, e + step)});
      }
      b->state.store(reducing, std::memory_order_release);
    }
  }
  if (last) {
    if (b->chunks.empty()) {
      finish_local(*b);
    } else {
      notify();  // waiting replicas may help
      // The last replica to deposit starts the sums at once; the others join when they wait.
      while (help()) {
      }
    }
  }
  return index;
}

bool GradientBuckets::help() {
  const std::size_t count = count_.load(std::memory_order_acquire);
  for (std::size_t i = first_open_.load(std::memory_order_acquire); i < count; ++i) {
    bucket& b = at(i);
    if (b.state.load(std::memory_order_acquire) != reducing) continue;
    const std::size_t k = b.next_chunk.fetch_add(1, std::memory_order_relaxed);
    if (k >= b.chunks.size()) continue;
    run_chunk(b, b.chunks[k]);
    if (b.chunks_done.fetch_add(1, std::memory_order_acq_rel) + 1 == b.chunks.size()) finish_local(b);
    return true;
  }
  return false;
}

void GradientBuckets::run_chunk(bucket& b, const chunk& c) {
  const Tensor& out = b.outputs[c.tensor];
  std::vector<const void*> ins(static_cast<std::size_t>(replicas_));
  for (int r = 0; r < replicas_; ++r) ins[static_cast<std::size_t>(r)] = b.inputs[static_cast<std::size_t>(r)][c.tensor].raw_data();
  void* outs[1] = {const_cast<Tensor&>(out).raw_mutable_data()};
  kernels::reduce_range(ins.data(), replicas_, outs, 1, c.begin, c.end, troupe::detail::to_scalar_type(out.dtype()),
                        troupe::detail::to_reduce_kind(b.op));
}

void GradientBuckets::finish_local(bucket& b) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& in : b.inputs) in.clear();  // every chunk is summed: the inputs may go
    std::size_t open = first_open_.load(std::memory_order_relaxed);
    while (open < buckets_.size() && buckets_[open]->state.load(std::memory_order_acquire) >= reducing &&
           buckets_[open]->next_chunk.load(std::memory_order_relaxed) >= buckets_[open]->chunks.size()) {
      ++open;
    }
    first_open_.store(open, std::memory_order_release);
    b.state.store(after_local_ ? local_done : complete_state, std::memory_order_release);
  }
  changed_.notify_all();
}

void GradientBuckets::complete(std::uint64_t generation, std::size_t index) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (generation != generation_ || index >= buckets_.size()) return;
    buckets_[index]->state.store(complete_state, std::memory_order_release);
  }
  changed_.notify_all();
}

void GradientBuckets::note_peer_wait(std::uint64_t generation, std::chrono::steady_clock::time_point begin,
                                     std::chrono::steady_clock::time_point end) {
  if (end <= begin) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (generation == generation_) peer_waits_.emplace_back(begin, end);
}

std::chrono::nanoseconds GradientBuckets::peer_wait_within(std::chrono::steady_clock::time_point from,
                                                           std::chrono::steady_clock::time_point to) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::chrono::nanoseconds total{0};
  for (const auto& [begin, end] : peer_waits_) {
    const auto b = std::max(begin, from);
    const auto e = std::min(end, to);
    if (e > b) total += std::chrono::duration_cast<std::chrono::nanoseconds>(e - b);
  }
  return total;
}

void GradientBuckets::fail(std::uint64_t generation, std::size_t index, std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (generation != generation_ || index >= buckets_.size()) return;
    buckets_[index]->error = std::move(error);
    buckets_[index]->state.store(failed_state, std::memory_order_release);
  }
  changed_.notify_all();
}

bool GradientBuckets::wait_local(std::uint64_t generation, std::size_t index) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] {
    return generation_ != generation || stopping_ ||
           (!aborted_.load() && index < buckets_.size() &&
            buckets_[index]->state.load(std::memory_order_acquire) == local_done);
  });
  return generation_ == generation && !stopping_ && !aborted_.load();
}

void GradientBuckets::check_missing(std::unique_lock<std::mutex>& lock, const bucket& b, std::size_t index) {
  if (b.state.load(std::memory_order_acquire) != collecting) return;
  for (int r = 0; r < replicas_; ++r) {
    const auto k = static_cast<std::size_t>(r);
    const bool moved_on = in_collective_[k] && entered_[k] > b.collectives_before;
    if ((finished_[k] || moved_on) && next_[k] <= index) {
      const bool returned = finished_[k];
      lock.unlock();
      const std::string why = "gradient all-reduce: replica " + std::to_string(r) +
                              (returned ? " returned" : " entered another collective (all_reduce, all_gather, merge_call)") +
                              " without starting bucket " + std::to_string(index) +
                              ": every replica must start the same buckets before its next collective";
      abort(why);
      throw CollectiveAborted(why);
    }
  }
}

void GradientBuckets::settle() {
  for (;;) {
    if (aborted_.load(std::memory_order_acquire)) throw_aborted();
    if (help()) continue;
    std::unique_lock<std::mutex> lock(mutex_);
    bool settled = true;
    for (std::size_t i = 0; i < buckets_.size(); ++i) {
      const int s = buckets_[i]->state.load(std::memory_order_acquire);
      if (s == complete_state || s == failed_state) continue;
      settled = false;
      check_missing(lock, *buckets_[i], i);
      break;
    }
    if (settled) return;
    changed_.wait_for(lock, std::chrono::milliseconds(1));
  }
}

std::vector<Tensor> GradientBuckets::wait(int replica, std::size_t index, const Device& device,
                                          std::chrono::steady_clock::time_point& all_started) {
  const auto begin = std::chrono::steady_clock::now();
  const auto spin_until = begin + spin_;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (index >= next_[static_cast<std::size_t>(replica)]) {
      throw std::logic_error("wait_all_reduce: bucket " + std::to_string(index) + " was not started by replica " +
                             std::to_string(replica) + " in this step");
    }
  }
  bucket& b = at(index);
  for (;;) {
    const int state = b.state.load(std::memory_order_acquire);
    if (state == complete_state || state == failed_state) break;
    if (aborted_.load(std::memory_order_acquire)) throw_aborted();
    if (help()) continue;
    if (std::chrono::steady_clock::now() < spin_until) {
      std::this_thread::yield();
      continue;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    check_missing(lock, b, index);
    changed_.wait_for(lock, std::chrono::milliseconds(1), [&] {
      const int s = b.state.load(std::memory_order_acquire);
      return s == complete_state || s == failed_state || aborted_.load() ||
             (s == reducing && b.next_chunk.load(std::memory_order_relaxed) < b.chunks.size());
    });
  }
  if (b.state.load(std::memory_order_acquire) == failed_state) std::rethrow_exception(b.error);
  all_started = std::max(all_started, b.all_started);
  std::vector<Tensor> out;
  out.reserve(b.outputs.size());
  for (const Tensor& t : b.outputs) out.push_back(t.with_device(device));
  return out;
}

void GradientBuckets::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_.load()) reason_ = why;
    aborted_.store(true, std::memory_order_release);
  }
  changed_.notify_all();
}

void GradientBuckets::finish(int replica) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_[static_cast<std::size_t>(replica)] = true;
  }
  changed_.notify_all();
}

void GradientBuckets::set_in_collective(int replica, bool inside) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_collective_[static_cast<std::size_t>(replica)] = inside;
    if (inside) ++entered_[static_cast<std::size_t>(replica)];
  }
  if (inside && count_.load(std::memory_order_acquire) > 0) changed_.notify_all();  // waiters re-check
}

void GradientBuckets::reset() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::fill(in_collective_.begin(), in_collective_.end(), false);
    std::fill(entered_.begin(), entered_.end(), 0);
    peer_waits_.clear();
    buckets_.clear();
    count_.store(0);
    first_open_.store(0);
    std::fill(next_.begin(), next_.end(), 0);
    std::fill(finished_.begin(), finished_.end(), false);
    aborted_.store(false);
    reason_.clear();
    ++generation_;
  }
  changed_.notify_all();
}

}  // namespace troupe::distribute::detail
