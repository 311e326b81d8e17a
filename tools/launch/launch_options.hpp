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

/// What the command line asks for.
struct launch_options {
  int num_workers = 0;                    ///< -n N: how many workers to start
  std::optional<int> devices_per_worker;  ///< --devices-per-worker K: TROUPE_DEVICES_PER_WORKER
  std::optional<int> port_base;           ///< --port-base P: ports P..P+N-1 instead of free ones
  std::optional<double> timeout_s;        ///< --timeout SECONDS: stop everything, exit 124
  double grace_s = default_grace_s;       ///< --grace SECONDS: SIGTERM to SIGKILL
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

/// The help text, ending with a newline.
std::string usage_text();

}  // namespace troupe::launch
