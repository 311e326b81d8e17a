#include "intra_op.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "env.hpp"

namespace troupe::detail::cpu {
namespace {

thread_local int threads_here = 1;

// One call of parallel_for: its parts left to finish and the first exception.
struct job {
  const std::function<void(int)>* fn = nullptr;
  std::atomic<int> left{0};
  std::mutex error_mutex;
  std::exception_ptr error;

  void run(int part) noexcept {
    try {
      (*fn)(part);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
    left.fetch_sub(1, std::memory_order_acq_rel);
  }
};

struct task {
  job* owner;
  int part;
};

// Helper threads shared by every replica of the process, as the cores are. They spin briefly on
// the queue before they sleep: a kernel call's parts come a few microseconds apart in a step,
// while waking a sleeping thread costs tens of microseconds on small VMs.
class pool {
 public:
  explicit pool(int helpers) {
    for (int i = 0; i < helpers; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  void push(task t) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(t);
      queued_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_one();
  }

  bool try_run_one() {
    task t{};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (queue_.empty()) return false;
      t = queue_.front();
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_relaxed);
    }
    t.owner->run(t.part);
    return true;
  }

 private:
  void loop() {
    for (;;) {
      const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
      while (queued_.load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < spin_until) {
        std::this_thread::yield();
      }
      task t{};
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_ && queue_.empty()) return;
        t = queue_.front();
        queue_.pop_front();
        queued_.fetch_sub(1, std::memory_order_relaxed);
      }
      t.owner->run(t.part);
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<task> queue_;
  std::atomic<int> queued_{0};
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

int cores() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

pool& helpers() {
  // Process-wide like the cores it stands for; made on first use, joined at exit.
  static pool p(std::min(cores(), 64) - 1);
  return p;
}

}  // namespace

int intra_op_threads() { return threads_here; }

int intra_op_threads_for(int replicas) {
  const int set = troupe::detail::intra_op_threads_from_environment();
  if (set > 0) return set;
  return std::max(1, cores() / std::max(1, replicas));
}

intra_op_scope::intra_op_scope(int threads) : saved_(threads_here) { threads_here = std::max(1, threads); }
intra_op_scope::~intra_op_scope() { threads_here = saved_; }

void parallel_for(int parts, const std::function<void(int)>& fn) {
  if (parts <= 1) {
    if (parts == 1) fn(0);
    return;
  }
  job j;
  j.fn = &fn;
  j.left.store(parts, std::memory_order_relaxed);
  pool& p = helpers();
  for (int i = 1; i < parts; ++i) p.push({&j, i});
  j.run(0);
  while (j.left.load(std::memory_order_acquire) > 0) {
    if (!p.try_run_one()) std::this_thread::yield();
  }
  if (j.error) std::rethrow_exception(j.error);
}

}  // namespace troupe::detail::cpu
