#pragma once
// The command line of troupe-launch.

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::launch {

/// The most workers one launcher starts: each costs two pipes and a port on this host.
inline constexpr int max_workers = 256;
/// Default seconds between SIGTERM and SIGKILL when the workers are stopped.
inline constexpr double default_grace_s = 5.0;

/// One host of --hosts / --hostfile and how many workers it runs.
struct host_slots {
  std::string host;
  int slots = 1;
  bool operator==(const host_slots& o) const { return host == o.host && slots == o.slots; }
};

/// The most restarts --max-restarts allows.
inline constexpr int max_restarts_limit = 1000;
/// The first wait before a restart; it doubles with each restart, up to max_restart_backoff_s.
inline constexpr double default_restart_backoff_s = 1.0;
inline constexpr double max_restart_backoff_s = 30.0;
/// The exit status of a worker that saved a checkpoint because it was told to stop
/// (troupe::distribute::restart_exit_code): a restart, not a failure of the program.
inline constexpr int preemption_exit_code = 75;

/// The exit status of a worker that cannot listen on its address because another process holds
/// the port (EADDRINUSE's number on Linux; the examples' address_in_use_exit_code, troupe-worker's
/// too). On ports the launcher picked itself, at the start, the whole cluster starts again on
/// fresh ones, at most max_port_retries times; with --port-base or --hosts it is a failure named.
inline constexpr int port_in_use_exit_code = 98;
inline constexpr int max_port_retries = 3;

/// The defaults of --discovery-interval and --discovery-timeout (seconds).
inline constexpr double default_discovery_interval_s = 1.0;
inline constexpr double default_discovery_timeout_s = 10.0;
/// The default of --leave-timeout: how long a worker host discovery removes has to leave.
inline constexpr double default_leave_timeout_s = 30.0;

/// The port of the first worker on each host of --hosts when --port-base does not say.
inline constexpr int default_hosts_port_base = 23456;

/// What the command line asks for.
struct launch_options {
  int num_workers = 0;                    ///< processes to start: -n N plus --ps and --chief, or the slots of --hosts
  int ps = 0;                             ///< --ps M: the last M ranks are "ps" tasks
  bool chief = false;                     ///< --chief: rank 0 is the "chief" task
  std::optional<int> devices_per_worker;  ///< --devices-per-worker K: TROUPE_DEVICES_PER_WORKER
  std::optional<int> port_base;           ///< --port-base P: ports P..P+N-1 instead of free ones
  std::optional<double> timeout_s;        ///< --timeout SECONDS: stop everything, exit 124
  double grace_s = default_grace_s;       ///< --grace SECONDS: SIGTERM to SIGKILL
  std::vector<host_slots> hosts;          ///< --hosts h1:2,h2:2 or --hostfile: workers on other hosts
  std::vector<std::string> rsh{"ssh"};    ///< --rsh CMD: runs a command on a host (rsh... HOST COMMAND)
  std::optional<std::string> log_dir;     ///< --log-dir DIR: every rank's output in DIR/rank-<i>.log
  std::vector<int> ranks;                 ///< --ranks 0,2: only their output on the terminal (empty: all)
  int max_restarts = 0;                   ///< --max-restarts N: restart every worker after a failure, N times
  double restart_backoff_s = default_restart_backoff_s;  ///< --restart-backoff SECONDS: the first wait
  bool elastic = false;                   ///< --elastic: a worker lost is dropped, the others go on
  std::optional<int> min_workers;         ///< --min N (with --elastic): TROUPE_MIN_WORKERS, below it the run fails
  std::optional<int> max_workers;         ///< --max M (with --elastic): TROUPE_MAX_WORKERS
  std::optional<std::string> discovery_script;  ///< --host-discovery-script PATH (with --elastic)
  double discovery_interval_s = default_discovery_interval_s;  ///< --discovery-interval SECONDS: between runs of the script
  double discovery_timeout_s = default_discovery_timeout_s;    ///< --discovery-timeout SECONDS: a run that takes longer is killed
  double leave_timeout_s = default_leave_timeout_s;  ///< --leave-timeout SECONDS: SIGUSR2 to SIGKILL for a removed worker
  std::vector<host_slots> discovery_hosts;  ///< --hosts/--hostfile under discovery: the first hosts (this machine)
  bool help = false;                      ///< -h / --help
  std::vector<std::string> program;       ///< the program and its arguments
};

/// A command line that cannot be run (exit status 2); the message says what is wrong.
class usage_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Parses the arguments after argv[0]. Throws usage_error naming the option and the bad value.
launch_options parse_launch_options(const std::vector<std::string>& args);

/// Parses "h1:2,h2,h3:4" (slots default 1). Throws usage_error naming `option` and the entry.
std::vector<host_slots> parse_hosts(const std::string& list, const std::string& option);

/// Reads a hostfile: one host a line, as "host", "host:N" or "host slots=N" (Open MPI's form);
/// blank lines and # comments are skipped. Throws usage_error naming the file and line.
std::vector<host_slots> read_hostfile(const std::string& path);

/// The help text, ending with a newline.
std::string usage_text();

}  // namespace troupe::launch
