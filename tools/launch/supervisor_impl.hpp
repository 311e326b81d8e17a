#pragma once
// The supervisor behind supervise() (supervisor.hpp has the walkthrough). Its parts live by
// concept: supervisor.cpp runs the launches, the poll loop, the signals, the exits and the
// output; worker_start.cpp builds a worker's environment and command line and forks it;
// host_discovery.cpp adds the workers the script asks for; ps_restart.cpp starts a lost ps task
// again.

#include <signal.h>

#include <array>
#include <cstdint>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "launch/elastic_watch.hpp"
#include "launch/host_discovery.hpp"
#include "launch/launch_options.hpp"
#include "launch/ps_restart.hpp"
#include "launch/worker_process.hpp"

namespace troupe::launch {

/// The signals the supervisor's handlers write to its self-pipe; blocked across fork.
inline constexpr std::array<int, 4> handled_signals = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};

/// Adds FD_* `fd_flags` and O_* `status_flags` to `fd`; false with errno set when it cannot.
bool set_flags(int fd, int fd_flags, int status_flags);
/// A pipe whose both ends are closed on exec; false with errno set when it cannot be made.
bool make_pipe(std::array<int, 2>& fds);
/// Closes `fd` when open and sets it to -1.
void close_fd(int& fd);

/// One launch of options.num_workers workers, restarted as the options say, until it ends.
class supervisor {
 public:
  /// `options` must outlive it; `addresses` are the workers' at the start, rank by rank.
  supervisor(const launch_options& options, const std::vector<std::string>& addresses);
  supervisor(const supervisor&) = delete;
  supervisor& operator=(const supervisor&) = delete;
  /// Restores the signal handlers and closes every pipe and log.
  ~supervisor();

  /// Runs the launch (and its restarts); the exit status as supervise() returns it.
  int run();

 private:
  // supervisor.cpp: the launches and the poll loop.

  // One start of every worker, until every one has exited; the status as described in
  // supervisor.hpp.
  int run_once();
  // Fresh free ports for every worker (the launcher picks the ports: no --hosts, no
  // --port-base); false, said, when none can be had.
  bool pick_fresh_ports();
  // Whether the ports are the launcher's own pick (no --hosts, no --port-base).
  bool ports_picked() const { return options_.hosts.empty() && !options_.port_base; }
  // Whether `w`, which exited with port_in_use_exit_code, starts the launch again on fresh ports:
  // the launcher picked them, `w` is of the first start (nothing started since: no replacement,
  // no ps task alone, no worker added) and retries are left. Says so.
  bool retry_on_fresh_ports(const worker& w);
  void make_discovery();
  // Waits `seconds` before a restart, still answering signals and the timeout: their exit
  // status when one ends the launch, nullopt when the restart may go ahead.
  std::optional<int> wait_before_restart(double seconds);
  bool setup();
  // --log-dir: DIR/rank-<i>.log for every worker; --ranks: who is shown on the terminal.
  bool open_logs();
  void wait_for_events(clock::time_point now);
  void handle_signals();
  void reap();
  // An exit that is not a removal, as the run takes it.
  void judge(worker& w, int status);
  // The joiners' failures held for the chief's exit: late once it finished the training; a
  // failure as any once it failed, or when --grace ran out while it still runs.
  void settle_held();
  bool joiner(int rank) const;
  bool chief_running() const;
  // --elastic with --max-restarts: a lost worker's place is taken by a new process that joins the
  // running cluster, while replacements are left (elastic_watch).
  void replace(worker& w);
  // Whether the worker was dropped by an elastic cluster that goes on (its place may be taken).
  bool on_exit(const worker& w, int status);
  void check_timers(clock::time_point now);
  // Sends `sig` to every running worker's group and arms the grace period before SIGKILL.
  void begin_stop(int sig);
  void signal_all(int sig);
  // Reads up to `max_reads` chunks (stopping early when the pipe is empty) and passes on the
  // complete lines; closes the stream at EOF.
  void read_stream(output_stream& s, int max_reads);
  void close_stream(output_stream& s);
  void emit(int target, const std::string& bytes);
  // After a failed run: troupe-doctor's verdict on the dumps this run's workers wrote (into
  // TROUPE_FLIGHT_RECORDER_DIR, or --log-dir), when there are some.
  void print_verdict();
  void say(const std::string& message);
  elastic_watch::say_fn say_fn();
  int running_count() const;
  int open_stream_count() const;

  // worker_start.cpp: a worker's environment, command line and start.
  // What runs worker w: the program itself, or with --hosts the remote shell with the host and
  // one command line that sets TF_CONFIG and the launcher's TROUPE_* variables there.
  std::vector<std::string> command_for(const worker& w, const std::vector<std::string>& env) const;
  static std::string shell_quote(const std::string& s);
  // A fresh secret for this launch: 32 bytes from the kernel, hex.
  static std::string random_token();
  // The environment every worker shares; TF_CONFIG is added per worker. Unless the caller set a
  // TROUPE_CLUSTER_TOKEN, the workers share one made for this launch.
  std::vector<std::string> base_environment() const;
  void start_workers();
  // Forks and execs one worker; false (with exit_code_ set and a message) when it did not start.
  bool start_worker(worker& w, const std::vector<std::string>& env, const std::vector<std::string>& command);

  // host_discovery.cpp: --host-discovery-script's side of the loop.
  // --host-discovery-script: its thread starts once the first workers run.
  void start_discovery();
  // --host-discovery-script: a new worker on `host` (this machine), the next rank on a fresh port
  // (--port-base: the rank's port), which joins the running cluster (TROUPE_JOIN=1). Its rank, or
  // nullopt when it could not start (said).
  std::optional<int> add_worker(const std::string& host);

  // ps_restart.cpp: a lost ps task started again alone.
  // --max-restarts with --ps: a lost ps task, once its backoff is over, starts again alone on its
  // same address, with the same environment (ps_restart).
  void restart_ps(int rank);

  const launch_options& options_;
  std::vector<std::string> addresses_;  // changed by a restart (fresh ports)
  std::vector<worker> workers_;
  elastic_watch elastic_;
  std::optional<host_discovery> discovery_;  // --host-discovery-script
  bool training_over_ = false;  // a worker finished (exit 0): discovery adds and removes no more
  bool chief_finished_ = false;  // rank 0 exited 0: a joiner that fails after it came too late
  // A joiner's failure waiting for the chief's exit (reap): its rank, wait status and bound.
  struct held_exit {
    int rank;
    int status;
    clock::time_point until;
  };
  std::vector<held_exit> held_;
  ps_restart ps_restart_;
  int restarts_used_ = 0;  // of --max-restarts: the whole cluster's, and ps tasks' alone
  std::size_t initial_workers_ = 0;  // the workers of a launch's start
  std::size_t started_this_run_ = 0;  // workers started since the run began (replacements too)
  bool port_taken_ = false;  // this run ends to start again on fresh ports (retry_on_fresh_ports)
  int port_retries_ = 0;     // of max_port_retries

  std::array<int, 2> signal_fds_{-1, -1};
  int devnull_ = -1;
  std::array<struct sigaction, handled_signals.size()> previous_{};
  std::array<bool, handled_signals.size()> installed_{};
  struct sigaction previous_sigpipe_ {};
  bool sigpipe_installed_ = false;
  std::array<bool, 3> broken_{};  // by fd: stdout or stderr of the launcher can no longer be written

  std::optional<int> exit_code_;  // decided by the first failure, signal or timeout
  bool stopping_ = false;
  int stop_signal_ = SIGTERM;
  bool signal_received_ = false;
  bool timed_out_ = false;
  bool start_failed_ = false;
  std::string last_failure_;  // the worker that failed first in the last run, and how
  std::int64_t run_started_ns_ = 0;  // when the current run began (wall clock): its dumps are newer
  int restart_count_ = 0;     // restarts so far: TROUPE_RESTART_COUNT of the workers
  std::string launch_token_;  // the run's TROUPE_CLUSTER_TOKEN when the caller set none
  std::optional<clock::time_point> timeout_at_;
  std::optional<clock::time_point> kill_at_;
  std::optional<clock::time_point> drain_until_;
};

}  // namespace troupe::launch
