#pragma once

// Private to runtime/src: kernels split across the cores a process's replicas leave idle. A
// replica thread of a process that runs fewer replica threads than the machine has cores may use
// cores / replicas threads per kernel call (TROUPE_INTRA_OP_THREADS overrides), as TensorFlow's
// intra-op pool lets one replica use every core. The split is fixed by the thread count, so a
// kernel gives the same bits on every run with the same setting.

#include <functional>

namespace troupe::detail::cpu {

/// Threads one kernel call of the calling thread may use (1 unless an intra_op_scope says more).
int intra_op_threads();

/// For the replica threads of a process running `replicas` of them: TROUPE_INTRA_OP_THREADS when
/// set (a bad value throws std::invalid_argument naming it), else cores / replicas, at least 1.
int intra_op_threads_for(int replicas);

/// Sets intra_op_threads() for the calling thread while alive.
class intra_op_scope {
 public:
  explicit intra_op_scope(int threads);
  ~intra_op_scope();
  intra_op_scope(const intra_op_scope&) = delete;
  intra_op_scope& operator=(const intra_op_scope&) = delete;

 private:
  int saved_;
};

/// Runs fn(0) .. fn(parts - 1): part 0 on the caller, the others on the process's helper threads
/// (the caller runs queued parts itself while it waits, so it never waits for a busy pool), and
/// returns when every part has run, rethrowing the first exception one threw.
void parallel_for(int parts, const std::function<void(int)>& fn);

}  // namespace troupe::detail::cpu
