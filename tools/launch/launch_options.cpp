#include "launch/launch_options.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

#include <unistd.h>

#include <CLI/CLI.hpp>

#include "launch/host_discovery.hpp"

#include "troupe/base/parse_number.hpp"

namespace troupe::launch {
namespace {

int parse_int(const std::string& option, const std::string& value, long min, long max,
              const char* expected) {
  const std::optional<long long> parsed = base::parse_int(value);
  if (!parsed || *parsed < min || *parsed > max)
    throw usage_error(option + ": expected " + expected + ", got '" + value + "'");
  return static_cast<int>(*parsed);
}

double parse_seconds(const std::string& option, const std::string& value, bool zero_allowed) {
  const std::optional<double> parsed = base::parse_double(value);
  // A bound of more than a year is a typo; it would also overflow the clock arithmetic.
  bool ok = parsed && std::isfinite(*parsed) && *parsed <= 366.0 * 86400 && (zero_allowed ? *parsed >= 0 : *parsed > 0);
  if (!ok)
    throw usage_error(option + ": expected " +
                      (zero_allowed ? "a number of seconds >= 0" : "a number of seconds > 0") +
                      ", got '" + value + "'");
  return *parsed;
}

}  // namespace

namespace {

// The command line's options, as strings: CLI11 splits "--name=value", "-nVALUE" and "--", and
// parse_int / parse_seconds check the values with the messages above.
struct raw_options {
  std::string num_workers, devices_per_worker, port_base, timeout, ps;
  bool chief = false;
  std::string grace = "5";
  std::string max_restarts = "0", restart_backoff = "1";
  std::string hosts, hostfile, rsh = "ssh", log_dir, ranks;
  bool elastic = false;
  std::string min_workers, max_workers;
  std::string discovery_script, discovery_interval = "1", discovery_timeout = "10", leave_timeout = "30";
};

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// "host:N" or "host" (and, in a hostfile, "host slots=N").
host_slots parse_host(const std::string& entry, const std::string& where) {
  std::string text = trimmed(entry);
  host_slots h;
  std::string slots;
  if (auto sp = text.find_first_of(" \t"); sp != std::string::npos) {
    const std::string rest = trimmed(text.substr(sp));
    if (rest.rfind("slots=", 0) != 0) throw usage_error(where + ": expected \"host slots=N\", got '" + entry + "'");
    slots = rest.substr(6);
    text = text.substr(0, sp);
  } else if (auto colon = text.rfind(':'); colon != std::string::npos) {
    slots = text.substr(colon + 1);
    text = text.substr(0, colon);
  }
  if (text.empty()) throw usage_error(where + ": no host name in '" + entry + "'");
  h.host = text;
  if (!slots.empty()) h.slots = parse_int(where, slots, 1, max_workers, "a number of workers per host (1..256)");
  return h;
}

void add_options(CLI::App& app, raw_options& raw) {
  app.add_option("-n,--num-workers", raw.num_workers, "how many workers to start (1..256)")->type_name("N");
  app.add_option("--ps", raw.ps, "also start M ps tasks (the last ranks), for ParameterServerStrategy")
      ->type_name("M");
  app.add_flag("--chief", raw.chief, "also start a chief task (rank 0), which coordinates the others");
  app.add_option("--devices-per-worker", raw.devices_per_worker,
                 "set TROUPE_DEVICES_PER_WORKER=K for every worker")->type_name("K");
  app.add_option("--port-base", raw.port_base, "use the ports P..P+N-1 (each checked free) instead of free ones")
      ->type_name("P");
  app.add_option("--timeout", raw.timeout, "stop every worker and exit 124 after SECONDS")->type_name("SECONDS");
  app.add_option("--grace", raw.grace, "wait between SIGTERM and SIGKILL when stopping workers")
      ->type_name("SECONDS")
      ->capture_default_str();
  app.add_option("--max-restarts", raw.max_restarts,
                 "when a worker fails or is preempted, stop the others and start every worker again, up to N times "
                 "(with --elastic: start a new worker in a lost one's place, up to N times)")
      ->type_name("N")
      ->capture_default_str();
  app.add_option("--restart-backoff", raw.restart_backoff,
                 "wait before the first restart; doubled for each further one, at most 30 s")
      ->type_name("SECONDS")
      ->capture_default_str();
  app.add_flag("--elastic", raw.elastic,
               "elastic membership: when a worker dies the others go on without it (TROUPE_ELASTIC=1 for every "
               "worker; the program must opt in, e.g. multi_worker_trainer --elastic)");
  app.add_option("--min", raw.min_workers,
                 "with --elastic: the fewest workers that go on (TROUPE_MIN_WORKERS; default 1); below it the run "
                 "fails")
      ->type_name("N");
  app.add_option("--max", raw.max_workers, "with --elastic: the most workers (TROUPE_MAX_WORKERS; default -n)")
      ->type_name("M");
  app.add_option("--host-discovery-script", raw.discovery_script,
                 "with --elastic: an executable run every --discovery-interval that prints the hosts, one \"host\" or "
                 "\"host:slots\" a line; workers are added (they join the running cluster) and removed to match, "
                 "within --min and --max; hosts are this machine only (127.0.0.1, localhost)")
      ->type_name("PATH");
  app.add_option("--discovery-interval", raw.discovery_interval,
                 "with --host-discovery-script: the seconds between the starts of two runs of the script")
      ->type_name("SECONDS")
      ->capture_default_str();
  app.add_option("--discovery-timeout", raw.discovery_timeout,
                 "with --host-discovery-script: a run of the script that takes longer is killed and named; the "
                 "workers stay as they are")
      ->type_name("SECONDS")
      ->capture_default_str();
  app.add_option("--leave-timeout", raw.leave_timeout,
                 "with --host-discovery-script: a worker removed is asked to leave (SIGUSR2) and leaves at a step "
                 "boundary; one still running this long after is killed (SIGKILL) and dropped as a lost worker")
      ->type_name("SECONDS")
      ->capture_default_str();
  app.add_option("--hosts", raw.hosts, "workers on other hosts, started through --rsh: h1:2,h2:2 (2 each)")
      ->type_name("LIST");
  app.add_option("--hostfile", raw.hostfile, "the hosts, one a line: \"host\", \"host:N\" or \"host slots=N\"")
      ->type_name("FILE");
  app.add_option("--rsh", raw.rsh, "how to run a command on a host: CMD HOST COMMAND")
      ->type_name("CMD")
      ->capture_default_str();
  app.add_option("--log-dir", raw.log_dir,
                 "write every rank's output to DIR/rank-<i>.log, and its flight recorder dump beside it (after a "
                 "failed run, troupe-doctor's verdict on the dumps is printed)")
      ->type_name("DIR");
  app.add_option("--ranks", raw.ranks, "show only these ranks' output on the terminal: 0 or 0,2")->type_name("LIST");
  app.prefix_command();  // the program and its arguments are not ours
  app.footer(R"(The program follows the options, after "--" or as the first argument that is not an option.

With --hosts or --hostfile, worker i runs on its host through the remote shell (`--rsh`, ssh by
default: `ssh HOST COMMAND`), with TF_CONFIG naming host:port for every worker (ports from
--port-base, default 23456, counted per host) and the launcher's TROUPE_* variables. The program
must be at the same path on every host. srun and mpirun -H start workers too: see
docs/multi-worker.md.

Every line worker i writes is prefixed with "[rank i] ", on stdout or stderr as the worker wrote
it. SIGINT and SIGTERM are forwarded to every worker. When a worker fails, the others are stopped.
Workers read their standard input from /dev/null.

A worker that exits with status 98 at the start could not listen on its address: another process
holds the port. On ports the launcher picked (no --port-base, no --hosts), another process took it
after the pick: the launcher says so, naming the worker and its port, and starts every worker again
on fresh ports, at most 3 times (no restart of --max-restarts). With --port-base or --hosts it is a
failure, named with the port. The examples and troupe-worker exit 98 so.

With --max-restarts N, a run that fails (a worker exits non-zero or is killed) or is preempted (a
worker exits with status 75 after saving a checkpoint: PreemptionCheckpointHandler) is started
again, every worker with fresh ports, after a wait that doubles each time (--restart-backoff); the
launcher says why on stderr; workers find the restarts so far in TROUPE_RESTART_COUNT. It gives up after N restarts with the last failure's status. A
signal to the launcher, --timeout, or a program that cannot be executed ends it at once.
With --ps, a ps task that fails while the others run is restarted alone on its same address after
--restart-backoff, and the chief waits TROUPE_PS_RESTART_WAIT_S for it (set for every task unless
the caller set it; 0 turns this off); fit restores every shard from the last sharded checkpoint.
These restarts count against N too.

With --elastic, a worker other than rank 0 killed by a signal is not a failure of the run while at
least --min workers still run: the launcher says so and leaves the others running (an elastic
program drops the lost worker and goes on). With --max-restarts N a new process takes its place, at
most N times in all: it gets the lost worker's TF_CONFIG and TROUPE_JOIN=1 and joins the running
cluster at its next step boundary; the whole cluster is never started again under --elastic, and no
replacement starts once a worker has finished. A joiner that fails while rank 0 still runs waits
(at most --grace) for rank 0's exit: when rank 0 finished (exit 0) it came too late to join, which
is no failure. A worker stopped (SIGSTOP) longer than the heartbeat limit (TROUPE_HEARTBEAT_MS x
(TROUPE_MISSED_HEARTBEATS + 1)) is killed as lost. Below --min, when rank 0 (the chief) dies, or
when a worker exits non-zero itself, the others are stopped as without --elastic.

With --elastic --host-discovery-script PATH, the launcher runs PATH every --discovery-interval
seconds (1) and reads the hosts it prints, one "host" (one slot) or "host:N" a line, as Horovod's
elastic host discovery does. Where the hosts have more slots than workers run, new workers start
(TROUPE_JOIN=1, a fresh port, the next rank) and join the running cluster, up to --max; where they
have fewer, the newest workers of a host are removed, never rank 0 and never below --min: each is
asked to leave (SIGUSR2) and leaves the cluster at its next step boundary, the others going on
from there without it (nothing rolled back), and exits 0; one still running --leave-timeout
seconds (30) later is killed (SIGKILL) and the others drop it as a lost worker. A removal is
neither a failure nor counted by --max-restarts. A bad line (named with its number), a script that
exits non-zero, or one that runs past --discovery-timeout (killed) is named on stderr and changes nothing. The workers start on this
machine only: every host must be 127.0.0.1, localhost or this host's name (--hosts/--hostfile
too); hosts elsewhere, which would need --rsh, are refused.

Exit status: 0 when every worker succeeds (with --elastic: every worker not lost on the way); the status of the first worker to fail (128+signal when
a signal killed it); 124 on --timeout; 128+signal when the launcher got SIGINT or SIGTERM;
127 when the program cannot be executed; 98 (a worker's) when a port stayed taken; 2 for bad
usage; 1 when the launcher itself fails.)");
}

const char* description =
    "troupe-launch -n N [options] [--] program [args...]\n"
    "Starts N local copies of program, each with TF_CONFIG naming the cluster (127.0.0.1 on N free\n"
    "ports) and its own task index, and supervises them. With --chief and --ps M the cluster has\n"
    "roles for ParameterServerStrategy: rank 0 the chief, then N workers, then M ps tasks.\n";

}  // namespace

launch_options parse_launch_options(const std::vector<std::string>& args) {
  launch_options options;
  raw_options raw;
  CLI::App app{description, "troupe-launch"};
  add_options(app, raw);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    options.help = true;
    return options;
  } catch (const CLI::ParseError& e) {
    throw usage_error(e.what());
  }
  options.program = app.remaining();
  if (!options.program.empty() && options.program.front() == "--") {
    options.program.erase(options.program.begin());
  } else if (!options.program.empty() && options.program.front().size() > 1 && options.program.front()[0] == '-') {
    throw usage_error("unknown option '" + options.program.front() + "'");
  }

  if (app.count("--hosts") > 0 && app.count("--hostfile") > 0) throw usage_error("give --hosts or --hostfile, not both");
  if (app.count("--hosts") > 0) options.hosts = parse_hosts(raw.hosts, "--hosts");
  if (app.count("--hostfile") > 0) options.hosts = read_hostfile(raw.hostfile);
  int slots = 0;
  for (const host_slots& h : options.hosts) slots += h.slots;
  if (slots > max_workers) {
    throw usage_error("the hosts have " + std::to_string(slots) + " slots (expected at most " +
                      std::to_string(max_workers) + " workers)");
  }
  if (app.count("--ps") > 0) {
    options.ps = parse_int("--ps", raw.ps, 1, max_workers, ("a number of ps tasks (1.." + std::to_string(max_workers) + ")").c_str());
  }
  options.chief = raw.chief;
  const int roles = options.ps + (options.chief ? 1 : 0);  // tasks besides the workers
  if (app.count("-n") == 0 && options.hosts.empty()) throw usage_error("missing -n N (the number of workers)");
  if (app.count("-n") > 0) {
    options.num_workers = parse_int("-n", raw.num_workers, 1, max_workers,
                                    ("a positive number of workers (1.." + std::to_string(max_workers) + ")").c_str()) +
                          roles;
    if (options.num_workers > max_workers) {
      throw usage_error("-n " + raw.num_workers + " with --ps and --chief makes " + std::to_string(options.num_workers) +
                        " tasks (expected at most " + std::to_string(max_workers) + ")");
    }
    if (!options.hosts.empty() && options.num_workers != slots) {
      throw usage_error("-n " + raw.num_workers + (roles > 0 ? " and the chief and ps tasks make " + std::to_string(options.num_workers) + " tasks," : "") +
                        " but the hosts have " + std::to_string(slots) +
                        " slots (give one of them, or make them agree)");
    }
  } else {
    options.num_workers = slots;
    if (slots - roles < 1) {
      throw usage_error("the hosts have " + std::to_string(slots) + " slots, which leaves no worker besides the " +
                        std::to_string(roles) + " chief and ps task(s)");
    }
  }
  {
    std::istringstream words(raw.rsh);
    options.rsh.clear();
    for (std::string w; words >> w;) options.rsh.push_back(w);
    if (options.rsh.empty()) throw usage_error("--rsh: expected a command, got '" + raw.rsh + "'");
  }
  if (app.count("--log-dir") > 0) {
    if (raw.log_dir.empty()) throw usage_error("--log-dir: expected a directory, got ''");
    options.log_dir = raw.log_dir;
  }
  if (app.count("--devices-per-worker") > 0) {
    options.devices_per_worker =
        parse_int("--devices-per-worker", raw.devices_per_worker, 1, 1024, "a positive number of devices (1..1024)");
  }
  if (app.count("--port-base") > 0) {
    options.port_base = parse_int("--port-base", raw.port_base, 1, 65535, "a TCP port (1..65535)");
  }
  if (app.count("--timeout") > 0) options.timeout_s = parse_seconds("--timeout", raw.timeout, false);
  options.grace_s = parse_seconds("--grace", raw.grace, true);
  options.max_restarts = parse_int("--max-restarts", raw.max_restarts, 0, max_restarts_limit,
                                   ("a number of restarts (0.." + std::to_string(max_restarts_limit) + ")").c_str());
  options.restart_backoff_s = parse_seconds("--restart-backoff", raw.restart_backoff, true);
  options.elastic = raw.elastic;
  if (!options.elastic && (app.count("--min") > 0 || app.count("--max") > 0)) {
    throw usage_error(std::string(app.count("--min") > 0 ? "--min" : "--max") + " needs --elastic");
  }
  if (app.count("--min") > 0) {
    options.min_workers = parse_int("--min", raw.min_workers, 1, options.num_workers,
                                    ("a number of workers (1.." + std::to_string(options.num_workers) + ")").c_str());
  }
  if (app.count("--max") > 0) {
    options.max_workers =
        parse_int("--max", raw.max_workers, std::max(options.num_workers, options.min_workers.value_or(1)), 65536,
                  ("a number of workers (" + std::to_string(options.num_workers) + "..65536, at least -n)").c_str());
  }

  if (app.count("--ranks") > 0) {
    // Host discovery may add workers up to --max: their ranks may be shown too.
    int ranks = options.num_workers;
    if (app.count("--host-discovery-script") > 0 && options.max_workers) ranks = std::min(*options.max_workers, max_workers);
    std::istringstream list(raw.ranks);
    for (std::string r; std::getline(list, r, ',');) {
      options.ranks.push_back(parse_int("--ranks", trimmed(r), 0, ranks - 1, ("a rank 0.." + std::to_string(ranks - 1)).c_str()));
    }
  }
  if (app.count("--host-discovery-script") > 0) {
    if (!options.elastic) throw usage_error("--host-discovery-script needs --elastic");
    if (raw.discovery_script.empty()) throw usage_error("--host-discovery-script: expected a path, got ''");
    if (::access(raw.discovery_script.c_str(), X_OK) != 0) {
      throw usage_error("--host-discovery-script: '" + raw.discovery_script + "' is not an executable file");
    }
    if (options.ps > 0 || options.chief) {
      throw usage_error("--host-discovery-script adds and removes MultiWorkerMirroredStrategy workers; not with --ps or --chief");
    }
    for (const host_slots& h : options.hosts) {
      if (!is_local_host(h.host)) {
        throw usage_error("--host-discovery-script starts workers on this machine only (127.0.0.1, localhost): host '" +
                          h.host + "' would need --rsh, which host discovery does not support");
      }
    }
    options.discovery_script = raw.discovery_script;
    options.discovery_interval_s = parse_seconds("--discovery-interval", raw.discovery_interval, false);
    options.discovery_timeout_s = parse_seconds("--discovery-timeout", raw.discovery_timeout, false);
    options.leave_timeout_s = parse_seconds("--leave-timeout", raw.leave_timeout, false);
    // The workers are local: started directly on free ports (or --port-base), the hosts kept as
    // the workers' places.
    options.discovery_hosts = std::move(options.hosts);
    options.hosts.clear();
  } else if (app.count("--discovery-interval") > 0 || app.count("--discovery-timeout") > 0 ||
             app.count("--leave-timeout") > 0) {
    throw usage_error(std::string(app.count("--discovery-interval") > 0   ? "--discovery-interval"
                                  : app.count("--discovery-timeout") > 0 ? "--discovery-timeout"
                                                                         : "--leave-timeout") +
                      " needs --host-discovery-script");
  }

  if (options.program.empty()) throw usage_error("no program to run (expected: -- program args...)");
  int per_host = options.num_workers;  // the most workers on one host, each with its own port
  if (!options.hosts.empty()) {
    per_host = 0;
    for (const host_slots& h : options.hosts) per_host = std::max(per_host, h.slots);
  }
  if (options.port_base && *options.port_base + per_host - 1 > 65535)
    throw usage_error("--port-base " + std::to_string(*options.port_base) + ": ports up to " +
                      std::to_string(*options.port_base + per_host - 1) + " for " +
                      std::to_string(per_host) + " workers (expected at most 65535)");
  return options;
}

std::vector<host_slots> parse_hosts(const std::string& list, const std::string& option) {
  std::vector<host_slots> hosts;
  std::istringstream in(list);
  for (std::string entry; std::getline(in, entry, ',');) {
    if (trimmed(entry).empty()) throw usage_error(option + ": an empty entry in '" + list + "'");
    hosts.push_back(parse_host(entry, option));
  }
  if (hosts.empty()) throw usage_error(option + ": expected host[:N],..., got '" + list + "'");
  return hosts;
}

std::vector<host_slots> read_hostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw usage_error("--hostfile: cannot read '" + path + "'");
  std::vector<host_slots> hosts;
  int line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    if (trimmed(line).empty()) continue;
    hosts.push_back(parse_host(line, "--hostfile: " + path + ":" + std::to_string(line_number)));
  }
  if (hosts.empty()) throw usage_error("--hostfile: '" + path + "' names no host");
  return hosts;
}

std::string usage_text() {
  raw_options raw;
  CLI::App app{description, "troupe-launch"};
  add_options(app, raw);
  return app.help();
}

}  // namespace troupe::launch
