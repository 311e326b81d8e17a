// A stranger on a worker's ring port, for run_cluster.sh: it finds the port the worker (or the
// child of the `timeout` wrapper with that pid) listens on, connects during start-up and plays one
// attack:
//   old-hello  a well-formed hello of protocol version 4 as rank 0 (no proof), then forged
//              all-reduce frames of 1e6
//   replay     two connections as rank 0 with the same nonce; each gets the worker's answer, then
//              sends the proof the worker gave on the other connection
//   garbage    4 KiB of random bytes
//   silent     connects and says nothing
// Usage: ring_stranger MODE PID. Prints "attacking <port> bound to <address>" once connected (the script starts the
// rest of the cluster then), and "closed" when the worker closed every connection. Exits 0 when
// the worker refused the stranger (closed its connections), 1 otherwise; bounded by 30 s.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <troupe/transport/memory_ring.hpp>
#include <troupe/transport/tcp_ring.hpp>

using namespace troupe::transport;

namespace {

constexpr int limit_ms = 30000;

// The socket inodes of `pid` and its children.
std::set<std::string> socket_inodes(const std::string& pid) {
  std::set<std::string> out;
  std::vector<std::string> pids{pid};
  std::ifstream children("/proc/" + pid + "/task/" + pid + "/children");
  for (std::string c; children >> c;) pids.push_back(c);
  for (const auto& p : pids) {
    for (int fd = 0; fd < 1024; ++fd) {
      char target[256] = {};
      const std::string path = "/proc/" + p + "/fd/" + std::to_string(fd);
      const ssize_t n = readlink(path.c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      const std::string t(target, static_cast<std::size_t>(n));
      if (t.rfind("socket:[", 0) == 0) out.insert(t.substr(8, t.size() - 9));
    }
  }
  return out;
}

// The first TCP port in LISTEN state among `pid`'s sockets (0 when none yet), and the address it
// is bound to.
int listening_port(const std::string& pid, std::string& bound) {
  const auto inodes = socket_inodes(pid);
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  std::getline(tcp, line);
  while (std::getline(tcp, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    in >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
    if (state == "0A" && inodes.count(inode) != 0) {
      in_addr a{};
      a.s_addr = static_cast<in_addr_t>(std::stoul(local.substr(0, local.find(':')), nullptr, 16));
      bound = inet_ntoa(a);
      return std::stoi(local.substr(local.find(':') + 1), nullptr, 16);
    }
  }
  return 0;
}

int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    std::perror("ring_stranger: connect");
    std::exit(1);
  }
  return fd;
}

void send_all(int fd, const std::vector<unsigned char>& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (w <= 0) return;  // the worker closed it already: what a refusal looks like
    done += static_cast<std::size_t>(w);
  }
}

// Reads exactly n bytes within the limit; false when the connection closed or the time ran out.
bool read_exactly(int fd, unsigned char* into, std::size_t n) {
  std::size_t have = 0;
  while (have < n) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, limit_ms) <= 0) return false;
    const ssize_t r = read(fd, into + have, n - have);
    if (r <= 0) return false;
    have += static_cast<std::size_t>(r);
  }
  return true;
}

// One frame (segment table, segments) from the worker; empty when the connection closed.
std::vector<unsigned char> read_frame(int fd) {
  std::vector<unsigned char> frame(8);
  if (!read_exactly(fd, frame.data(), 8)) return {};
  std::uint32_t table[2];
  std::memcpy(table, frame.data(), 8);
  const std::uint32_t segments = table[0] + 1;
  if (segments > 4) return {};
  const std::size_t table_bytes = ((segments + 2) / 2) * 8;
  frame.resize(table_bytes);
  if (table_bytes > 8 && !read_exactly(fd, frame.data() + 8, table_bytes - 8)) return {};
  std::vector<std::uint32_t> sizes(segments + 1);
  std::memcpy(sizes.data(), frame.data(), (segments + 1) * 4);
  std::size_t body = 0;
  for (std::uint32_t i = 1; i <= segments; ++i) body += sizes[i] * 8;
  frame.resize(table_bytes + body);
  if (!read_exactly(fd, frame.data() + table_bytes, body)) return {};
  return frame;
}

// Waits until the worker closes `fd` (a refusal), within the limit.
bool closed_by_worker(int fd) {
  unsigned char sink[4096];
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit_ms);
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t r = read(fd, sink, sizeof sink);
    if (r <= 0) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: ring_stranger old-hello|replay|garbage|silent PID\n";
    return 2;
  }
  const std::string mode = argv[1];
  const std::string pid = argv[2];
  int port = 0;
  std::string bound;
  for (int i = 0; i < 1000 && port == 0; ++i) {
    port = listening_port(pid, bound);
    if (port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (port == 0) {
    std::cerr << "ring_stranger: process " << pid << " listens on no port\n";
    return 1;
  }
  std::vector<int> fds;
  std::mt19937 random(std::random_device{}());
  if (mode == "old-hello") {
    const int fd = connect_to(port);
    fds.push_back(fd);
    hello_frame_fields hello;
    hello.version = 4;  // the protocol before the proof
    hello.rank = 0;
    hello.size = 2;
    send_all(fd, encode_hello_frame(hello));
    chunk_fields forged;
    forged.count = 4;
    forged.total = 16;
    const float big[4] = {1e6f, 1e6f, 1e6f, 1e6f};
    forged.data.resize(sizeof big);
    std::memcpy(forged.data.data(), big, sizeof big);
    for (int k = 0; k < 10; ++k) {
      forged.sequence = static_cast<std::uint64_t>(k);
      send_all(fd, encode_chunk_frame(forged));
    }
    std::cout << "attacking " << port << " bound to " << bound << std::endl;
  } else if (mode == "replay") {
    hello_frame_fields hello;
    hello.version = tcp_ring::protocol_version;
    hello.rank = 0;
    hello.size = 2;
    hello.nonce.resize(16);
    for (auto& b : hello.nonce) b = static_cast<unsigned char>(random());
    for (int i = 0; i < 2; ++i) {
      fds.push_back(connect_to(port));
      send_all(fds.back(), encode_hello_frame(hello));
    }
    std::cout << "attacking " << port << " bound to " << bound << std::endl;
    // The worker answers each with its nonce and proof; each connection then replays the proof
    // the worker gave on the other.
    std::vector<hello_frame_fields> answers;
    for (int fd : fds) {
      const auto frame = read_frame(fd);
      const auto answer = frame.empty() ? std::nullopt : decode_hello_frame(frame);
      if (!answer) {
        std::cout << "no answer to the hello (refused before the proof)" << std::endl;
        answers.push_back({});
        continue;
      }
      answers.push_back(*answer);
    }
    for (std::size_t i = 0; i < fds.size(); ++i) {
      hello_frame_fields replayed;
      replayed.version = tcp_ring::protocol_version;
      replayed.rank = 0;
      replayed.size = 2;
      replayed.proof = answers[1 - i].proof;
      if (replayed.proof.empty()) replayed.proof.assign(32, 0);
      send_all(fds[i], encode_hello_frame(replayed));
    }
    std::cout << "replayed" << std::endl;
  } else if (mode == "garbage") {
    const int fd = connect_to(port);
    fds.push_back(fd);
    std::vector<unsigned char> junk(4096);
    for (auto& b : junk) b = static_cast<unsigned char>(random());
    send_all(fd, junk);
    std::cout << "attacking " << port << " bound to " << bound << std::endl;
  } else if (mode == "silent") {
    fds.push_back(connect_to(port));
    std::cout << "attacking " << port << " bound to " << bound << std::endl;
  } else {
    std::cerr << "ring_stranger: unknown mode " << mode << "\n";
    return 2;
  }
  bool all_closed = true;
  for (int fd : fds) all_closed = closed_by_worker(fd) && all_closed;
  std::cout << (all_closed ? "closed" : "still open") << std::endl;
  return all_closed ? 0 : 1;
}
