#pragma once

// The benchmarks' own --troupe_NAME=VALUE flags, parsed with CLI11 (values checked) and taken out
// of argv before Google Benchmark reads the rest.

#include <cstring>
#include <iostream>
#include <vector>

#include <CLI/CLI.hpp>

namespace troupe::bench {

/// Parses every --troupe_* argument with `app` and leaves the others, in order, in argv for
/// Google Benchmark. Returns -1 to go on, or the exit status: 0 after --troupe_help, 2 after a bad
/// value (the message names the flag and the value).
inline int take_own_flags(CLI::App& app, int& argc, char** argv) {
  constexpr const char* prefix = "--troupe_";
  app.set_help_flag("--troupe_help", "print the benchmark's own flags (Google Benchmark's: --help)");
  for (CLI::Option* option : app.get_options()) option->capture_default_str();  // --troupe_help shows them
  std::vector<char*> ours{argv[0]};
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix, std::strlen(prefix)) == 0) {
      ours.push_back(argv[i]);
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
  try {
    app.parse(static_cast<int>(ours.size()), ours.data());
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << app.get_name() << ": " << e.what() << "\nRun with --troupe_help for the own flags.\n";
    return 2;
  }
  return -1;
}

}  // namespace troupe::bench
