// troupe-launch -n N [--devices-per-worker K] [--port-base P] [--timeout SECONDS] -- program args
// troupe-launch --hosts h1:2,h2:2 [--rsh CMD] -- program args
//
// Starts N local workers of one program (or workers on other hosts through a remote shell), each with the TF_CONFIG that MultiWorkerMirroredStrategy
// reads (one "worker" job on 127.0.0.1, N free ports, its own index), prefixes their output with
// their rank, and stops them all when one fails. supervisor.hpp describes how.

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "launch/cluster.hpp"
#include "launch/launch_options.hpp"
#include "launch/supervisor.hpp"

namespace {

// With fd 0, 1 or 2 closed, the first pipe would take its number and a worker's dup2 would go
// wrong; /dev/null keeps the numbers taken.
void keep_standard_fds_open() {
  for (int fd = 0; fd <= 2; ++fd)
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF) ::open("/dev/null", O_RDWR);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace troupe::launch;
  keep_standard_fds_open();

  launch_options options;
  try {
    options = parse_launch_options(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const usage_error& e) {
    std::cerr << "troupe-launch: " << e.what() << "\nRun with --help for more information.\n" << std::flush;
    return 2;
  }
  if (options.help) {
    std::cout << usage_text() << std::flush;
    return 0;
  }

  if (!options.hosts.empty()) {
    return supervise(options, host_addresses(options.hosts, options.port_base.value_or(default_hosts_port_base)));
  }
  std::vector<int> ports;
  try {
    ports = pick_free_ports(options.num_workers, options.port_base);
  } catch (const std::exception& e) {
    std::cerr << "troupe-launch: " << e.what() << std::endl;
    return 1;
  }
  return supervise(options, worker_addresses(ports));
}
