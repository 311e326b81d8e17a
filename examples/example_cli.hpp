#pragma once
// What every example program shares: a command line parsed by CLI11 (--help with the defaults,
// --flag=value, numbers checked) and errors turned into a message and an exit status, never a
// terminate.

#include <exception>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

namespace troupe::examples {

/// An application whose --help shows every option's default.
inline void show_defaults(CLI::App& app) { app.option_defaults()->always_capture_default(); }

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
