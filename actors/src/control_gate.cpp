#include "control_gate.hpp"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <sys/time.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <list>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "caf/io/basp_broker.hpp"
#include "caf/io/middleman_actor_impl.hpp"
#include "caf/io/network/default_multiplexer.hpp"
#include "caf/io/network/doorman_impl.hpp"
// GCC 12 takes stream::handle_event_impl's written-bytes count, set by the policy's write before
// it is read, for an uninitialised read once the gate's policy is inlined: a false alarm.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "caf/io/network/stream_impl.hpp"
#pragma GCC diagnostic pop
#include "caf/openssl/session.hpp"
#include "caf/policy/tcp.hpp"
#include "troupe/actors/cluster_health.hpp"

namespace troupe::actors {

using caf::io::network::native_socket;
using caf::io::network::rw_state;
using default_mpx = caf::io::network::default_multiplexer;

gate_limits gate_limits::for_cluster(int workers) {
  gate_limits l;
  const int n = std::max(workers, 1);
  l.max_payload_bytes = 64 * 1024 + 1024 * static_cast<std::uint32_t>(std::min(n, 1 << 20));
  l.max_connections = 16 + 4 * std::min(n, 1 << 20);
  return l;
}

gate_limits gate_limits::for_tasks() {
  gate_limits l;
  l.max_payload_bytes = std::numeric_limits<std::uint32_t>::max();
  l.max_connections = 64;
  return l;
}

// A TLS connection whose handshake has not finished: it is closed when its deadline passes, when
// newer ones push it out, or when the gate goes, so that neither a process's exit nor a member's
// connection ever waits on it.
struct unproven_session {
  native_socket fd;
  bool accepted;
  std::chrono::steady_clock::time_point deadline;
  bool evicted = false;    // pushed out by a newer connection
  bool timed_out = false;  // its deadline passed
};

struct gate_shared {
  gate_limits limits;
  bool tls = false;
  std::atomic<int> open{0};              // accepted connections not proven (all without TLS)
  std::atomic<std::uint64_t> refused{0};
  std::shared_ptr<cluster_health> health;  // where refusals are recorded too (may be null)

  // The TLS sessions still in their handshake, oldest first. A session's entry leaves the list
  // (under the mutex) before its socket is closed, so a socket shut down here is always its own.
  std::mutex sessions_mutex;
  std::list<std::shared_ptr<unproven_session>> sessions;

  std::shared_ptr<unproven_session> track(native_socket fd, bool accepted) {
    auto s = std::make_shared<unproven_session>(
        unproven_session{fd, accepted, std::chrono::steady_clock::now() + limits.handshake_timeout});
    std::lock_guard<std::mutex> lock(sessions_mutex);
    sessions.push_back(s);
    return s;
  }
  void forget(const std::shared_ptr<unproven_session>& s) {
    std::lock_guard<std::mutex> lock(sessions_mutex);
    sessions.remove(s);
  }
  // Accepted sessions still proving themselves and not pushed out yet.
  int accepted_unproven() {
    std::lock_guard<std::mutex> lock(sessions_mutex);
    int n = 0;
    for (const auto& s : sessions) n += s->accepted && !s->evicted && !s->timed_out ? 1 : 0;
    return n;
  }
  // Pushes out the oldest accepted session still proving itself.
  void evict_oldest() {
    std::lock_guard<std::mutex> lock(sessions_mutex);
    for (const auto& s : sessions) {
      if (!s->accepted || s->evicted || s->timed_out) continue;
      s->evicted = true;
      ::shutdown(s->fd, SHUT_RDWR);
      return;
    }
  }
  // Closes the sessions whose deadline passed (all of them with `all`): their reads fail, and the
  // multiplexer drops them.
  void expire(bool all) {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(sessions_mutex);
    for (const auto& s : sessions) {
      if (s->evicted || s->timed_out || (!all && now < s->deadline)) continue;
      s->timed_out = true;
      ::shutdown(s->fd, SHUT_RDWR);
    }
  }

  // `what` names the peer at `address`; `why` is the reason alone. A flood of refusals is logged
  // (and recorded in the cluster's health) at powers of two only, so that both stay bounded too.
  void refuse(const std::string& what, const std::string& address, const std::string& why) {
    const auto n = ++refused;
    if ((n & (n - 1)) == 0) {
      std::cerr << "troupe: control plane: " << what << " (" << n << " refused so far)" << std::endl;
      if (health) {
        health->refused(address, "control plane: " + why + " (" + std::to_string(n) + " refused so far)",
                        cluster_health::clock::now());
      }
    }
  }
};

namespace {

// "127.0.0.1:40312", or "an unknown address".
std::string peer_address(native_socket fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "an unknown address";
  char host[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(ntohs(a->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(a->sin6_port));
  }
  return "an unknown address";
}

// The user that owns the other end of a loopback connection, from the kernel's socket tables;
// nullopt when the peer is not on loopback, or its socket is not in the table (another network
// namespace: no user of this host can be vouched for).
struct loopback_peer {
  bool loopback = false;
  std::optional<uid_t> uid;
};

bool is_loopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&a)->sin_addr.s_addr) >> 24) == 127;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&x)) return true;
    return IN6_IS_ADDR_V4MAPPED(&x) && x.s6_addr[12] == 127;
  }
  return false;
}

// An endpoint as /proc/net/tcp{,6} writes it: the address as native 32-bit words in hex, then
// the port.
std::string proc_endpoint(const sockaddr_storage& a) {
  char out[64] = {};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    std::uint32_t w = 0;
    std::memcpy(&w, &v4->sin_addr, 4);
    std::snprintf(out, sizeof out, "%08X:%04X", w, ntohs(v4->sin_port));
  } else {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    std::uint32_t w[4];
    std::memcpy(w, &v6->sin6_addr, 16);
    std::snprintf(out, sizeof out, "%08X%08X%08X%08X:%04X", w[0], w[1], w[2], w[3], ntohs(v6->sin6_port));
  }
  return out;
}

// The owner of the TCP socket bound to `local` and connected to `remote`, asked of the kernel's
// sock_diag (one exact lookup, microseconds; the text table costs milliseconds when a host has
// many sockets). nullopt when the kernel does not answer.
std::optional<uid_t> socket_owner(const sockaddr_storage& local, const sockaddr_storage& remote) {
  const int nl = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (nl < 0) return std::nullopt;
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } ask{};
  ask.header.nlmsg_len = sizeof ask;
  ask.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  ask.header.nlmsg_flags = NLM_F_REQUEST;
  ask.request.sdiag_family = static_cast<std::uint8_t>(local.ss_family);
  ask.request.sdiag_protocol = IPPROTO_TCP;
  ask.request.idiag_states = ~0u;
  ask.request.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  ask.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  auto fill = [](const sockaddr_storage& a, __be16& port, __be32* addr) {
    if (a.ss_family == AF_INET) {
      const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
      port = v4->sin_port;
      std::memcpy(addr, &v4->sin_addr, 4);
    } else {
      const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
      port = v6->sin6_port;
      std::memcpy(addr, &v6->sin6_addr, 16);
    }
  };
  fill(local, ask.request.id.idiag_sport, ask.request.id.idiag_src);
  fill(remote, ask.request.id.idiag_dport, ask.request.id.idiag_dst);
  timeval wait{1, 0};
  ::setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  std::optional<uid_t> owner;
  if (::sendto(nl, &ask, sizeof ask, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) ==
      static_cast<ssize_t>(sizeof ask)) {
    alignas(nlmsghdr) char buf[8192];
    const ssize_t n = ::recv(nl, buf, sizeof buf, 0);
    if (n > 0) {
      auto len = static_cast<unsigned>(n);
      for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
        if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY && h->nlmsg_len >= NLMSG_LENGTH(sizeof(inet_diag_msg))) {
          owner = static_cast<uid_t>(static_cast<const inet_diag_msg*>(NLMSG_DATA(h))->idiag_uid);
          break;
        }
        if (h->nlmsg_type == NLMSG_ERROR || h->nlmsg_type == NLMSG_DONE) break;
      }
    }
  }
  ::close(nl);
  return owner;
}

loopback_peer peer_on_loopback(native_socket fd) {
  loopback_peer out;
  sockaddr_storage mine{}, theirs{};
  socklen_t a = sizeof mine, b = sizeof theirs;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &a) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &b) != 0 || !is_loopback(theirs)) {
    return out;
  }
  out.loopback = true;
  // An IPv4 peer of a dual-stack socket is in the IPv4 table, as are both its ends.
  auto unmap = [](sockaddr_storage& a) {
    if (a.ss_family != AF_INET6) return;
    const auto v6 = *reinterpret_cast<const sockaddr_in6*>(&a);
    if (!IN6_IS_ADDR_V4MAPPED(&v6.sin6_addr)) return;
    sockaddr_in v4{};
    v4.sin_family = AF_INET;
    v4.sin_port = v6.sin6_port;
    std::memcpy(&v4.sin_addr, &v6.sin6_addr.s6_addr[12], 4);
    a = sockaddr_storage{};
    std::memcpy(&a, &v4, sizeof v4);
  };
  unmap(mine);
  unmap(theirs);
  // The peer's socket: its local end is our remote one and the other way round.
  if ((out.uid = socket_owner(theirs, mine))) return out;
  const std::string local = proc_endpoint(theirs), remote = proc_endpoint(mine);
  std::ifstream table(theirs.ss_family == AF_INET ? "/proc/net/tcp" : "/proc/net/tcp6");
  std::string line;
  std::getline(table, line);  // the column names
  while (std::getline(table, line)) {
    std::istringstream in(line);
    std::string slot, l, r, state, queues, timer, retransmits;
    unsigned long uid = 0;
    if (!(in >> slot >> l >> r >> state >> queues >> timer >> retransmits >> uid)) continue;
    if (l == local && r == remote) {
      out.uid = static_cast<uid_t>(uid);
      break;
    }
  }
  return out;
}

// Without a token, a loopback peer is known by the kernel: the gate lets in only this process's
// own user. Empty when the peer may pass; otherwise why not.
std::string foreign_user(native_socket fd) {
  const auto peer = peer_on_loopback(fd);
  if (!peer.loopback) return {};  // beyond loopback without a token: insecure, by the operator's choice
  if (!peer.uid) return "its socket is not in this host's table, so its user is unknown";
  if (*peer.uid != ::geteuid()) {
    return "it belongs to user " + std::to_string(*peer.uid) + ", this process to user " +
           std::to_string(::geteuid()) + " (without a cluster token only the same user may connect on loopback)";
  }
  return {};
}

// Empties this thread's OpenSSL error queue (see gate_policy::read_some); a look first, since the
// queue is nearly always empty and clearing it walks every slot.
void clear_tls_errors() {
  if (::ERR_peek_error() != 0) ::ERR_clear_error();
}

// The transport policy of every gated connection: TLS (or plain TCP) below, the BASP header
// check above. CAF reads a BASP stream as a 32-byte header, then exactly the payload it declares;
// the gate follows the same stream and refuses a header before CAF parses it.
class gate_policy {
 public:
  static constexpr std::size_t header_bytes = caf::io::basp::header_size;  // 32

  gate_policy(std::shared_ptr<gate_shared> shared, caf::openssl::session_ptr session, std::string peer, bool accepted,
              std::shared_ptr<unproven_session> unproven)
      : shared_(std::move(shared)),
        session_(std::move(session)),
        peer_(std::move(peer)),
        accepted_(accepted),
        counted_(accepted),
        unproven_(std::move(unproven)) {}

  ~gate_policy() {
    if (counted_) --shared_->open;
    if (unproven_) shared_->forget(unproven_);
  }

  // OpenSSL reads its thread's error queue to classify a call that did not succeed, so a queue
  // left behind by another session's failed handshake (a stranger's, on this same multiplexer
  // thread) would make a member's "no data yet" look like a fatal error and close its
  // connection. Every session call starts with an empty queue.
  rw_state read_some(std::size_t& result, native_socket fd, void* buf, std::size_t len) {
    if (failed_) return rw_state::failure;
    if (session_) clear_tls_errors();
    const rw_state st = session_ ? session_->read_some(result, fd, buf, len)
                                 : caf::policy::tcp::read_some(result, fd, buf, len);
    if (st == rw_state::failure) {
      closed();
      return st;
    }
    if (st == rw_state::success && result > 0) {
      proven();
      if (!scan(static_cast<const unsigned char*>(buf), result)) {
        result = 0;
        failed_ = true;
        return rw_state::failure;
      }
    }
    return st;
  }

  rw_state write_some(std::size_t& result, native_socket fd, const void* buf, std::size_t len) {
    if (failed_) return rw_state::failure;
    if (session_) clear_tls_errors();
    const rw_state st = session_ ? session_->write_some(result, fd, buf, len)
                                 : caf::policy::tcp::write_some(result, fd, buf, len);
    if (st == rw_state::failure) closed();
    // Application bytes written over TLS mean that the handshake is done, as bytes read do: a
    // connection that only sends (a worker's heartbeats) is proven too, never expired.
    if (st == rw_state::success && result > 0 && session_) proven();
    return st;
  }

  bool try_accept(native_socket& result, native_socket fd) { return caf::policy::tcp::try_accept(result, fd); }

  bool must_read_more(native_socket fd, std::size_t threshold) {
    if (session_) clear_tls_errors();
    return session_ ? session_->must_read_more(fd, threshold) : false;
  }

 private:
  // Bytes moved: the handshake (if any) is done, the peer holds the token and no longer takes a
  // stranger's slot, and no deadline applies.
  void proven() {
    if (session_ && !proven_ && counted_) {
      counted_ = false;
      --shared_->open;
    }
    if (unproven_) {
      shared_->forget(unproven_);
      unproven_.reset();
    }
    proven_ = true;
  }

  // Follows the stream: false (logged) when a header declares more than the limit.
  bool scan(const unsigned char* p, std::size_t n) {
    while (n > 0) {
      if (payload_left_ > 0) {
        const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(payload_left_, n));
        payload_left_ -= k;
        p += k;
        n -= k;
        continue;
      }
      const std::size_t k = std::min(header_bytes - have_, n);
      std::memcpy(header_ + have_, p, k);
      have_ += k;
      p += k;
      n -= k;
      if (have_ < header_bytes) break;
      have_ = 0;
      // operation, 2 padding bytes, flags, then the payload length, big-endian.
      const std::uint32_t payload = (std::uint32_t{header_[4]} << 24) | (std::uint32_t{header_[5]} << 16) |
                                    (std::uint32_t{header_[6]} << 8) | std::uint32_t{header_[7]};
      if (payload > shared_->limits.max_payload_bytes) {
        const std::string why = "a message header declares " + std::to_string(payload) + " bytes, at most " +
                                std::to_string(shared_->limits.max_payload_bytes) + " accepted";
        shared_->refuse("closed the connection " + direction() + " " + peer_ + ": " + why, peer_, why);
        return false;
      }
      payload_left_ = payload;
    }
    return true;
  }

  void closed() {
    if (failed_) return;
    failed_ = true;
    if (session_ && !proven_) {
      bool evicted = false, timed_out = false;
      if (unproven_) {
        std::lock_guard<std::mutex> lock(shared_->sessions_mutex);
        evicted = unproven_->evicted;
        timed_out = unproven_->timed_out;
      }
      const std::string limit = std::to_string(shared_->limits.handshake_timeout.count()) + " ms";
      std::string why;
      if (evicted) {
        why = "it was pushed out by newer connections before it finished its TLS handshake (at most " +
              std::to_string(shared_->limits.max_connections) + " prove themselves at once)";
      } else if (timed_out) {
        why = "its TLS handshake did not finish within " + limit + " (or this process is stopping)";
      } else if (accepted_) {
        why = "its TLS handshake failed (no cluster token, or another one)";
      } else {
        why = "the other side closed it before the TLS handshake finished (another cluster token, too many "
              "connections proving themselves there at once, or it is stopping; its log says which)";
      }
      shared_->refuse(accepted_ ? "refused the connection from " + peer_ + ": " + why
                                : "the connection to " + peer_ + " failed: " + why,
                      peer_, why);
    }
  }

  std::string direction() const { return accepted_ ? "from" : "to"; }

  std::shared_ptr<gate_shared> shared_;
  caf::openssl::session_ptr session_;
  std::string peer_;
  bool accepted_;
  bool counted_;  // holds one of the listener's slots (gate_shared::open)
  std::shared_ptr<unproven_session> unproven_;  // until the TLS handshake is done
  bool proven_ = false;
  bool failed_ = false;
  unsigned char header_[header_bytes] = {};
  std::size_t have_ = 0;
  std::uint64_t payload_left_ = 0;
};

// A connection through the gate (after CAF's OpenSSL scribe).
class gate_scribe : public caf::io::scribe {
 public:
  gate_scribe(default_mpx& mpx, native_socket fd, std::shared_ptr<gate_shared> shared,
              caf::openssl::session_ptr session, std::string peer, bool accepted)
      : caf::io::scribe(caf::io::network::conn_hdl_from_socket(fd)),
        stream_(mpx, fd, shared, std::move(session), std::move(peer), accepted,
                shared->tls ? shared->track(fd, accepted) : nullptr) {}

  void configure_read(caf::io::receive_policy::config config) override {
    stream_.configure_read(config);
    if (!launched_) launch();
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }
  void flush() override { stream_.flush(this); }
  std::string addr() const override {
    auto x = caf::io::network::remote_addr_of_fd(stream_.fd());
    return x ? *x : std::string();
  }
  std::uint16_t port() const override {
    auto x = caf::io::network::remote_port_of_fd(stream_.fd());
    return x ? *x : 0;
  }
  void launch() {
    launched_ = true;
    stream_.start(this);
    // Lets a TLS session run its handshake before the first write (a nop for plain TCP).
    stream_.force_empty_write(this);
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }

 private:
  bool launched_ = false;
  caf::io::network::stream_impl<gate_policy> stream_;
};

// The chief's listener: every accepted connection gets the gate's policy.
class gate_doorman : public caf::io::network::doorman_impl {
 public:
  gate_doorman(default_mpx& mpx, native_socket fd, std::shared_ptr<gate_shared> shared)
      : caf::io::network::doorman_impl(mpx, fd), shared_(std::move(shared)) {}

  bool new_connection() override {
    if (detached()) return false;
    auto& mpx = acceptor_.backend();
    const native_socket fd = acceptor_.accepted_socket();
    std::string peer = peer_address(fd);
    // With a token, the oldest connection still in its handshake makes room for a new one: a
    // stranger that says nothing holds a place only until newer ones come, and a member that was
    // pushed out connects again. Without a token nothing is proven, so new ones are refused.
    if (shared_->tls && shared_->accepted_unproven() >= shared_->limits.max_connections) shared_->evict_oldest();
    if (!shared_->tls && shared_->open.load() >= shared_->limits.max_connections) {
      const std::string why = std::to_string(shared_->limits.max_connections) +
                              " connections that have not proven the cluster token are open already";
      shared_->refuse("refused a connection from " + peer + ": " + why, peer, why);
      caf::io::network::close_socket(fd);
      return true;  // the listener goes on
    }
    if (!shared_->tls) {
      const std::string why = foreign_user(fd);
      if (!why.empty()) {
        shared_->refuse("refused the connection from " + peer + ": " + why, peer, why);
        caf::io::network::close_socket(fd);
        return true;
      }
    }
    caf::io::network::nonblocking(fd, true);
    caf::openssl::session_ptr session;
    if (shared_->tls) {
      ::ERR_clear_error();  // see gate_policy::read_some
      session = caf::openssl::make_session(parent()->system(), fd, true);
      if (!session) {
        ::ERR_clear_error();
        // The handshake failed at once (the peer's first bytes were there already).
        const std::string why = "its TLS handshake failed (no cluster token, or another one)";
        shared_->refuse("refused the connection from " + peer + ": " + why, peer, why);
        caf::io::network::close_socket(fd);
        return true;
      }
    }
    ++shared_->open;
    auto scribe = caf::make_counted<gate_scribe>(mpx, fd, shared_, std::move(session), std::move(peer), true);
    auto hdl = scribe->hdl();
    parent()->add_scribe(std::move(scribe));
    return doorman::new_connection(&mpx, hdl);
  }

 private:
  std::shared_ptr<gate_shared> shared_;
};

class gate_middleman : public caf::io::middleman_actor_impl {
 public:
  gate_middleman(caf::actor_config& cfg, caf::actor broker, std::shared_ptr<gate_shared> shared)
      : caf::io::middleman_actor_impl(cfg, std::move(broker)), shared_(std::move(shared)) {}

  const char* name() const override { return "troupe.control_gate"; }

 protected:
  caf::expected<caf::io::scribe_ptr> connect(const std::string& host, std::uint16_t port) override {
    auto fd = caf::io::network::new_tcp_connection(host, port);
    if (!fd) return std::move(fd.error());
    std::string peer = peer_address(*fd);
    if (!shared_->tls) {
      // Whoever listens at the chief's address must be the chief's user too: a squatter is not.
      const std::string why = foreign_user(*fd);
      if (!why.empty()) {
        caf::io::network::close_socket(*fd);
        shared_->refuse("refused to talk to " + peer + ": " + why, peer, why);
        return caf::make_error(caf::sec::cannot_connect_to_node, "refused to talk to " + peer + ": " + why);
      }
    }
    caf::io::network::nonblocking(*fd, true);
    caf::openssl::session_ptr session;
    if (shared_->tls) {
      ::ERR_clear_error();
      session = caf::openssl::make_session(system(), *fd, false);
      if (!session) {
        ::ERR_clear_error();
        caf::io::network::close_socket(*fd);
        return caf::make_error(caf::sec::cannot_connect_to_node, "no TLS session for " + peer);
      }
    }
    return caf::make_counted<gate_scribe>(mpx(), *fd, shared_, std::move(session), std::move(peer), false);
  }

  caf::expected<caf::io::doorman_ptr> open(std::uint16_t port, const char* addr, bool reuse) override {
    auto fd = caf::io::network::new_tcp_acceptor_impl(port, addr, reuse);
    if (!fd) return std::move(fd.error());
    return caf::make_counted<gate_doorman>(mpx(), *fd, shared_);
  }

 private:
  default_mpx& mpx() { return static_cast<default_mpx&>(system().middleman().backend()); }
  std::shared_ptr<gate_shared> shared_;
};

}  // namespace

control_gate::control_gate(caf::actor_system& system, bool tls, gate_limits limits,
                           std::shared_ptr<cluster_health> health)
    : system_(system), shared_(std::make_shared<gate_shared>()) {
  shared_->limits = limits;
  shared_->tls = tls;
  shared_->health = std::move(health);
  auto broker = system.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  actor_ = system.spawn<gate_middleman, caf::hidden>(std::move(broker), shared_);
  if (tls) {
    // Every handshake has a deadline.
    watchdog_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(watchdog_mutex_);
      while (!stopping_) {
        watchdog_cv_.wait_for(lock, std::chrono::milliseconds(100));
        shared_->expire(false);
      }
    });
  }
}

control_gate::~control_gate() {
  if (watchdog_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(watchdog_mutex_);
      stopping_ = true;
    }
    watchdog_cv_.notify_all();
    watchdog_.join();
  }
  // Shutdown never waits on a connection that has not proven itself: CAF's middleman would wait
  // for its session to end when the actor system stops.
  shared_->expire(true);
  caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
}

caf::expected<std::uint16_t> control_gate::publish(const caf::actor& whom, std::uint16_t port,
                                                   const std::string& host) {
  caf::scoped_actor self{system_};
  caf::expected<std::uint16_t> out{caf::sec::runtime_error};
  std::set<std::string> sigs;
  self->request(actor_, std::chrono::seconds(10), caf::publish_atom::value, port,
                caf::actor_cast<caf::strong_actor_ptr>(whom), std::move(sigs), host, true)
      .receive([&](std::uint16_t p) { out = p; }, [&](caf::error& e) { out = std::move(e); });
  return out;
}

caf::expected<caf::actor> connect_bounded(caf::actor_system& system, const caf::io::middleman_actor& middleman,
                                          const std::string& host, std::uint16_t port, std::chrono::milliseconds wait) {
  caf::scoped_actor self{system};
  caf::expected<caf::actor> out{caf::sec::cannot_connect_to_node};
  self->request(middleman, wait, caf::connect_atom::value, host, port)
      .receive(
          [&](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
            if (ptr) {
              out = caf::actor_cast<caf::actor>(std::move(ptr));
            } else {
              out = caf::make_error(caf::sec::no_actor_published_at_port,
                                    "no actor published at " + host + ":" + std::to_string(port));
            }
          },
          [&](caf::error& e) { out = std::move(e); });
  return out;
}

caf::expected<caf::actor> control_gate::remote_actor(const std::string& host, std::uint16_t port,
                                                     std::chrono::milliseconds wait) {
  return connect_bounded(system_, actor_, host, port, wait);
}

void control_gate::unpublish(const caf::actor& whom, std::uint16_t port) {
  // Waited for (briefly): the gate's actor may be told to exit right after.
  caf::scoped_actor self{system_};
  self->request(actor_, std::chrono::seconds(1), caf::unpublish_atom::value, whom.address(), port)
      .receive([] {}, [](caf::error&) {});
}

std::uint64_t control_gate::refused() const { return shared_->refused.load(); }

}  // namespace troupe::actors
