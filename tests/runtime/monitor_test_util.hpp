#pragma once
// What the Monitor tests share: one HTTP request to its dashboard, a response's JSON body, a step.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "../common/free_port.hpp"
#include "test_util.hpp"
#include "troupe/troupe.hpp"

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::message_of;

namespace monitor_test {

// One HTTP/1.1 request to 127.0.0.1:port; returns the whole response ("" when it cannot connect).
inline std::string http(int port, const std::string& method, const std::string& target, const std::string& header = "") {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string req = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
                            "\r\nContent-Length: 0\r\n" + header +
                            "Connection: close\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
    }
  }
  close(fd);
  return out;
}

// The body of an HTTP response, parsed.
inline nlohmann::json body_of(const std::string& response) {
  const auto at = response.find("\r\n\r\n");
  REQUIRE(at != std::string::npos);
  return nlohmann::json::parse(response.substr(at + 4));
}

inline Tensor one_step(MirroredStrategy& s) {
  auto r = s.run([] { return get_replica_context()->all_reduce(ReduceOp::sum, Tensor::scalar<float>(1.0f)); });
  return r.values()[0];
}

}  // namespace monitor_test
