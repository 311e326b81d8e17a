#include "troupe/transport/ring_connect.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio.hpp>

#include <cerrno>
#include <climits>
#include <cstring>
#include <optional>
#include <thread>

#include "ring_frames.hpp"
#include "troupe/transport/ring_index.hpp"

namespace troupe::transport {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using frames::deadline;

std::string errno_text() { return std::strerror(errno); }

bool peer_gone(int error) { return error == ECONNRESET || error == EPIPE || error == ENOTCONN; }

std::string peer_name(int peer, const std::vector<endpoint>& peers) {
  return "rank " + std::to_string(peer) + " (" + peers[static_cast<std::size_t>(peer)].to_string() + ")";
}

// Runs the one operation started on `io` until its handler sets `finished` or the deadline passes;
// then `cancel` aborts it and its handler runs with operation_aborted. The handler's error code
// tells the caller which happened (an operation that completed just at the deadline keeps its
// result).
template <class Cancel>
void run_with_deadline(asio::io_context& io, const bool& finished, const deadline& until, Cancel&& cancel) {
  io.restart();
  while (!finished) {
    const int ms = until.poll_ms();
    if (ms < 0) {
      io.run_one();
      continue;
    }
    io.run_one_for(std::chrono::milliseconds(ms));
    if (!finished && until.passed()) break;
  }
  if (finished) return;
  cancel();
  io.restart();
  while (!finished) io.run_one();
}

// Nagle off (a ring step's last segment must not wait for an ACK) and non-blocking: the ring
// drives the native handle with sendmsg/read and poll().
void prepare_for_frames(tcp::socket& socket, int peer, const std::string& name) {
  boost::system::error_code ec;
  socket.set_option(tcp::no_delay(true), ec);
  if (!ec) socket.non_blocking(true, ec);
  if (ec) throw peer_error(peer, "cannot set up the connection with " + name + ": " + ec.message());
}

// Connects to `ep` (a host name or address), retrying while nobody listens there yet, until the
// deadline. Each attempt is bounded by the deadline too.
tcp::socket connect_with_retry(asio::io_context& io, const endpoint& ep, const deadline& until, int peer,
                               const std::string& name) {
  tcp::resolver resolver(io);
  std::string last_error = "no attempt";
  for (;;) {
    boost::system::error_code ec;
    // Synchronous: getaddrinfo cannot be cancelled, so an asynchronous resolve would not be bounded
    // either. A name the resolver does not know fails at once; a temporary failure is retried.
    const auto results = resolver.resolve(tcp::v4(), ep.host, std::to_string(ep.port), ec);
    if (ec && ec != asio::error::host_not_found_try_again) {
      throw peer_error(peer, "cannot resolve " + name + ": " + ec.message());
    }
    if (ec) last_error = ec.message();
    for (const auto& entry : results) {
      tcp::socket socket(io);
      bool finished = false;
      boost::system::error_code result;
      socket.async_connect(entry.endpoint(), [&](const boost::system::error_code& e) {
        result = e;
        finished = true;
      });
      run_with_deadline(io, finished, until, [&] {
        boost::system::error_code ignored;
        socket.close(ignored);
      });
      if (!result) {
        prepare_for_frames(socket, peer, name);
        return socket;
      }
      last_error = result == asio::error::operation_aborted ? "no answer" : result.message();
    }
    if (until.passed()) {
      throw peer_error(peer, "could not connect to " + name + " before the timeout: " + last_error);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// A rank's two TCP connections. Set up through Boost.Asio; once connected, the ring drives the
// sockets' native handles with sendmsg/read and poll(): tuned for latency, with no reactor in
// between.
class socket_link final : public ring_link {
 public:
  socket_link(ring_peer next, ring_peer prev) : ring_link(std::move(next), std::move(prev)) {}

  // `io` is declared first so that it outlives the sockets.
  asio::io_context io;
  std::optional<tcp::socket> next_socket;
  std::optional<tcp::socket> prev_socket;
  int next_fd = -1;  // to rank + 1: next_socket's native handle
  int prev_fd = -1;  // from rank - 1: prev_socket's native handle

  std::size_t write_some(ring_side side, const iovec* iov, std::size_t count) override {
    const int fd = side == ring_side::next ? next_fd : prev_fd;
    for (;;) {
      // sendmsg with MSG_NOSIGNAL: a peer that has gone away is an error here, never a SIGPIPE.
      msghdr msg{};
      msg.msg_iov = const_cast<iovec*>(iov);
      msg.msg_iovlen = std::min<std::size_t>(count, IOV_MAX);
      const ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL);
      if (w >= 0) return static_cast<std::size_t>(w);
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      if (errno == EINTR) continue;
      if (peer_gone(errno)) throw_gone(side);
      throw peer_error(peer(side).rank, "sending to " + peer(side).name + " failed: " + errno_text());
    }
  }

  std::size_t read_some(ring_side side, void* into, std::size_t n) override {
    const int fd = side == ring_side::next ? next_fd : prev_fd;
    for (;;) {
      const ssize_t r = read(fd, into, n);
      if (r > 0) return static_cast<std::size_t>(r);
      if (r == 0) throw_gone(side);
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      if (errno == EINTR) continue;
      if (peer_gone(errno)) throw_gone(side);
      throw peer_error(peer(side).rank, "receiving from " + peer(side).name + " failed: " + errno_text());
    }
  }

  bool wait(const ring_wants& wants, int timeout_ms) override {
    const short next_events = static_cast<short>((wants.write_next ? POLLOUT : 0) | (wants.read_next ? POLLIN : 0));
    const short prev_events = static_cast<short>((wants.read_prev ? POLLIN : 0) | (wants.write_prev ? POLLOUT : 0));
    pollfd fds[2];
    nfds_t n = 0;
    if (next_events != 0) fds[n++] = {next_fd, next_events, 0};
    if (prev_events != 0) fds[n++] = {prev_fd, prev_events, 0};
    const int rc = poll(fds, n, timeout_ms);
    if (rc < 0 && errno == EINTR) return true;
    if (rc < 0) throw std::runtime_error("tcp_ring: poll failed: " + errno_text());
    return rc > 0;
  }

  void shutdown() noexcept override {
    if (next_fd >= 0) ::shutdown(next_fd, SHUT_RDWR);
    if (prev_fd >= 0) ::shutdown(prev_fd, SHUT_RDWR);
  }
};

}  // namespace

struct listener::impl {
  asio::io_context io;  // runs the acceptor's asynchronous accept in connect_ring
  tcp::acceptor acceptor{io};
};

listener::listener(const std::string& host, std::uint16_t port) : impl_(std::make_unique<impl>()) {
  boost::system::error_code ec;
  const auto address = asio::ip::make_address_v4(host, ec);
  if (ec) throw std::invalid_argument("listener: \"" + host + "\" is not an IPv4 address");
  auto& acceptor = impl_->acceptor;
  acceptor.open(tcp::v4(), ec);
  if (ec) throw std::runtime_error("listener: cannot open a socket: " + ec.message());
  // SO_REUSEADDR: a port whose last connections linger in TIME_WAIT can be listened on again at
  // once (troupe-launch hands workers such ports).
  acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(tcp::endpoint(address, port), ec);
  if (!ec) acceptor.listen(64, ec);
  tcp::endpoint bound;
  if (!ec) bound = acceptor.local_endpoint(ec);
  if (ec) {
    throw std::runtime_error("listener: cannot listen on " + host + ":" + std::to_string(port) + ": " + ec.message());
  }
  port_ = bound.port();
  fd_ = acceptor.native_handle();
}

listener::~listener() = default;

std::unique_ptr<ring_link> connect_ring(int rank, int size, listener& own, const std::vector<endpoint>& peers,
                                        std::chrono::milliseconds timeout, std::uint32_t version) {
  if (size == 1) return nullptr;
  const int next = ring_index::next_rank(rank, size);
  const int prev = ring_index::prev_rank(rank, size);
  auto link = std::make_unique<socket_link>(ring_peer{next, peer_name(next, peers)},
                                            ring_peer{prev, peer_name(prev, peers)});
  auto& s = *link;
  const std::string& next_name = s.peer(ring_side::next).name;
  const std::string& prev_name = s.peer(ring_side::prev).name;
  const deadline until(timeout);
  s.next_socket.emplace(connect_with_retry(s.io, peers[static_cast<std::size_t>(next)], until, next, next_name));
  s.next_fd = s.next_socket->native_handle();

  // Accept the predecessor: anyone may connect, only a hello from rank-1 is kept.
  auto& acceptor = own.impl_->acceptor;
  for (;;) {
    tcp::socket socket(s.io);
    bool finished = false;
    boost::system::error_code result;
    acceptor.async_accept(socket, [&](const boost::system::error_code& e) {
      result = e;
      finished = true;
    });
    run_with_deadline(own.impl_->io, finished, until, [&] {
      boost::system::error_code ignored;
      acceptor.cancel(ignored);
    });
    if (!result) {
      prepare_for_frames(socket, prev, prev_name);
      s.prev_socket.emplace(std::move(socket));
      s.prev_fd = s.prev_socket->native_handle();
      break;
    }
    if (result == asio::error::operation_aborted) {
      throw peer_error(prev, "timed out waiting for " + prev_name + " to connect");
    }
    // A connection that was reset before it was accepted: wait for the next one.
    if (result == asio::error::connection_aborted || result == asio::error::interrupted ||
        result == asio::error::try_again) {
      continue;
    }
    throw std::runtime_error("tcp_ring: accepting " + prev_name + " failed: " + result.message());
  }

  // Hellos both ways, as frames through the same checked reader as the collectives': the successor
  // learns who we are, we check who our predecessor is.
  frames::frame_pump pump(&s);
  pump.to_next.start_hello(version, static_cast<std::uint32_t>(rank), static_cast<std::uint32_t>(size));
  pump.from_prev.start(64);
  pump.exchange(until, timeout, frames::spin_policy{});
  pump.from_prev.take_hello(s, version, static_cast<std::uint32_t>(size));
  return link;
}

}  // namespace troupe::transport
