#pragma once

// The chief's side of a cluster of tasks (cluster_tasks.hpp has the walkthrough: steps 2 to 6).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "troupe/actors/closure_watch.hpp"
#include "troupe/actors/cluster_task_types.hpp"
#include "troupe/actors/liveness_policy.hpp"
#include "troupe/actors/ps_cluster_board.hpp"

namespace troupe::actors {

/// How a closure ended.
struct closure_outcome {
  std::uint64_t id = 0;
  bool ok = false;
  std::string payload;  ///< the result's bytes, or the error's message
  std::string worker;   ///< the task it ran on
  bool cancelled = false;  ///< it never ran: cancelled after another closure failed (worker empty)
};

/// What a dispatcher is given.
struct dispatcher_options {
  std::string task = "/job:chief/replica:0/task:0";  ///< its own name, said in every hello
  std::vector<task_endpoint> workers;
  std::vector<task_endpoint> ps;
  std::shared_ptr<control_credentials> credentials;  ///< nullptr: plain BASP
  int window = 16;                                   ///< closures in flight per worker
  std::chrono::milliseconds connect_retry{200};      ///< how often a worker that is down is tried
  std::chrono::milliseconds ps_timeout{60000};       ///< how long the ps tasks may take to answer at start
  /// How often the chief beats every task and how many beats a task may miss: a worker silent
  /// longer is lost (its closures go to other workers, and it is taken back when it answers
  /// again), a silent ps task fails the coordinator, and a task whose chief is silent that long is
  /// told its chief is gone.
  liveness_policy liveness;
  /// A closure running on a worker longer than stall.warning is reported (one line, repeated at
  /// a back-off, cleared when it finishes); past stall.shutdown (0: never) it is given up on that
  /// worker: it runs elsewhere, as a lost worker's closures do, and the worker takes no closure
  /// until it returns. A closure given up a second time fails with that as its error.
  closure_watch_options stall;
};

/// The chief's side: connects to the workers and ps tasks, schedules closures onto the workers
/// and watches them all.
class dispatcher {
 public:
  /// Connects to every ps task first (each within options.ps_timeout, else std::runtime_error
  /// naming it); workers are connected in the background and retried while they are down.
  /// on_done runs once per closure that completes (ok or with an error raised by its function);
  /// on_ps_lost once per ps task lost for good; both on an actor thread. With a ps restart wait
  /// (set_ps_restart_wait), a lost ps task is first awaited: on_ps_down says it went (its index,
  /// name and why), and either on_ps_back says it was reached again at its address (restarted,
  /// authenticated as every task is, its shards gone) or, past the wait, on_ps_lost ends it.
  dispatcher(caf::actor_system& system, dispatcher_options options, std::function<void(closure_outcome)> on_done,
             std::function<void(const std::string& ps_task, const std::string& reason)> on_ps_lost,
             std::function<void(const std::string& line)> log,
             std::function<void(int ps, const std::string& ps_task, const std::string& reason)> on_ps_down = {},
             std::function<void(int ps, const std::string& ps_task)> on_ps_back = {});
  ~dispatcher();
  dispatcher(const dispatcher&) = delete;
  dispatcher& operator=(const dispatcher&) = delete;

  /// Closures in flight per worker from now on, and how often a worker that is down is tried.
  void configure(int window, std::chrono::milliseconds connect_retry);
  /// Heartbeat settings from now on (as dispatcher_options; std::invalid_argument out of their
  /// ranges): every task watched starts a fresh limit, and each task hears them with its next beat.
  void set_heartbeat(liveness_policy liveness);
  /// How long a lost ps task is awaited (reached again at its address every connect_retry) before
  /// it is lost for good; 0 (the default): lost at once, as TensorFlow's coordinator does.
  void set_ps_restart_wait(std::chrono::milliseconds wait);
  /// Stall bounds from now on (as dispatcher_options; std::invalid_argument out of their ranges).
  void set_stall(closure_watch_options stall);
  /// Queues a closure.
  void schedule(std::uint64_t id, std::string function, std::string args);
  /// TensorFlow's rules after a closure failed: from a failure on, a closure whose worker is lost
  /// is cancelled rather than run again. cancel_queued (blocking, bounded) cancels every closure
  /// still queued and keeps cancelling what is queued (closures in flight finish) until resume.
  /// Each cancelled closure reaches on_done once, with cancelled set.
  void cancel_queued();
  void resume();
  /// The variables' layout, sent to every worker now and to every worker that connects later.
  void set_table(std::string blob);
  /// One shard of the chief's own requests: ps task, key, and for a creation or an update its
  /// bytes (and how an update applies).
  struct shard_op {
    int ps = 0;
    std::string key;
    update_op op = update_op::assign;
    std::string bytes;
  };
  /// Creates variable shards, every request in flight at once (blocking, each bounded by
  /// `timeout`); once all are answered, throws std::runtime_error for the first that failed,
  /// naming its ps task.
  void create_shards(std::vector<shard_op> shards, std::chrono::milliseconds timeout);
  /// Shards' bytes, in order, every request in flight at once; throws as create_shards.
  std::vector<std::string> read_shards(const std::vector<shard_op>& shards, std::chrono::milliseconds timeout);
  /// How many optimizer slots each shard keeps beside its elements (0 before its first optimizer
  /// update, 1 for momentum, 2 for Adam and AdamW), in order; throws as create_shards.
  std::vector<int> shard_slots(const std::vector<shard_op>& shards, std::chrono::milliseconds timeout);
  /// Applies updates to shards, every request in flight at once; throws as create_shards.
  void update_shards(std::vector<shard_op> updates, std::chrono::milliseconds timeout);

  /// What one ps task's part of a sharded checkpoint is: its file's size and XXH64.
  struct saved_file {
    std::uint64_t bytes = 0;
    std::uint64_t hash = 0;
  };
  /// Asks every ps task at once to write its shards into `directory` (a save in progress,
  /// check_shard_checkpoint_target's rules), ps task i to shard_file_name(i, n), each bounded by
  /// `timeout`; once all answered, throws std::runtime_error naming the first ps task that failed.
  std::vector<saved_file> save_shards(const std::string& directory, std::int64_t step,
                                      std::chrono::milliseconds timeout);
  /// One shard's restored state: its elements, slots (optimizer 255: none), and step.
  struct shard_restore {
    int ps = 0;
    std::string key;
    std::string elements;
    std::string slots;
    std::int64_t applied = 0;
    std::uint8_t optimizer = 0xff;
  };
  /// Restores shards, every request in flight at once; throws as save_shards.
  void restore_shards(std::vector<shard_restore> shards, std::chrono::milliseconds timeout);

  /// Closures put back after their worker was lost, and workers lost, so far.
  std::uint64_t retried() const;
  std::uint64_t workers_lost() const;
  int workers_up() const;
  /// What the dispatcher knows of its cluster, for the dashboard: the queue, every worker and ps
  /// task, the last events. It lives as long as the longest holder.
  std::shared_ptr<ps_cluster_board> board() const;

  struct impl;

 private:
  std::shared_ptr<impl> impl_;
};

}  // namespace troupe::actors
