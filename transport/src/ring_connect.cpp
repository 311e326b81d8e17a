#include "troupe/transport/ring_connect.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio.hpp>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>

#include "proof_exchange.hpp"
#include "ring_frames.hpp"
#include "ring_proof.hpp"
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
  asio::io_context io;
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

int connect_socket(const endpoint& ep, const frames::deadline& until, int peer, const std::string& name) {
  asio::io_context io;
  tcp::socket socket = connect_with_retry(io, ep, until, peer, name);
  boost::system::error_code ec;
  const int fd = socket.release(ec);
  if (ec) throw peer_error(peer, "cannot set up the connection with " + name + ": " + ec.message());
  return fd;
}

std::string remote_of(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || addr.sin_family != AF_INET) return "?";
  const asio::ip::address_v4 address(ntohl(addr.sin_addr.s_addr));
  return address.to_string() + ":" + std::to_string(ntohs(addr.sin_port));
}

std::string ipv4_of(const std::string& host, const std::string& what) {
  boost::system::error_code ec;
  asio::ip::make_address_v4(host, ec);
  if (!ec) return host;
  asio::io_context io;
  tcp::resolver resolver(io);
  const auto results = resolver.resolve(tcp::v4(), host, "0", ec);
  if (ec || results.empty()) {
    throw std::runtime_error(what + ": cannot resolve \"" + host + "\" to an IPv4 address" +
                             (ec ? " (" + ec.message() + ")" : std::string()));
  }
  return results.begin()->endpoint().address().to_string();
}

namespace {

// A connection accepted on the listener whose proof is under way; owns its socket.
struct pending_connection {
  pending_connection(int f, std::string r, std::unique_ptr<proof_exchange> p)
      : fd(f), remote(std::move(r)), exchange(std::move(p)) {}
  ~pending_connection() {
    if (fd >= 0) close(fd);
  }
  pending_connection(const pending_connection&) = delete;
  pending_connection& operator=(const pending_connection&) = delete;
  int fd;
  std::string remote;
  std::unique_ptr<proof_exchange> exchange;
};

// Connections whose proof may be under way at once: more are refused, oldest first.
constexpr std::size_t max_pending_connections = 32;

void log_refusal(int rank, const std::string& remote, const std::string& why) {
  std::fprintf(stderr, "troupe: ring rank %d refused a connection from %s: %s\n", rank, remote.c_str(), why.c_str());
}

// Non-blocking while the ring forms: it accepts whatever waits, then goes back to poll(). The
// listener's own mode comes back afterwards.
struct non_blocking_while {
  explicit non_blocking_while(int f) : fd(f), flags(fcntl(f, F_GETFL)) {
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
      throw std::runtime_error("tcp_ring: cannot set up the listening socket: " + errno_text());
    }
  }
  ~non_blocking_while() { fcntl(fd, F_SETFL, flags); }
  non_blocking_while(const non_blocking_while&) = delete;
  non_blocking_while& operator=(const non_blocking_while&) = delete;
  int fd;
  int flags;
};

// Accepts every connection waiting on the non-blocking listener and starts its proof; when too
// many are proving themselves at once, the oldest makes room (`refuse(0, why)`).
template <class Refuse, class StartProof>
void accept_waiting(int listen_fd, std::vector<std::unique_ptr<pending_connection>>& pending, Refuse&& refuse,
                    StartProof&& start_proof) {
  for (;;) {
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // EAGAIN: none left. Out of descriptors or memory: the listener stays readable, so pause
      // before the next poll rather than spin.
      if (errno != EAGAIN && errno != EWOULDBLOCK) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    std::string remote = remote_of(fd);
    if (pending.size() >= max_pending_connections) refuse(0, "too many connections at once proving themselves");
    try {
      auto exchange = start_proof(fd, remote);
      pending.push_back(std::make_unique<pending_connection>(fd, std::move(remote), std::move(exchange)));
    } catch (...) {
      close(fd);
      throw;
    }
  }
}

}  // namespace

std::unique_ptr<ring_link> connect_ring(int rank, int size, listener& own, const std::vector<endpoint>& peers,
                                        std::chrono::milliseconds timeout, std::uint32_t version,
                                        const ring_auth& auth, tag_hashing hashing) {
  if (size == 1) return nullptr;
  const int next = ring_index::next_rank(rank, size);
  const int prev = ring_index::prev_rank(rank, size);
  auto link = std::make_unique<socket_link>(ring_peer{next, peer_name(next, peers)},
                                            ring_peer{prev, peer_name(prev, peers)});
  auto& s = *link;
  const std::string& next_name = s.peer(ring_side::next).name;
  const std::string& prev_name = s.peer(ring_side::prev).name;
  const deadline until(timeout);

  // The successor: connect, then prove both ways; a listener there that fails the proof is
  // dropped and tried again.
  std::unique_ptr<proof_exchange> to_next;
  std::string next_failure;
  int retry_ms = 50;
  auto connect_next = [&] {
    s.next_socket.emplace(connect_with_retry(s.io, peers[static_cast<std::size_t>(next)], until, next, next_name));
    s.next_fd = s.next_socket->native_handle();
    to_next = std::make_unique<proof_exchange>(proof_exchange::role::connecting, s.next_fd, auth, version, rank, next,
                                               size, next_name);
  };
  connect_next();

  // The predecessor: every connection to the listener runs its proof at once, so that a stranger
  // (silent, slow or lying) never holds up rank-1's.
  const int listen_fd = own.fd();
  const non_blocking_while listen_mode(listen_fd);
  std::vector<std::unique_ptr<pending_connection>> pending;
  std::vector<std::uint8_t> prev_key;  // the frame tags' key of the connection from rank-1
  int refused = 0;
  bool have_prev = false;
  auto refuse = [&](std::size_t i, const std::string& why) {
    log_refusal(rank, pending[i]->remote, why);
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
    ++refused;
  };
  while (!have_prev || !to_next->done()) {
    std::vector<pollfd> fds;
    if (!have_prev) {
      fds.push_back({listen_fd, POLLIN, 0});
      for (const auto& p : pending) fds.push_back({p->fd, p->exchange->events(), 0});
    }
    if (!to_next->done()) fds.push_back({s.next_fd, to_next->events(), 0});
    const int rc = poll(fds.data(), fds.size(), until.poll_ms());
    if (rc < 0 && errno != EINTR) throw std::runtime_error("tcp_ring: poll failed: " + errno_text());
    if (rc == 0 && until.passed()) {
      const std::string others =
          refused > 0 ? " (refused " + std::to_string(refused) + " other connection(s) that failed the proof; see the "
                                                                  "log)"
                      : "";
      if (!have_prev) throw peer_error(prev, "timed out waiting for " + prev_name + " to connect and prove itself" + others);
      throw peer_error(next, "timed out waiting for " + next_name + " to prove itself" +
                                 (next_failure.empty() ? "" : " (last attempt: " + next_failure + ")"));
    }
    if (!have_prev) {
      accept_waiting(listen_fd, pending, refuse, [&](int fd, const std::string& remote) {
        return std::make_unique<proof_exchange>(proof_exchange::role::accepting, fd, auth, version, rank, prev, size,
                                                "the connection from " + remote);
      });
      for (std::size_t i = 0; i < pending.size() && !have_prev;) {
        try {
          pending[i]->exchange->progress();
        } catch (const std::exception& e) {
          refuse(i, e.what());
          continue;
        }
        if (!pending[i]->exchange->done()) {
          ++i;
          continue;
        }
        // rank-1 proved itself: its socket becomes the ring's.
        tcp::socket socket(s.io);
        boost::system::error_code ec;
        socket.assign(tcp::v4(), pending[i]->fd, ec);
        if (ec) throw peer_error(prev, "cannot set up the connection with " + prev_name + ": " + ec.message());
        pending[i]->fd = -1;
        prev_key = pending[i]->exchange->frame_key();
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        prepare_for_frames(socket, prev, prev_name);
        s.prev_socket.emplace(std::move(socket));
        s.prev_fd = s.prev_socket->native_handle();
        have_prev = true;
      }
    }
    if (!to_next->done()) {
      try {
        to_next->progress();
      } catch (const std::exception& e) {
        // A close before the acknowledgement is a refusal (pushed out by strangers while it proved
        // itself, or the peer was not ready), worth another try like a failed proof.
        next_failure = dynamic_cast<const peer_error*>(&e) != nullptr
                           ? "it closed the connection before acknowledging this rank's proof (refused: too many "
                             "connections proving themselves there at once, or it was not ready)"
                           : e.what();
        std::fprintf(stderr, "troupe: ring rank %d dropped its connection to %s: %s; trying again\n", rank,
                     next_name.c_str(), next_failure.c_str());
        s.next_socket.reset();
        s.next_fd = -1;
        // Backing off: a misconfigured peer is tried (and logged) a few times a second at most.
        retry_ms = std::min(2 * retry_ms, 1000);
        const int left = until.poll_ms();
        std::this_thread::sleep_for(std::chrono::milliseconds(left < 0 ? retry_ms : std::min(retry_ms, left)));
        try {
          connect_next();
        } catch (const peer_error&) {
          if (!until.passed()) throw;
          throw peer_error(next, "timed out waiting for " + next_name + " to prove itself (last attempt: " +
                                     next_failure + ")");
        }
      }
    }
  }
  // Whoever is still proving itself once the ring is formed is not rank-1.
  for (const auto& p : pending) {
    log_refusal(rank, p->remote, "it had not proven itself when the ring was formed");
  }
  if (!auth.token.empty()) {
    // Every frame from now on carries its tag, under each connection's own key: direction 0 is
    // the connecting rank's, 1 the accepting rank's.
    const auto next_key = to_next->frame_key();
    // One thread beside the rank's own hashes its large frames, both ways on both connections,
    // where the machine has a core for it (tag_hashing).
    const bool beside = hashing == tag_hashing::beside ||
                        (hashing == tag_hashing::automatic && frames::tag_thread::spare_cores(size));
    const auto helper = beside ? std::make_shared<frames::tag_thread>() : nullptr;
    s.set_frame_macs(ring_side::next, std::make_shared<frames::frame_mac>(next_key, 0, helper),
                     std::make_shared<frames::frame_mac>(next_key, 1, helper));
    s.set_frame_macs(ring_side::prev, std::make_shared<frames::frame_mac>(prev_key, 1, helper),
                     std::make_shared<frames::frame_mac>(prev_key, 0, helper));
  }
  return link;
}

}  // namespace troupe::transport
