#pragma once
// --host-discovery-script (with --elastic): the hosts and slots of a launch change while it runs,
// as Horovod's elastic host discovery has them.
//   1. A thread runs the script every --discovery-interval seconds (discovery_runner), bounded by
//      --discovery-timeout: a script that hangs is killed (its whole process group), one that
//      fails is named, and either way the workers stay as they are. The supervisor's poll loop
//      hears of each result through a pipe (wake_fd) and takes it (take).
//   2. The output is untrusted: parse_discovery_output checks every line ("host" or
//      "host:slots", blank lines and # comments skipped), names a bad one by its number, bounds
//      the slots and caps the total at --max. One bad line rejects the whole output.
//   3. host_membership compares what the script lists with the workers each host runs and says
//      which workers to add (each joins the running cluster, TROUPE_JOIN=1) and which to remove:
//      the newest of a host first, never rank 0 (the chief holds the cluster's membership), never
//      below --min. A removed worker is asked to leave (SIGUSR2 to its process): it leaves the
//      cluster at its next step boundary, the others go on from there without it, and it exits
//      0. One still running --leave-timeout seconds later is killed (SIGKILL to its group) and
//      the others drop it as a lost worker. Either way its exit is no failure of the run and no
//      replacement (--max-restarts) is started for it. A worker lost on its own keeps its
//      slot (only --max-restarts replaces it) until the script lists fewer.
// Every host is this machine (127.0.0.1, localhost or its host name): a host elsewhere would need
// --rsh, which discovery does not do, so such a line is refused, named.

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "launch/launch_options.hpp"
#include "launch/worker_process.hpp"

namespace troupe::launch {

/// The most bytes of output one run of the script may print.
inline constexpr std::size_t max_discovery_output = 64 * 1024;

/// An output of the script that cannot be used; the message names the line.
class discovery_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Whether `host` is this machine: 127.0.0.1, localhost or gethostname()'s name.
bool is_local_host(const std::string& host);

/// The name a local host is known by in the launcher's messages and bookkeeping: "127.0.0.1".
std::string canonical_host(const std::string& host);

/// What one run of the script listed, checked.
struct discovered_hosts {
  std::vector<host_slots> hosts;  ///< in the script's order, each host once, canonical names
  int total = 0;                  ///< their slots, at most max_total
  std::string note;               ///< set when the total was capped
};

/// Parses the script's output: one host a line, "host" (one slot) or "host:N" (1..256 slots).
/// Throws discovery_error naming the line for a malformed line, a host named twice, a host
/// that is not this machine, or an output that names no host. A total over `max_total` is cut
/// down to it (the last hosts lose slots first) and said in `note`.
discovered_hosts parse_discovery_output(const std::string& text, int max_total);

/// Runs the script every interval on a thread of its own; its results wait for take().
class discovery_runner {
 public:
  /// One run's result: the output, or why there is none.
  struct result {
    bool ok = false;
    std::string output;  ///< ok: what the script printed
    std::string error;   ///< !ok: "exited with status 3", "printed nothing ... killed it"
  };

  /// Starts the thread; the first run is at once. Throws std::runtime_error when it cannot.
  discovery_runner(std::string script, double interval_s, double timeout_s);
  /// Stops the thread, killing a script that still runs.
  ~discovery_runner();
  discovery_runner(const discovery_runner&) = delete;
  discovery_runner& operator=(const discovery_runner&) = delete;

  /// Readable when results wait.
  int wake_fd() const;
  /// The results since the last call, oldest first (empties the wake pipe).
  std::vector<result> take();

 private:
  struct state;
  std::unique_ptr<state> state_;
};

/// Which workers each host runs, and what the script's list changes about them.
class host_membership {
 public:
  /// The workers' hosts at the start: rank i on the host of its slot in `hosts` (canonical
  /// names), or 127.0.0.1 for every rank of `workers` when `hosts` is empty.
  host_membership(const launch_options& options, const std::vector<host_slots>& hosts, int workers);

  struct change {
    std::vector<std::string> add;  ///< a new worker on each of these hosts
    std::vector<int> remove;       ///< ranks to stop
    std::vector<std::string> notes;  ///< what was held back, and why
  };

  /// What makes `workers` match `wanted`. Occupying a slot: a running worker not removed, and
  /// one lost on its own (not running, not removed, not released). A host's lost workers give
  /// up their slots first when it has fewer; then its newest running workers are removed, never
  /// rank 0 and never below --min running; adds keep the slots occupied at most --max.
  change plan(const std::vector<host_slots>& wanted, const std::vector<worker>& workers);

  /// Records that rank `rank` runs on `host` (a worker added).
  void added(int rank, const std::string& host);
  /// Records that rank `rank` is being removed.
  void removing(int rank) { removed_[rank] = true; }
  /// Whether rank `rank` was removed by discovery (its exit is no failure).
  bool removed(int rank) const;
  /// The host of rank `rank`.
  std::string host_of(int rank) const;

 private:
  const launch_options& options_;
  std::map<int, std::string> host_;   // rank -> canonical host
  std::map<int, bool> removed_;       // removed by discovery
  std::map<int, bool> released_;      // lost on its own, its slot given up
};

/// The supervisor's side: runs the script, and adds and removes workers to match its output.
class host_discovery {
 public:
  using say_fn = std::function<void(const std::string&)>;
  /// Starts a new worker on `host` (joining the running cluster): its rank, or nullopt (said why).
  using add_fn = std::function<std::optional<int>(const std::string& host)>;

  /// `options` must outlive it; `workers` is how many the launch starts with.
  host_discovery(const launch_options& options, int workers, add_fn add, say_fn say);

  /// Starts running the script (after the first workers started).
  void start();
  /// Readable when a run of the script has a result; -1 before start().
  int wake_fd() const { return runner_ ? runner_->wake_fd() : -1; }

  /// Takes the script's results and acts on the newest: names a failure or a bad output, else
  /// removes (SIGUSR2: asked to leave) and adds workers to match it. `may_change` false (the
  /// launch is stopping, or training ended: a worker finished): results are only read.
  void apply(std::vector<worker>& workers, bool may_change);

  /// The earliest time a worker asked to leave is killed if it still runs (none: no leave pending).
  std::optional<clock::time_point> next_leave_deadline(const std::vector<worker>& workers) const;
  /// Kills (SIGKILL to the group, said) every worker asked to leave that still runs at `now`
  /// past --leave-timeout: the others drop it as a lost worker.
  void expire_leaves(std::vector<worker>& workers, clock::time_point now);

  /// Whether rank `rank` was removed by discovery: its exit is no failure and not replaced.
  bool removed(int rank) const { return members_.removed(rank); }
  /// Says that a removed worker left (it ended with wait status `status`).
  void left(const worker& w, int status);
  /// Whether discovery started rank `rank` (it joined the running cluster).
  bool added(int rank) const { return added_.count(rank) > 0 && added_.at(rank); }
  /// Whether `w`, a worker discovery added, ended with `status` (not a success) after the chief
  /// finished the training (`chief_finished`): it came too late to join, or ended after the
  /// others, and is no failure of the run. Says so when it is.
  bool late(const worker& w, int status, bool chief_finished);

 private:
  const launch_options& options_;
  host_membership members_;
  add_fn add_;
  say_fn say_;
  std::unique_ptr<discovery_runner> runner_;
  std::map<int, bool> added_;  // ranks discovery started
  std::map<int, clock::time_point> leave_by_;  // ranks asked to leave: when SIGKILL follows
  std::string last_trouble_;  // the last failure or notes said: said again only when it changes
  bool failing_ = false;      // the last result was a failure or a bad list
};

}  // namespace troupe::launch
