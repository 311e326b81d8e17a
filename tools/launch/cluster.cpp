#include "launch/cluster.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace troupe::launch {
namespace {

// A socket closed on every path out of pick_free_ports.
class socket_fd {
 public:
  socket_fd() : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    if (fd_ < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  }
  socket_fd(socket_fd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  socket_fd(const socket_fd&) = delete;
  socket_fd& operator=(const socket_fd&) = delete;
  socket_fd& operator=(socket_fd&&) = delete;
  ~socket_fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

sockaddr_in loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

}  // namespace

std::vector<int> pick_free_ports(int count, std::optional<int> base) {
  std::vector<int> ports;
  // Every socket stays open until all are picked, so the kernel hands out distinct ports.
  std::vector<socket_fd> held;
  for (int i = 0; i < count; ++i) {
    socket_fd sock;
    int wanted = base ? *base + i : 0;
    if (base) {
      // A port in TIME_WAIT is free for a worker that sets SO_REUSEADDR; a listener is not.
      int one = 1;
      ::setsockopt(sock.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    }
    sockaddr_in addr = loopback(wanted);
    if (::bind(sock.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
        (base && ::listen(sock.get(), 1) != 0)) {
      int err = errno;
      if (base)
        throw std::runtime_error("port " + std::to_string(wanted) + " on " + local_host +
                                 " is in use (--port-base " + std::to_string(*base) + " needs " +
                                 std::to_string(*base) + ".." + std::to_string(*base + count - 1) +
                                 " free): " + std::strerror(err));
      throw std::runtime_error(std::string("cannot bind a free port on ") + local_host + ": " +
                               std::strerror(err));
    }
    socklen_t len = sizeof addr;
    if (::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      throw std::runtime_error(std::string("getsockname: ") + std::strerror(errno));
    ports.push_back(ntohs(addr.sin_port));
    held.push_back(std::move(sock));
  }
  return ports;
}

std::vector<std::string> worker_addresses(const std::vector<int>& ports) {
  std::vector<std::string> addresses;
  addresses.reserve(ports.size());
  for (int port : ports) addresses.push_back(std::string(local_host) + ":" + std::to_string(port));
  return addresses;
}

std::vector<std::string> host_addresses(const std::vector<host_slots>& hosts, int port_base) {
  std::vector<std::string> addresses;
  for (const host_slots& h : hosts) {
    for (int i = 0; i < h.slots; ++i) addresses.push_back(h.host + ":" + std::to_string(port_base + i));
  }
  return addresses;
}

namespace {

// Addresses are "host:<digits>", host names from the command line: escape what JSON needs.
std::string json_list(const std::vector<std::string>& addresses, std::size_t from, std::size_t to) {
  std::string json = "[";
  for (std::size_t i = from; i < to; ++i) {
    if (i > from) json += ", ";
    json += '"';
    for (char c : addresses[i]) {
      if (c == '"' || c == '\\') json += '\\';
      json += c;
    }
    json += '"';
  }
  return json + "]";
}

}  // namespace

std::string tf_config_json(const std::vector<std::string>& addresses, int index) {
  return tf_config_json(addresses, index, false, 0);
}

std::string tf_config_json(const std::vector<std::string>& addresses, int rank, bool chief, int ps) {
  const std::size_t n = addresses.size();
  const std::size_t first_worker = chief ? 1 : 0;
  const std::size_t first_ps = n - static_cast<std::size_t>(ps);
  std::string json = R"({"cluster": {)";
  if (chief) json += R"("chief": )" + json_list(addresses, 0, 1) + ", ";
  json += R"("worker": )" + json_list(addresses, first_worker, first_ps);
  if (ps > 0) json += R"(, "ps": )" + json_list(addresses, first_ps, n);
  const auto r = static_cast<std::size_t>(rank);
  std::string type = "worker";
  std::size_t index = r - first_worker;
  if (chief && r == 0) {
    type = "chief";
    index = 0;
  } else if (r >= first_ps) {
    type = "ps";
    index = r - first_ps;
  }
  json += R"(}, "task": {"type": ")" + type + R"(", "index": )" + std::to_string(index) + "}}";
  return json;
}

}  // namespace troupe::launch
