#pragma once

// The parameter-server half of the stall inspector (stall_inspector.hpp has the multi-worker
// half): the chief's dispatcher tells this watch every closure it hands to a worker and every
// answer, and asks it at each heartbeat check whether some worker has run one closure for longer
// than the warning bound. A worker runs its closures one at a time, in the order they arrived
// (task_agent.hpp), so the one it runs is the oldest it was handed, and it began when it was
// handed or when the worker's previous closure finished, whichever is later. The line names the
// worker, the function and how long it has run:
//
//   stall: closure 17 (function "train_step") has run on /job:worker/replica:0/task:1 for 61 s
//
// It is repeated at a back-off (the warning bound, then twice as long each time, at most 10
// minutes apart) and cleared when the closure finishes ("stall cleared: ..."). Past the shutdown
// bound (off unless set) the closure is given up on that worker: the dispatcher runs it
// elsewhere, as a lost worker's closures, and takes no closure to that worker until the one it
// is stuck in returns (set_aside / finished). Plain class without CAF: time is passed in, so
// tests decide it.

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace troupe::actors {

/// The watch's bounds.
struct closure_watch_options {
  /// A closure running longer than this is reported (TROUPE_STALL_WARNING_S).
  std::chrono::milliseconds warning{60000};
  /// Past this it is given up on its worker (0: never; TROUPE_STALL_SHUTDOWN_S).
  std::chrono::milliseconds shutdown{0};
};

/// A closure past the shutdown bound, to be given up on its worker.
struct closure_overdue {
  int worker = -1;
  std::uint64_t id = 0;
  std::string function;
  std::chrono::milliseconds running{0};
};

/// What one check found.
struct closure_watch_verdict {
  std::vector<std::string> lines;         ///< to print now: new stalls, repeats and clearings
  std::vector<closure_overdue> give_up;   ///< past the shutdown bound (each reported once)
};

/// The chief's watch over the closures its workers run.
class closure_watch {
 public:
  using clock = std::chrono::steady_clock;
  /// One worker per name (its task name, for the lines). Throws std::invalid_argument for a
  /// warning below 1 ms or a negative shutdown.
  closure_watch(std::vector<std::string> names, closure_watch_options options);

  /// New bounds from now on (checked as the constructor does).
  void set_options(closure_watch_options options);
  const closure_watch_options& options() const noexcept { return options_; }

  /// Closure `id` of `function` was handed to worker `w` at `now`.
  void sent(int w, std::uint64_t id, std::string function, clock::time_point now);
  /// Worker `w` answered closure `id` (or dropped it) at `now`. Returns true when the worker was
  /// set aside waiting for that closure: it is back (the caller takes it back).
  bool finished(int w, std::uint64_t id, clock::time_point now);
  /// Worker `w` is lost: everything it held is forgotten, and it is no longer set aside.
  void worker_lost(int w);
  /// Worker `w` is set aside until closure `id` returns from it: what it held is forgotten.
  void set_aside(int w, std::uint64_t id);
  /// Whether worker `w` waits for a closure it was given up in.
  bool aside(int w) const;

  /// The check at `now`.
  closure_watch_verdict check(clock::time_point now);
  /// The closures reported now, one line each (for a status page), or empty.
  std::vector<std::string> current() const;

 private:
  struct held {
    std::uint64_t id = 0;
    std::string function;
    clock::time_point sent{};
  };
  struct worker {
    std::deque<held> closures;           // in the order handed, the first running
    std::optional<clock::time_point> last_end;  // when its previous closure finished
    // The report about the first closure: its id, whether a line was printed, the next repeat.
    std::uint64_t reported = 0;
    bool printed = false;
    bool given_up = false;
    clock::time_point next_print{};
    std::chrono::milliseconds backoff{0};
    std::string line;
    std::optional<std::uint64_t> aside;  // set aside until this closure returns
  };
  worker& at(int w);
  const worker& at(int w) const;
  static std::string describe(const held& h, const std::string& name, std::chrono::milliseconds running);

  closure_watch_options options_;
  std::vector<std::string> names_;
  std::vector<worker> workers_;
  std::vector<std::string> cleared_;  // lines of reported closures that finished, for the next check
};

}  // namespace troupe::actors
