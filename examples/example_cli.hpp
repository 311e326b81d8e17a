#pragma once
// What every example program shares: a command line parsed by CLI11 (--help with the defaults,
// --flag=value, numbers checked) and errors turned into a message and an exit status, never a
// terminate.

#include <cmath>
#include <exception>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <type_traits>

#include <CLI/CLI.hpp>
#include <troupe/base/parse_number.hpp>
#include <troupe/monitor.hpp>

namespace troupe::examples {

/// An application whose --help shows every option's default.
inline void show_defaults(CLI::App& app) { app.option_defaults()->always_capture_default(); }

namespace detail {

// A number as a person writes it: "0.9", "1e+30", never std::to_string's "0.900000" or DBL_MAX's
// 309 digits.
template <class T>
std::string readable(T value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// The widest type of T's kind: a value beyond T is then still a number, refused by its range.
template <class T>
using wide_t = std::conditional_t<std::is_floating_point_v<T>, double,
                                  std::conditional_t<std::is_unsigned_v<T>, unsigned long long, long long>>;

// The option's value read as a person writes a number: decimal only, the whole text and finite
// (troupe's one reader of numbers; CLI11's own conversion would take "0x10" as 16 and "inf"), or
// nullopt.
template <class T>
std::optional<wide_t<T>> converted(const std::string& text) {
  if constexpr (std::is_floating_point_v<T>) {
    const std::optional<double> v = base::parse_double(text);
    if (!v || !std::isfinite(*v)) return std::nullopt;
    return v;
  } else if constexpr (std::is_unsigned_v<T>) {
    return base::parse_uint(text);
  } else {
    return base::parse_int(text);
  }
}

// What a text that converted() refused is not.
template <class T>
std::string not_a_number(const std::string& text) {
  return text + (std::is_floating_point_v<T> ? " is not a finite decimal number" : " is not a decimal integer");
}

}  // namespace detail

/// A check that the number is in min..max, both included; a value outside reads
/// "--epochs: 0 is not in 1..1000000".
template <class T>
CLI::Validator in_range(T min, T max) {
  const std::string range = detail::readable(min) + ".." + detail::readable(max);
  return CLI::Validator(
      [min, max, range](std::string& text) -> std::string {
        const auto value = detail::converted<T>(text);
        if (!value) return detail::not_a_number<T>(text);
        if (!(*value >= static_cast<detail::wide_t<T>>(min) && *value <= static_cast<detail::wide_t<T>>(max))) {
          return text + " is not in " + range;
        }
        return {};
      },
      range);
}

/// A check that the number is above zero; otherwise "--lr: -1 is not > 0".
inline CLI::Validator positive() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const std::optional<double> value = detail::converted<double>(text);
        if (!value) return detail::not_a_number<double>(text);
        if (!(*value > 0)) return text + " is not > 0";
        return {};
      },
      "POSITIVE");
}

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
    // --trace-steps was checked when parsed (add_monitor_options).
    const auto colon = trace_steps.find(':');
    o.trace_first_step = base::parse_int(std::string_view(trace_steps).substr(0, colon)).value_or(1);
    o.trace_last_step = base::parse_int(std::string_view(trace_steps).substr(colon + 1)).value_or(1);
    o.global_batch_size = global_batch_size;
    return o;
  }
};

inline void add_monitor_options(CLI::App& app, MonitorFlags& f) {
  app.add_option("--dashboard-port", f.dashboard_port,
                 "serve the live dashboard on PORT (0: any free port; the URL is printed; -1: none)")
      ->check(in_range(-1, 65535));
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
            const auto step = [](std::string_view d) -> std::optional<long long> {
              if (d.empty() || d.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
              return base::parse_int(d);  // digits only: no sign; too many for the type is refused
            };
            const std::optional<long long> a =
                colon == std::string::npos ? std::nullopt : step(std::string_view(v).substr(0, colon));
            const std::optional<long long> b =
                colon == std::string::npos ? std::nullopt : step(std::string_view(v).substr(colon + 1));
            if (!a || !b) return "expected A:B, e.g. 10:110, got \"" + v + "\"";
            if (*a < 1 || *b < *a) return "expected 1 <= A <= B, got " + v;
            return {};
          },
          "A:B"));
}

/// Parses the command line with `app`: nullopt to go on, else the exit status: 0 after --help,
/// 2 for a bad command line (CLI11's message names the option and the value, then the hint).
/// Never CLI11's own exit codes (105 for a value out of range, 109 for an unknown flag, ...).
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << app.get_name() << ": " << e.what() << "\nRun with --help for more information.\n";
    return 2;
  }
  return std::nullopt;
}

/// The exit status of a task that cannot listen on its address in the cluster spec because
/// another process holds the port (std::system_error with std::errc::address_in_use, as
/// MultiWorkerMirroredStrategy and Server throw it): EADDRINUSE's number on Linux. troupe-launch,
/// which picked the port free, starts the cluster again on fresh ports when a task exits with it.
inline constexpr int address_in_use_exit_code = 98;

/// Parses the command line with `app`, then returns body(). Exit status: body's; 0 for --help;
/// 2 for a bad command line (parse_command_line); address_in_use_exit_code when this task's port
/// is held by another process; 1 for another error that reaches here (a malformed TROUPE_*
/// variable, a file that cannot be read, ...), with the program's name and the error's message on
/// stderr.
template <class Body>
int run_main(CLI::App& app, int argc, char** argv, Body&& body) {
  if (const std::optional<int> status = parse_command_line(app, argc, argv)) return *status;
  try {
    return body();
  } catch (const std::system_error& e) {
    std::cerr << app.get_name() << ": " << e.what() << "\n";
    return e.code() == std::errc::address_in_use ? address_in_use_exit_code : 1;
  } catch (const std::exception& e) {
    std::cerr << app.get_name() << ": " << e.what() << "\n";
    return 1;
  }
}

}  // namespace troupe::examples
