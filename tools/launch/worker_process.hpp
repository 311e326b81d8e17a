#pragma once
// One supervised worker as the launcher sees it: its process group and the two pipes its output
// comes through (supervisor.hpp describes how they are watched).

#include <sys/types.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include "launch/line_prefixer.hpp"

namespace troupe::launch {

using clock = std::chrono::steady_clock;

/// One of a worker's output pipes and where its lines go.
struct output_stream {
  int fd = -1;      ///< read end of the worker's pipe, non-blocking; -1 once closed
  int target = -1;  ///< STDOUT_FILENO or STDERR_FILENO of the launcher
  bool show = true;  ///< false: --ranks leaves this worker off the terminal
  int log_fd = -1;   ///< --log-dir: the worker's log file (both streams share it; owned by worker)
  line_prefixer lines;
  output_stream(int target_fd, const std::string& prefix) : target(target_fd), lines(prefix) {}
};

/// A worker of the launch, started or not.
struct worker {
  int rank;
  std::string address;
  pid_t pid = -1;  ///< also the id of its process group
  bool running = false;
  std::optional<clock::time_point> stopped_since;  ///< --elastic: stopped (SIGSTOP) since
  int log_fd = -1;  ///< --log-dir DIR: DIR/rank-<i>.log
  std::array<output_stream, 2> streams;

  worker(int r, std::string addr)
      : rank(r),
        address(std::move(addr)),
        streams{output_stream(STDOUT_FILENO, "[rank " + std::to_string(r) + "] "),
                output_stream(STDERR_FILENO, "[rank " + std::to_string(r) + "] ")} {}

  /// "worker 1 (pid 123, 127.0.0.1:4001)", as the launcher's messages name it.
  std::string describe() const {
    return "worker " + std::to_string(rank) + " (pid " + std::to_string(pid) + ", " + address + ")";
  }
};

}  // namespace troupe::launch
