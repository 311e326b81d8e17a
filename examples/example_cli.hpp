#pragma once
// What every example program shares: a command line parsed by CLI11 (--help with the defaults,
// --flag=value, numbers checked) and errors turned into a message and an exit status, never a
// terminate.

#include <exception>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>
#include <troupe/monitor.hpp>

namespace troupe::examples {

/// An application whose --help shows every option's default.
inline void show_defaults(CLI::App& app) { app.option_defaults()->always_capture_default(); }

/// The dashboard and trace flags every trainer takes.
struct MonitorFlags {
  int dashboard_port = -1;
  std::string dashboard_address = "127.0.0.1";
  std::string dashboard_token;
  std::string trace;
  std::string trace_steps = "10:110";

  /// Whether the run is watched at all (a dashboard or a trace).
  bool enabled() const { return dashboard_port >= 0 || !trace.empty(); }

  troupe::MonitorOptions options(std::int64_t global_batch_size) const {
    troupe::MonitorOptions o;
    o.dashboard_port = dashboard_port;
    o.dashboard_address = dashboard_address;
    o.dashboard_token = dashboard_token;
    o.trace_file = trace;
    const auto colon = trace_steps.find(':');
    o.trace_first_step = std::stoll(trace_steps.substr(0, colon));
    o.trace_last_step = std::stoll(trace_steps.substr(colon + 1));
    o.global_batch_size = global_batch_size;
    return o;
  }
};

inline void add_monitor_options(CLI::App& app, MonitorFlags& f) {
  app.add_option("--dashboard-port", f.dashboard_port,
                 "serve the live dashboard on PORT (0: any free port; the URL is printed; -1: none)")
      ->check(CLI::Range(-1, 65535));
  app.add_option("--dashboard-address", f.dashboard_address,
                 "the address the dashboard binds (anything but loopback needs --dashboard-token)");
  app.add_option("--dashboard-token", f.dashboard_token,
                 "a secret the dashboard's every request must carry (?token= or Authorization: Bearer)")
      ->envname("TROUPE_DASHBOARD_TOKEN");
  app.add_option("--trace", f.trace, "write a Chrome trace (Perfetto, chrome://tracing) of --trace-steps to FILE");
  app.add_option("--trace-steps", f.trace_steps, "the steps --trace records, A:B, both included")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            const auto colon = v.find(':');
            const auto digits = [](const std::string& d) {
              return !d.empty() && d.size() < 16 && d.find_first_not_of("0123456789") == std::string::npos;
            };
            if (colon == std::string::npos || !digits(v.substr(0, colon)) || !digits(v.substr(colon + 1))) {
              return "expected A:B, e.g. 10:110, got \"" + v + "\"";
            }
            const long long a = std::stoll(v.substr(0, colon)), b = std::stoll(v.substr(colon + 1));
            if (a < 1 || b < a) return "expected 1 <= A <= B, got " + v;
            return {};
          },
          "A:B"));
}

/// Parses the command line with `app`, then returns body(). Exit status: body's; 0 for --help;
/// 2 for a bad command line (CLI11's message names the option and the value); 1 for an error
/// that reaches here (a malformed TROUPE_* variable, a file that cannot be read, ...), with the
/// program's name and the error's message on stderr.
template <class Body>
int run_main(CLI::App& app, int argc, char** argv, Body&& body) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << app.get_name() << ": " << e.what() << "\nRun with --help for more information.\n";
    return 2;
  }
  try {
    return body();
  } catch (const std::exception& e) {
    std::cerr << app.get_name() << ": " << e.what() << "\n";
    return 1;
  }
}

}  // namespace troupe::examples
