#pragma once

// The flight recorder behind troupe/flight_recorder.hpp: a ring of preallocated slots that the
// collectives and the strategies' steps write into, with no lock and no allocation.
//
// Each slot is a row of 64-bit atomic words guarded by a sequence number (a seqlock): a writer
// claims the slot's number odd, writes the words, and publishes it even; a reader copies the
// words and keeps them only when the number was even and unchanged around the copy. An entry is
// thus read whole or not at all, never torn. Entries are numbered by one atomic counter (the slot
// is the number modulo the capacity), so the dump lists them in the order they were begun.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/base/elements.hpp"

namespace troupe::detail {

/// What an entry records; `membership` is an elastic cluster's change of members (a step-like
/// entry: no collective number, its participants the workers before the change).
enum class flight_op : std::uint8_t { step, all_reduce, all_gather, merge_call, broadcast, bucket_all_reduce, membership };
/// Its state: queued (handed to a thread that has not begun it), running, done or failed.
enum class flight_state : std::uint8_t { queued, running, done, failed };
/// Who takes part: this process's replicas (shared memory), the workers' leaders (the TCP ring),
/// or the replicas of every worker through NCCL.
enum class flight_group : std::uint8_t { replicas, workers, nccl };

const char* flight_op_name(flight_op op) noexcept;
const char* flight_state_name(flight_state s) noexcept;
const char* flight_group_name(flight_group g) noexcept;

/// One entry as read back.
struct flight_entry {
  std::uint64_t id = 0;  ///< the entry's number, from 0 in this process
  std::uint64_t step = 0;
  std::int64_t collective = -1;  ///< its number within the step (-1: a step entry)
  flight_op op = flight_op::step;
  flight_state state = flight_state::queued;
  flight_group group = flight_group::replicas;
  bool has_dtype = false;
  base::scalar_type dtype = base::scalar_type::f32;
  int participants = 0;
  int replica = -1;  ///< the local replica that recorded it (-1: the worker's own thread)
  std::uint64_t bytes = 0;
  std::int64_t enqueue_ns = 0, start_ns = 0, end_ns = 0;  ///< wall clock (0: not yet)
  int peer = -1;  ///< the peer waited on, where known
  char label[32] = {};
};

/// What a collective is, as its recording site knows it.
struct flight_collective {
  std::uint64_t step = 0;
  std::int64_t collective = -1;
  flight_op op = flight_op::all_reduce;
  flight_group group = flight_group::replicas;
  bool has_dtype = false;
  base::scalar_type dtype = base::scalar_type::f32;
  int participants = 0;
  int replica = -1;
  std::uint64_t bytes = 0;
};

/// Wall-clock nanoseconds since the Unix epoch.
std::int64_t flight_now_ns() noexcept;

/// The label this thread's CallSiteLabel set (nullptr: none), and setting it directly (a
/// strategy hands its caller's label to the replica threads for one step).
const char* current_call_site() noexcept;
void set_call_site(const char* label) noexcept;

class FlightRecorder {
 public:
  /// The smallest and largest ring; 0 turns the recorder off (no Runtime creates one).
  static constexpr std::size_t min_entries = 16;
  static constexpr std::size_t max_entries = 10'000'000;

  /// Who owns the dump and where it goes. `dir` empty: failures are not written (SIGUSR1, exit
  /// and write_flight_recorder write into the temporary directory).
  FlightRecorder(std::size_t capacity, std::string dir);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  /// A ticket names an entry for its later updates (a slot reused meanwhile ignores them).
  using ticket = std::uint64_t;

  /// Records a collective (or a step: op step) begun now, running, with the thread's label.
  ticket begin(const flight_collective& what) noexcept { return record(what, flight_state::running); }
  /// Records a collective handed to another thread: queued until start().
  ticket enqueue(const flight_collective& what) noexcept { return record(what, flight_state::queued); }
  /// The queued entry begins now.
  void start(ticket t) noexcept;
  /// The entry ended now: done, or failed waiting on `peer` (-1: unknown).
  void end(ticket t, bool ok, int peer = -1) noexcept;

  /// This process's place in the cluster, for the dump (set when a multi-worker strategy starts).
  void set_identity(int rank, int world, const std::string& task);

  std::size_t capacity() const noexcept { return capacity_; }
  /// Entries recorded so far (the ring keeps the last capacity() of them).
  std::uint64_t recorded() const noexcept { return next_.load(std::memory_order_relaxed); }
  /// Entries ended as failed so far.
  std::uint64_t failures() const noexcept { return failures_.load(std::memory_order_relaxed); }
  /// The kept entries, oldest first (entries being written at the moment are left out).
  std::vector<flight_entry> entries() const;
  /// The dump as JSON text (docs/diagnosis.md).
  std::string json(const std::string& reason) const;
  /// Writes the dump into `dir` (empty: this recorder's directory, or the temporary directory)
  /// and returns the file's path; std::runtime_error when it cannot be written.
  std::string write(const std::string& reason, const std::string& dir = {}) const;
  /// A collective failed: writes the dump into the recorder's directory, once per failure (a
  /// second call with no entry failed since returns the first path; the step that ends failed
  /// afterwards rewrites the file with its own reason). Returns the path, or empty
  /// when no directory is set or the write failed (the failure's own message matters more).
  std::string dump_on_failure(const std::string& reason) noexcept;
  /// The directory failures are written into (empty: none).
  const std::string& dir() const noexcept { return dir_; }

  /// The process's recorder (null: none), shared by every Runtime of the process: the first
  /// creates it with its options, the last one's end removes it.
  static std::shared_ptr<FlightRecorder> acquire(std::size_t capacity, const std::string& dir);
  static FlightRecorder* process() noexcept { return process_.load(std::memory_order_acquire); }

  /// SIGUSR1 dumps the process's recorder from a thread of its own (the handler only sets a flag
  /// and wakes it). Installed by acquire(); the previous handler is restored when the recorder goes.
  void install_signal_dump();

 private:
  static constexpr std::size_t words = 13;
  struct slot {
    std::atomic<std::uint64_t> version{0};  // 0 empty; 2*id+1 being written; 2*id+2 published
    std::atomic<std::uint64_t> word[words];
  };
  ticket record(const flight_collective& what, flight_state state) noexcept;
  bool claim_for_update(slot& s, ticket t) noexcept;
  void signal_thread_main();

  std::size_t capacity_;
  std::string dir_;
  std::unique_ptr<slot[]> slots_;
  std::atomic<std::uint64_t> next_{0};
  std::atomic<std::uint64_t> failures_{0};
  mutable std::mutex identity_mutex_;
  int rank_ = 0;
  int world_ = 1;
  std::string task_;
  std::mutex dump_mutex_;
  std::uint64_t failure_dumped_at_ = ~std::uint64_t{0};
  std::string failure_path_;
  struct signal_dump;
  std::unique_ptr<signal_dump> signal_;

  static std::atomic<FlightRecorder*> process_;
};

/// Records one collective begun now and ends it on leaving the scope: done, or failed when the
/// scope is left by an exception (fail() names the peer first). Does nothing without a recorder.
class flight_scope {
 public:
  flight_scope(FlightRecorder* recorder, const flight_collective& what) noexcept
      : recorder_(recorder), ticket_(recorder ? recorder->begin(what) : 0) {}
  ~flight_scope() {
    if (recorder_ && !ended_) recorder_->end(ticket_, false);
  }
  flight_scope(const flight_scope&) = delete;
  flight_scope& operator=(const flight_scope&) = delete;
  void done() noexcept {
    if (recorder_ && !ended_) recorder_->end(ticket_, true);
    ended_ = true;
  }
  /// Ends it now as failed, waiting on `peer` (-1: unknown).
  void fail(int peer) noexcept {
    if (recorder_ && !ended_) recorder_->end(ticket_, false, peer);
    ended_ = true;
  }

 private:
  FlightRecorder* recorder_;
  FlightRecorder::ticket ticket_;
  bool ended_ = false;
};

}  // namespace troupe::detail
