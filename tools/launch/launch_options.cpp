#include "launch/launch_options.hpp"

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>

#include <CLI/CLI.hpp>

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

namespace {

// The command line's options, as strings: CLI11 splits "--name=value", "-nVALUE" and "--", and
// parse_int / parse_seconds check the values with the messages above.
struct raw_options {
  std::string num_workers, devices_per_worker, port_base, timeout;
  std::string grace = "5";
};

void add_options(CLI::App& app, raw_options& raw) {
  app.add_option("-n,--num-workers", raw.num_workers, "how many workers to start (1..256)")->type_name("N");
  app.add_option("--devices-per-worker", raw.devices_per_worker,
                 "set TROUPE_DEVICES_PER_WORKER=K for every worker")->type_name("K");
  app.add_option("--port-base", raw.port_base, "use the ports P..P+N-1 (each checked free) instead of free ones")
      ->type_name("P");
  app.add_option("--timeout", raw.timeout, "stop every worker and exit 124 after SECONDS")->type_name("SECONDS");
  app.add_option("--grace", raw.grace, "wait between SIGTERM and SIGKILL when stopping workers")
      ->type_name("SECONDS")
      ->capture_default_str();
  app.prefix_command();  // the program and its arguments are not ours
  app.footer(R"(The program follows the options, after "--" or as the first argument that is not an option.

Every line worker i writes is prefixed with "[rank i] ", on stdout or stderr as the worker wrote
it. SIGINT and SIGTERM are forwarded to every worker. When a worker fails, the others are stopped.
Workers read their standard input from /dev/null.

Exit status: 0 when every worker succeeds; the status of the first worker to fail (128+signal when
a signal killed it); 124 on --timeout; 128+signal when the launcher got SIGINT or SIGTERM;
127 when the program cannot be executed; 2 for bad usage; 1 when the launcher itself fails.)");
}

const char* description =
    "troupe-launch -n N [options] [--] program [args...]\n"
    "Starts N local copies of program, each with TF_CONFIG naming the cluster (127.0.0.1 on N free\n"
    "ports) and its own task index, and supervises them.\n";

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

  if (raw.num_workers.empty() && app.count("-n") == 0) throw usage_error("missing -n N (the number of workers)");
  options.num_workers = parse_int("-n", raw.num_workers, 1, max_workers,
                                  ("a positive number of workers (1.." + std::to_string(max_workers) + ")").c_str());
  if (app.count("--devices-per-worker") > 0) {
    options.devices_per_worker =
        parse_int("--devices-per-worker", raw.devices_per_worker, 1, 1024, "a positive number of devices (1..1024)");
  }
  if (app.count("--port-base") > 0) {
    options.port_base = parse_int("--port-base", raw.port_base, 1, 65535, "a TCP port (1..65535)");
  }
  if (app.count("--timeout") > 0) options.timeout_s = parse_seconds("--timeout", raw.timeout, false);
  options.grace_s = parse_seconds("--grace", raw.grace, true);

  if (options.program.empty()) throw usage_error("no program to run (expected: -- program args...)");
  if (options.port_base && *options.port_base + options.num_workers - 1 > 65535)
    throw usage_error("--port-base " + std::to_string(*options.port_base) + ": ports up to " +
                      std::to_string(*options.port_base + options.num_workers - 1) + " for " +
                      std::to_string(options.num_workers) + " workers (expected at most 65535)");
  return options;
}

std::string usage_text() {
  raw_options raw;
  CLI::App app{description, "troupe-launch"};
  add_options(app, raw);
  return app.help();
}

}  // namespace troupe::launch
