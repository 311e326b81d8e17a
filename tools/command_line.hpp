#pragma once
// How troupe's tools end a bad command line: the program's name, CLI11's message (the option and
// the value) and a hint, then exit status 2, as troupe-launch does; never CLI11's own exit codes
// (105 for a value out of range, 109 for an unknown flag, ...).

#include <iostream>
#include <optional>

#include <CLI/CLI.hpp>

namespace troupe::tools {

/// Parses the command line with `app`: nullopt to go on, else the exit status to return from
/// main: 0 after --help, 2 for a bad command line.
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

}  // namespace troupe::tools
