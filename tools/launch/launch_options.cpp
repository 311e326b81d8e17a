#include "launch/launch_options.hpp"

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>

namespace troupe::launch {
namespace {

int parse_int(const std::string& option, const std::string& value, long min, long max,
              const char* expected) {
  errno = 0;
  char* end = nullptr;
  long parsed = value.empty() ? 0 : std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno == ERANGE || parsed < min || parsed > max)
    throw usage_error(option + ": expected " + expected + ", got '" + value + "'");
  return static_cast<int>(parsed);
}

double parse_seconds(const std::string& option, const std::string& value, bool zero_allowed) {
  char* end = nullptr;
  double parsed = value.empty() ? 0 : std::strtod(value.c_str(), &end);
  // A bound of more than a year is a typo; it would also overflow the clock arithmetic.
  bool ok = !value.empty() && *end == '\0' && std::isfinite(parsed) && parsed <= 366.0 * 86400 &&
            (zero_allowed ? parsed >= 0 : parsed > 0);
  if (!ok)
    throw usage_error(option + ": expected " +
                      (zero_allowed ? "a number of seconds >= 0" : "a number of seconds > 0") +
                      ", got '" + value + "'");
  return parsed;
}

}  // namespace

launch_options parse_launch_options(const std::vector<std::string>& args) {
  launch_options options;
  bool have_n = false;
  std::size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      options.help = true;
      return options;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the program, without a "--" before it

    // Split "--name=value" and "-nVALUE"; other options take the next argument as their value.
    std::string name = arg;
    std::optional<std::string> value;
    if (arg.rfind("--", 0) == 0) {
      auto eq = arg.find('=');
      if (eq != std::string::npos) {
        name = arg.substr(0, eq);
        value = arg.substr(eq + 1);
      }
    } else if (arg.rfind("-n", 0) == 0 && arg.size() > 2) {
      name = "-n";
      value = arg.substr(2);
    }
    bool known = name == "-n" || name == "--num-workers" || name == "--devices-per-worker" ||
                 name == "--port-base" || name == "--timeout" || name == "--grace";
    if (!known) throw usage_error("unknown option '" + arg + "'");
    if (!value) {
      if (i + 1 >= args.size()) throw usage_error(name + ": missing value");
      value = args[++i];
    }

    if (name == "-n" || name == "--num-workers") {
      options.num_workers =
          parse_int(name, *value, 1, max_workers,
                    ("a positive number of workers (1.." + std::to_string(max_workers) + ")").c_str());
      have_n = true;
    } else if (name == "--devices-per-worker") {
      options.devices_per_worker =
          parse_int(name, *value, 1, 1024, "a positive number of devices (1..1024)");
    } else if (name == "--port-base") {
      options.port_base = parse_int(name, *value, 1, 65535, "a TCP port (1..65535)");
    } else if (name == "--timeout") {
      options.timeout_s = parse_seconds(name, *value, false);
    } else {
      options.grace_s = parse_seconds(name, *value, true);
    }
  }
  options.program.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());

  if (!have_n) throw usage_error("missing -n N (the number of workers)");
  if (options.program.empty()) throw usage_error("no program to run (expected: -- program args...)");
  if (options.port_base && *options.port_base + options.num_workers - 1 > 65535)
    throw usage_error("--port-base " + std::to_string(*options.port_base) + ": ports up to " +
                      std::to_string(*options.port_base + options.num_workers - 1) + " for " +
                      std::to_string(options.num_workers) + " workers (expected at most 65535)");
  return options;
}

std::string usage_text() {
  return R"(usage: troupe-launch -n N [--devices-per-worker K] [--port-base P] [--timeout SECONDS]
                     [--grace SECONDS] [--] program [args...]

Starts N local copies of program, each with TF_CONFIG naming the cluster (127.0.0.1 on N free
ports) and its own task index, and supervises them.

  -n, --num-workers N       how many workers to start (1..256)
  --devices-per-worker K    set TROUPE_DEVICES_PER_WORKER=K for every worker
  --port-base P             use the ports P..P+N-1 (each checked free) instead of free ones
  --timeout SECONDS         stop every worker and exit 124 after SECONDS
  --grace SECONDS           wait between SIGTERM and SIGKILL when stopping workers (default 5)
  -h, --help                print this help

Every line worker i writes is prefixed with "[rank i] ", on stdout or stderr as the worker wrote
it. SIGINT and SIGTERM are forwarded to every worker. When a worker fails, the others are stopped.
Workers read their standard input from /dev/null.

Exit status: 0 when every worker succeeds; the status of the first worker to fail (128+signal when
a signal killed it); 124 on --timeout; 128+signal when the launcher got SIGINT or SIGTERM;
127 when the program cannot be executed; 2 for bad usage; 1 when the launcher itself fails.
)";
}

}  // namespace troupe::launch
