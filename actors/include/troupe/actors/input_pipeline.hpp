#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>

namespace caf {
class actor_system;
}

namespace troupe::actors {

/// An input pipeline actor: a detached actor with its own thread that calls `produce` to prepare
/// items ahead of the consumer, keeping at most `depth` of them ready (a bounded buffer: a
/// consumer that falls behind stops production, memory does not grow). With depth 0 nothing is
/// prepared ahead: each item is produced when next() asks for it. next() takes the oldest
/// one. Items are opaque here; the runtime decides what they are (per-replica batches).
///
/// `produce` returns nullptr at the end of the data and may throw: the exception is kept and
/// rethrown by next() once the items produced before it have been taken, and so is the end.
class input_pipeline {
 public:
  using item = std::shared_ptr<const void>;

  input_pipeline(caf::actor_system& system, std::function<item()> produce, std::size_t depth,
                 std::chrono::microseconds spin);
  /// Stops the actor and waits for its thread; a produce() call in progress is finished first.
  ~input_pipeline();
  input_pipeline(const input_pipeline&) = delete;
  input_pipeline& operator=(const input_pipeline&) = delete;

  /// The next item, waiting for it if none is ready; nullptr at the end of the data (and after).
  item next();

  /// How long next() has waited in all, round trips to the actor included.
  std::chrono::nanoseconds waited() const noexcept { return waited_; }

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
  std::chrono::nanoseconds waited_{0};
};

}  // namespace troupe::actors
