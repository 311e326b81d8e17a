// troupe-doctor DIR: reads every worker's flight recorder dump in DIR (flight_recorder.rank<R>.json,
// docs/diagnosis.md) and names the first cross-worker collective where the workers disagree (op,
// dtype or bytes, with the ranks on each side), the ranks that never entered a collective the
// others wait in, ranks without a dump, failed collectives, and the slowest rank of each step.
// Exit status: 0 when it finds no fault; 1 when it finds one; 2 for a bad command line or a dump
// that cannot be read (the file and the field on stderr).
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "command_line.hpp"
#include "doctor/doctor.hpp"

int main(int argc, char** argv) {
  CLI::App app{"troupe-doctor: names the rank at fault from every worker's flight recorder dump", "troupe-doctor"};
  std::string dir;
  std::size_t steps = 10;
  // Not ->required(): CLI11 checks requirements before unknown flags, and "--step" deserves its own
  // message rather than "DIR is required".
  app.add_option("DIR", dir, "the directory every worker's TROUPE_FLIGHT_RECORDER_DIR wrote into")->type_name("DIR");
  app.add_option("--steps", steps, "steps shown in the slowest-rank table (the last ones)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1000000}))
      ->type_name("N");
  if (auto rc = troupe::tools::parse_command_line(app, argc, argv)) return *rc;
  if (dir.empty()) {
    std::cerr << "troupe-doctor: no DIR given (the directory of the workers' flight recorder dumps)\n"
                 "Run with --help for more information.\n";
    return 2;
  }
  try {
    const auto found = troupe::doctor::diagnose(troupe::doctor::read_dumps(dir), steps);
    std::cout << found.text;
    return found.fault ? 1 : 0;
  } catch (const troupe::doctor::dump_error& e) {
    std::cerr << "troupe-doctor: " << e.what() << "\n";
    return 2;
  }
}
