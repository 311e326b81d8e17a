#pragma once

// The scheduling rules of a chief's dispatcher (cluster_tasks.hpp, steps 3 and 4), apart from CAF.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <set>
#include <utility>
#include <vector>

namespace troupe::actors {

/// The scheduling rules of a dispatcher, apart from CAF: a queue of closures, the workers that
/// are up, and at most `window` closures in flight on each. At-least-once: a closure in flight on
/// a worker that is lost goes back to the front of the queue.
class dispatch_state {
 public:
  explicit dispatch_state(int workers, int window);

  /// Closure `id` waits for a worker.
  void enqueue(std::uint64_t id);
  /// Worker `w` is reachable (again).
  void on_worker_up(int w);
  /// Worker `w` is gone: its closures in flight go back to the front of the queue, in order, and
  /// are counted as retried (requeue false: they are only taken off it, for the caller to
  /// cancel). Returns them. A worker that was not up changes nothing.
  std::vector<std::uint64_t> on_worker_lost(int w, bool requeue = true);
  /// Empties the queue (closures in flight stay); returns what it held, oldest first.
  std::vector<std::uint64_t> cancel_queued();
  /// Closure `id` finished on worker `w`. Returns false (and changes nothing) when it was not in
  /// flight there: a stale answer.
  bool on_finished(int w, std::uint64_t id);
  /// Closures in flight per worker from now on (1 or more).
  void set_window(int window);
  /// Hands out queued closures to the least loaded workers that are up, each below its window.
  std::vector<std::pair<int, std::uint64_t>> assign();

  int workers() const noexcept { return static_cast<int>(up_.size()); }
  bool is_up(int w) const { return up_.at(static_cast<std::size_t>(w)); }
  int workers_up() const noexcept;
  std::size_t queued() const noexcept { return queue_.size(); }
  std::size_t in_flight() const noexcept;
  /// Closures in flight on each worker, by worker.
  std::vector<std::size_t> in_flight_by_worker() const;
  std::uint64_t retried() const noexcept { return retried_; }
  std::uint64_t workers_lost() const noexcept { return lost_; }

 private:
  std::vector<bool> up_;
  std::vector<std::set<std::uint64_t>> in_flight_;
  std::deque<std::uint64_t> queue_;
  int window_;
  std::uint64_t retried_ = 0;
  std::uint64_t lost_ = 0;
  std::size_t next_ = 0;  // where the least-loaded search starts, so ties rotate
};

}  // namespace troupe::actors
