#pragma once

// The actors of a cluster of tasks (tf.distribute.Server and ParameterServerStrategy's
// ClusterCoordinator). Payloads are opaque byte strings here: the runtime encodes tensors and
// decodes them, checking every length, since everything a peer sends is hostile until its sender
// proved the cluster token (which the mutual TLS of the control plane does before BASP sees a byte).
//
// The protocol, numbered as it happens:
//   1. Every task's Server publishes a task agent at its own address; every connection, accepted or
//      made, goes through a control gate (TLS first with a token; control_gate.hpp).
//   2. The chief's dispatcher connects to every worker and ps agent (retrying, in a thread of its
//      own, so a worker that is down or refuses the token never holds up the others) and says
//      (hello, its task name); the agent monitors the sender and logs "connected".
//   3. The dispatcher sends each worker the variables' layout (table, blob), again whenever it
//      changes, then (call, id, function, args); the worker's agent (a scheduled actor) queues the
//      call for the task's function thread, which runs calls one at a time in arrival order and
//      answers (result, id, ok, payload) to the dispatcher in the agent's name. When the
//      coordinator raises a function's error it asks each worker (cancel): the agent drops the
//      calls of that dispatcher it has not started and answers their ids (8 bytes each).
//   4. A worker whose agent goes down has its calls in flight put back at the front of the queue
//      (at-least-once) and is tried again until it comes back; a ps agent that goes down fails the
//      coordinator, naming it.
//   5. Variable shards are actors on the ps tasks: (vnew, key, bytes) creates one, (vread, key)
//      answers its bytes, (vupdate, key, op, bytes) applies an update as it arrives (updates from
//      different workers are not ordered, as in TensorFlow).
//   5a. A shard's bytes also travel beside CAF: each ps task listens on a data port
//      (transport/bulk_channel.hpp) and answers (data) with its port and a fresh secret; a worker
//      connects there once per ps task, both sides prove the cluster token bound to that secret,
//      and reads and updates then carry the shard's raw elements, sent from the shard's storage and
//      read straight into the destination; gathers and scatters carry some rows by index (every
//      index checked against the shard's rows). A shard is one cell behind a reader-writer lock: a read
//      takes a reference to its bytes under the shared lock and sends them after releasing it; an
//      update is received whole into the connection's buffer and applied under the exclusive
//      lock, in place, or to a copy when a read still holds the bytes (copy on write). A read sees
//      a shard before or after an update, never in between, and a stalled reader holds up no
//      update (the shard actor's own reads and updates take the same lock).
//   5b. Heartbeats: the agent's answer to hello names its pulse, an actor apart from the agent's
//      thread. Every heartbeat_interval the dispatcher asks each pulse (beat, interval, missed);
//      a worker silent for more than missed intervals is lost as in 4 and taken back when it
//      answers again, a silent ps task fails the coordinator as in 4, and a pulse that hears no
//      beat from its chief for that long says the chief is gone (heartbeat_state's rules).
//   6. The dispatcher, when destroyed, says (leave) to every agent; a Server told to stop with its
//      chief then stops: its agent and pulse end at once, queued calls are dropped, and a function
//      still running has every wait on the ps tasks ended (shard_client::cancel). A worker it never reached (down at every try, up since) is told
//      (leave, its task name, the worker's) once, so that it does not wait for a chief until its
//      start timeout; an agent serving a chief, or named otherwise, ignores that.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace caf {
class actor_system;
}

namespace troupe::actors {

class control_credentials;

/// The control plane's TLS credentials from the cluster token, installed in `system` (nullptr for
/// an empty token: plain BASP). Every object below that talks to peers keeps the pointer, so the
/// files stay as long as one of them may open a session. Throws std::runtime_error when OpenSSL
/// or the file system fails, std::invalid_argument when the system has no OpenSSL module.
std::shared_ptr<control_credentials> make_credentials(caf::actor_system& system, const std::string& token);

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

/// The liveness rules of a cluster of tasks, apart from CAF: peers beat (answer a heartbeat, or
/// send one) and a peer watched but silent for more than `missed` intervals is overdue. The chief
/// keeps one for its workers and one for its ps tasks; a task keeps one for its chief.
class heartbeat_state {
 public:
  using clock = std::chrono::steady_clock;
  /// `peers` peers, none watched; throws std::invalid_argument for interval < 1 ms or missed < 1.
  heartbeat_state(int peers, std::chrono::milliseconds interval, int missed);

  /// Peer `p` is watched from `now` on (a beat at `now`); it is not overdue.
  void watch(int p, clock::time_point now);
  /// Peer `p` is no longer watched (its connection closed, or the chief is done).
  void forget(int p);
  /// Peer `p` answered at `now`. Returns true when it had been overdue: it is back (and watched
  /// again). A peer not watched changes nothing and returns false.
  bool beat(int p, clock::time_point now);
  /// The watched peers silent for more than `missed` intervals at `now` that were not overdue yet;
  /// each is marked overdue (reported once until it beats again). Called every interval; when the
  /// previous call is itself more than two intervals ago, this process was not running (it was
  /// stopped, or starved): nobody is blamed, and every watched peer is given a fresh limit from now.
  std::vector<int> overdue(clock::time_point now);

  bool watched(int p) const { return watched_.at(static_cast<std::size_t>(p)); }
  bool is_overdue(int p) const { return overdue_.at(static_cast<std::size_t>(p)); }
  int peers() const noexcept { return static_cast<int>(watched_.size()); }
  std::chrono::milliseconds interval() const noexcept { return interval_; }
  int missed() const noexcept { return missed_; }
  /// How long a peer may be silent: interval * missed.
  std::chrono::milliseconds limit() const noexcept { return interval_ * missed_; }

 private:
  std::chrono::milliseconds interval_;
  int missed_;
  std::vector<bool> watched_;
  std::vector<bool> overdue_;
  std::vector<clock::time_point> last_;
  std::optional<clock::time_point> checked_;  // the previous call of overdue
};

/// A task's address and its name for errors and logs.
struct task_endpoint {
  std::string task;  ///< "/job:worker/replica:0/task:1"
  std::string host;
  std::uint16_t port = 0;
};

/// What a call returns: the result's bytes, or the error's message.
struct call_reply {
  bool ok = false;
  std::string payload;
};

/// Where a shard's elements lie in its bytes (the runtime's encoding), for the data connections.
struct shard_layout {
  std::size_t offset = 0;  ///< the first element's byte
  std::size_t nbytes = 0;  ///< the elements' bytes
  std::uint8_t dtype = 0;  ///< the runtime's element type
  std::size_t rows = 1;    ///< rows along the first axis (1 for a scalar): gathers and scatters index them
};

/// What a task agent does with what it receives. `call` runs on the task's function thread, one
/// call at a time; the others on the agent's actor (layout and combine also on a data
/// connection's thread, or a shard actor's), so they may run while a function does.
struct task_handlers {
  /// Runs a function (worker tasks).
  std::function<call_reply(const std::string& function, const std::string& args)> call;
  /// Takes the variables' layout (worker tasks).
  std::function<void(const std::string& blob)> table;
  /// Applies an update to a shard's bytes in place; an error message, or nothing (ps tasks).
  std::function<std::optional<std::string>(std::string& value, std::uint8_t op, const std::string& delta)> update;
  /// Where a shard's elements lie (ps tasks; an error message when its bytes are malformed). Set:
  /// the task listens on a data port.
  std::function<std::optional<shard_layout>(const std::string& value)> layout;
  /// Applies `nbytes` bytes of raw elements of `dtype` at `delta` to `value` (op 0 assign, 1 add,
  /// 2 subtract); the caller checked dtype and size against the shard's layout. An error message
  /// for an op it does not know.
  std::function<std::optional<std::string>(char* value, const char* delta, std::size_t nbytes, std::uint8_t dtype,
                                           std::uint8_t op)>
      combine;
  /// One line per event: a peer connected, left or was lost.
  std::function<void(const std::string& line)> event;
  /// A chief connected.
  std::function<void()> chief_came;
  /// The chief that connected has left or was lost.
  std::function<void()> chief_gone;
  /// The task stops: a function still running should give up what it waits for, now (worker
  /// tasks). Called once, from the task server's destructor, while the function may still run.
  std::function<void()> cancel;
};

/// A task server's data port (ps tasks: where the shards' bytes travel).
struct task_server_options {
  std::uint16_t data_port = 0;                   ///< 0: a free port the system picks
  std::chrono::milliseconds data_timeout{60000};  ///< a data connection silent mid-frame this long is dropped
};

/// One task of a cluster listening for its peers: the task agent, published through the
/// middleman (CAF's OpenSSL module with a token). Destruction unpublishes it and stops it.
class task_server {
 public:
  /// Listens on host:port (port 0: any free port), and a ps task (one whose handlers have layout
  /// and combine) on its data port too. Throws std::runtime_error naming the address when it
  /// cannot listen.
  task_server(caf::actor_system& system, std::string task, std::string host, std::uint16_t port,
              std::shared_ptr<control_credentials> credentials, task_handlers handlers,
              task_server_options options = {});
  ~task_server();
  task_server(const task_server&) = delete;
  task_server& operator=(const task_server&) = delete;

  /// The port it listens on.
  std::uint16_t port() const noexcept;

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

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
  /// How often the chief beats every task (the same defaults as MultiWorkerOptions): a worker
  /// silent for more than missed_heartbeats intervals is lost (its closures go to other workers,
  /// and it is taken back when it answers again), a silent ps task fails the coordinator, and a
  /// task whose chief is silent that long is told its chief is gone.
  std::chrono::milliseconds heartbeat_interval{500};
  int missed_heartbeats = 6;
};

/// The chief's side: connects to the workers and ps tasks, schedules closures onto the workers
/// and watches them all.
class dispatcher {
 public:
  /// Connects to every ps task first (each within options.ps_timeout, else std::runtime_error
  /// naming it); workers are connected in the background and retried while they are down.
  /// on_done runs once per closure that completes (ok or with an error raised by its function);
  /// on_ps_lost once per ps task lost; both on an actor thread.
  dispatcher(caf::actor_system& system, dispatcher_options options, std::function<void(closure_outcome)> on_done,
             std::function<void(const std::string& ps_task, const std::string& reason)> on_ps_lost,
             std::function<void(const std::string& line)> log);
  ~dispatcher();
  dispatcher(const dispatcher&) = delete;
  dispatcher& operator=(const dispatcher&) = delete;

  /// Closures in flight per worker from now on, and how often a worker that is down is tried.
  void configure(int window, std::chrono::milliseconds connect_retry);
  /// Heartbeat settings from now on (as dispatcher_options; std::invalid_argument below 1): every
  /// task watched starts a fresh limit, and each task hears them with its next beat.
  void set_heartbeat(std::chrono::milliseconds interval, int missed);
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
  /// bytes (and op: 0 assign, 1 add, 2 subtract).
  struct shard_op {
    int ps = 0;
    std::string key;
    std::uint8_t op = 0;
    std::string bytes;
  };
  /// Creates variable shards, every request in flight at once (blocking, each bounded by
  /// `timeout`); once all are answered, throws std::runtime_error for the first that failed,
  /// naming its ps task.
  void create_shards(std::vector<shard_op> shards, std::chrono::milliseconds timeout);
  /// Shards' bytes, in order, every request in flight at once; throws as create_shards.
  std::vector<std::string> read_shards(const std::vector<shard_op>& shards, std::chrono::milliseconds timeout);
  /// Applies updates to shards, every request in flight at once; throws as create_shards.
  void update_shards(std::vector<shard_op> updates, std::chrono::milliseconds timeout);

  /// Closures put back after their worker was lost, and workers lost, so far.
  std::uint64_t retried() const;
  std::uint64_t workers_lost() const;
  int workers_up() const;

  struct impl;

 private:
  std::shared_ptr<impl> impl_;
};

/// A worker's connections to the ps tasks, made on first use, for functions that read and update
/// variables. Thread-safe. read, update, read_many and update_many carry encoded shards through
/// CAF (the control plane); read_into and update_from carry raw elements over the ps tasks' data
/// connections (5a), which is what FunctionContext uses.
class shard_client {
 public:
  shard_client(caf::actor_system& system, std::string task, std::vector<task_endpoint> ps,
               std::shared_ptr<control_credentials> credentials, std::chrono::milliseconds timeout);
  ~shard_client();
  /// A shard's bytes; throws std::runtime_error naming the ps task.
  std::string read(int ps, const std::string& key);
  /// Applies an update (op: 0 assign, 1 add, 2 subtract); throws std::runtime_error naming the ps task.
  void update(int ps, const std::string& key, std::uint8_t op, std::string delta);
  /// Reads several shards (ps task, key) with every request in flight at once; the bytes in order.
  std::vector<std::string> read_many(const std::vector<std::pair<int, std::string>>& shards);
  /// One update of update_many.
  struct shard_update {
    int ps = 0;
    std::string key;
    std::uint8_t op = 0;
    std::string bytes;
  };
  /// Applies several updates with every request in flight at once; waits for all of them, then
  /// throws for the first that failed.
  void update_many(std::vector<shard_update> updates);

  /// One shard of read_into: its elements' bytes go to `into` (`nbytes` of `dtype`, what the
  /// variable's registered shape and dtype say; a ps task that answers otherwise is an error).
  struct shard_read {
    int ps = 0;
    std::string key;
    void* into = nullptr;
    std::size_t nbytes = 0;
    std::uint8_t dtype = 0;
  };
  /// Reads shards' raw elements over the ps tasks' data connections, straight into place; throws
  /// std::runtime_error naming the ps task (its connection is made again next time).
  void read_into(const std::vector<shard_read>& shards);
  /// One update of update_from: `nbytes` raw elements of `dtype` at `from`, applied with `op`.
  struct shard_write {
    int ps = 0;
    std::string key;
    std::uint8_t op = 0;
    const void* from = nullptr;
    std::size_t nbytes = 0;
    std::uint8_t dtype = 0;
  };
  /// Applies updates over the data connections, sent from where they lie; waits for every one,
  /// then throws for the first that failed, naming its ps task.
  void update_from(const std::vector<shard_write>& updates);

  /// One shard of gather_into: rows `rows[0..count)` of the shard (local row indices), each
  /// `row_bytes` of `dtype`, go one after another to `into`.
  struct shard_gather {
    int ps = 0;
    std::string key;
    const std::uint64_t* rows = nullptr;
    std::size_t count = 0;
    void* into = nullptr;
    std::size_t row_bytes = 0;
    std::uint8_t dtype = 0;
  };
  /// Reads some rows of shards over the data connections, every request in flight at once; throws
  /// std::runtime_error naming the ps task (a row the shard lacks included).
  void gather_into(const std::vector<shard_gather>& gathers);
  /// One shard of scatter_from: `count` rows of `row_bytes` at `from`, applied with `op` (0 assign,
  /// 1 add, 2 subtract) to the shard's rows `rows[0..count)`.
  struct shard_scatter {
    int ps = 0;
    std::string key;
    std::uint8_t op = 0;
    const std::uint64_t* rows = nullptr;
    std::size_t count = 0;
    const void* from = nullptr;
    std::size_t row_bytes = 0;
    std::uint8_t dtype = 0;
  };
  /// Changes some rows of shards over the data connections; waits for every one, then throws for
  /// the first that failed, naming its ps task.
  void scatter_from(const std::vector<shard_scatter>& scatters);

  /// Ends every wait of this client now and from now on (its task stops): what waits, and what
  /// asks later, throws std::runtime_error with `why`. Thread-safe.
  void cancel(const std::string& why);

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::actors
