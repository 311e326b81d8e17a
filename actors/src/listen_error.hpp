#pragma once
// What a task throws when it cannot listen on its address of the cluster spec. A port another
// process holds is told apart from every other failure: a program that started on a port picked
// free (troupe-launch picks them) can then be started again on fresh ones. Internal to actors/.

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <system_error>

namespace troupe::actors {

/// Whether another socket holds `port` on `host`: a bind there, with SO_REUSEADDR as CAF's
/// listeners set it (so a port whose old connections linger in TIME_WAIT is free), fails with
/// EADDRINUSE now. Asked after a listen failed: CAF's error keeps no errno.
inline bool port_in_use(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found) != 0) return false;
  bool in_use = false;
  for (addrinfo* a = found; a != nullptr && !in_use; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    in_use = ::bind(fd, a->ai_addr, a->ai_addrlen) != 0 && errno == EADDRINUSE;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return in_use;
}

/// Throws `what` (which says who cannot listen where, and why) for a listen on host:port that
/// failed: std::system_error with std::errc::address_in_use when another process holds the port
/// (port_in_use), which a program started by troupe-launch turns into exit status 98; else
/// std::runtime_error.
[[noreturn]] inline void throw_cannot_listen(const std::string& what, const std::string& host, std::uint16_t port) {
  if (port != 0 && port_in_use(host, port)) throw std::system_error(std::make_error_code(std::errc::address_in_use), what);
  throw std::runtime_error(what);
}

}  // namespace troupe::actors
