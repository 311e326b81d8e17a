#pragma once

// Loopback ports that were free a moment ago, for tests that need to name an address before
// anything listens on it (a chief's address in a cluster spec). Several ports for one cluster
// come from free_ports(n): each socket stays bound until all n are picked, so the kernel cannot
// hand out one port twice (free_port() called n times may).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::testing {

/// n distinct loopback ports, free when this returns.
inline std::vector<std::uint16_t> free_ports(int n) {
  std::vector<int> fds;
  std::vector<std::uint16_t> ports;
  const auto close_all = [&] {
    for (int fd : fds) close(fd);
  };
  for (int i = 0; i < n; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
      const int e = errno;
      close_all();
      throw std::runtime_error(std::string("free_ports: socket: ") + std::strerror(e));
    }
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      const int e = errno;
      close_all();
      throw std::runtime_error(std::string("free_ports: bind on 127.0.0.1: ") + std::strerror(e));
    }
    ports.push_back(ntohs(addr.sin_port));
  }
  close_all();
  return ports;
}

/// One loopback port, free when this returns.
inline std::uint16_t free_port() { return free_ports(1).front(); }

/// n distinct "127.0.0.1:port" addresses (free_ports).
inline std::vector<std::string> loopback_addresses(int n) {
  std::vector<std::string> out;
  for (std::uint16_t p : free_ports(n)) out.push_back("127.0.0.1:" + std::to_string(p));
  return out;
}

}  // namespace troupe::testing
