#pragma once

// A thread that runs posted work one piece at a time, started at the first post. An ActorCluster
// has two: its restarts by policy and the callbacks of its asynchronous requests run there, off the
// runtime's threads (a restart blocks on a spawn; a callback may block on a request) and off the
// caller's stack.

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace troupe::distribute::detail {

/// Runs posted work in order on a thread of its own; stop() (and the destructor) runs what is
/// queued, then ends it.
class serial_worker {
 public:
  serial_worker() = default;
  serial_worker(const serial_worker&) = delete;
  serial_worker& operator=(const serial_worker&) = delete;
  ~serial_worker() { stop(); }

  // Runs `work` after what was posted before; dropped once stop() began.
  void post(std::function<void()> work) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    jobs_.push_back(std::move(work));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    wake_.notify_one();
  }

  // Runs what is queued, then ends the thread (from the thread itself: it ends after this job).
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (!thread_.joinable()) return;
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      auto work = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      try {
        work();
      } catch (...) {
        // An application's callback must not end the thread the others run on.
      }
      work = nullptr;  // what it held goes here, off the lock
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace troupe::distribute::detail
