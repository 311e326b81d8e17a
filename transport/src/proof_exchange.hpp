#pragma once
// The proof of a connection (ring_connect.hpp's three hellos), from either side, apart from the
// ring: the ring's connections and the ps tasks' data connections (bulk_channel.hpp) run the same
// exchange. Private to transport/.

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ring_frames.hpp"
#include "ring_proof.hpp"
#include "troupe/transport/ring_connect.hpp"

namespace troupe::transport {

// One connection during its proof, as a ring_link whose both sides are its socket, so that the
// hellos go through the same checked frame reader and writer as the collectives.
class proof_link final : public ring_link {
 public:
  proof_link(int fd, ring_peer who) : ring_link(who, who), fd_(fd) {}
  std::size_t write_some(ring_side side, const iovec* iov, std::size_t count) override {
    for (;;) {
      msghdr msg{};
      msg.msg_iov = const_cast<iovec*>(iov);
      msg.msg_iovlen = std::min<std::size_t>(count, IOV_MAX);
      const ssize_t w = sendmsg(fd_, &msg, MSG_NOSIGNAL);
      if (w >= 0) return static_cast<std::size_t>(w);
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      if (errno == EINTR) continue;
      throw_gone(side);
    }
  }
  std::size_t read_some(ring_side side, void* into, std::size_t n) override {
    for (;;) {
      const ssize_t r = read(fd_, into, n);
      if (r > 0) return static_cast<std::size_t>(r);
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
      if (r < 0 && errno == EINTR) continue;
      throw_gone(side);
    }
  }
  bool wait(const ring_wants&, int) override { return true; }  // the caller polls
  void shutdown() noexcept override {}

 private:
  int fd_;
};

// A connection's proof: the three hellos of connect_ring's walkthrough, from either side, driven
// without blocking. A failure is std::runtime_error with what was wrong.
class proof_exchange {
 public:
  enum class role { connecting, accepting };

  proof_exchange(role r, int fd, const ring_auth& auth, std::uint32_t version, int self, int expected_peer,
                 int size, std::string name)
      : role_(r),
        fd_(fd),
        auth_(auth),
        version_(version),
        self_(static_cast<std::uint32_t>(self)),
        peer_(static_cast<std::uint32_t>(expected_peer)),
        size_(static_cast<std::uint32_t>(size)),
        link_(fd, ring_peer{expected_peer, std::move(name)}),
        mine_(proof::fresh_nonce()) {
    if (role_ == role::connecting) out_.start_hello(version_, self_, size_, mine_, {});
    in_.start(hello_words);
  }

  int fd() const { return fd_; }
  bool done() const { return stage_ == 2 && out_.done(); }
  short events() const { return static_cast<short>(POLLIN | (out_.done() ? 0 : POLLOUT)); }

  // Moves the exchange on as far as the socket allows now.
  void progress() {
    for (;;) {
      if (!out_.done()) out_.progress(link_);
      if (stage_ == 2 || !out_.done()) return;
      in_.progress(link_);
      if (!in_.done()) return;
      const frames::hello_fields h = in_.take_hello();
      check(h);
      if (role_ == role::accepting && stage_ == 0) {
        // The connecting side's nonce: answer with ours and our proof over both.
        theirs_ = h.nonce;
        out_.start_hello(version_, self_, size_, mine_, make(proof::side::accepting));
        in_.start(hello_words);
        stage_ = 1;
      } else if (role_ == role::accepting) {
        if (!proof::matches(h.proof, make(proof::side::connecting))) throw std::runtime_error(failed_proof());
        // Proven. Admitted (the caller may still refuse it), it is acknowledged: the connecting
        // side counts the connection as made only once it reads the acknowledgement.
        if (admit_ && !admit_()) throw std::runtime_error(not_admitted);
        out_.start_hello(version_, self_, size_, {}, {});
        stage_ = 2;
      } else if (stage_ == 0) {
        theirs_ = h.nonce;
        if (!proof::matches(h.proof, make(proof::side::accepting))) throw std::runtime_error(failed_proof());
        out_.start_hello(version_, self_, size_, {}, make(proof::side::connecting));
        in_.start(hello_words);
        stage_ = 1;
      } else {
        stage_ = 2;  // the accepting side's acknowledgement
      }
    }
  }

  /// Called on the accepting side once the peer's proof checks out, before it is acknowledged:
  /// false refuses the connection after all (one that was pushed out while it proved itself).
  void on_proven(std::function<bool()> admit) { admit_ = std::move(admit); }

  /// The text of a refusal by on_proven.
  static constexpr const char* not_admitted = "it was pushed out by newer connections before it proved itself";

  /// The key of this connection's frame tags (frames::frame_mac), once done(): both sides derive
  /// it from the token and the proof's nonces, and it never travels.
  std::vector<std::uint8_t> frame_key() const { return make(proof::side::frames); }

  /// Whether the last hello awaited is the acknowledgement (the connecting side has sent its
  /// proof): a close now means the accepting side refused the connection.
  bool awaiting_acknowledgement() const { return role_ == role::connecting && stage_ == 1; }

 private:
  static constexpr std::size_t hello_words = 64;

  std::vector<std::uint8_t> make(proof::side by) const {
    const bool connecting = role_ == role::connecting;
    return proof::make(auth_, version_, by, size_, connecting ? self_ : peer_, connecting ? peer_ : self_,
                       connecting ? mine_ : theirs_, connecting ? theirs_ : mine_);
  }

  static std::string failed_proof() {
    return "its hello failed the proof (another cluster token, another incarnation of the cluster, or a replayed "
           "hello)";
  }

  void check(const frames::hello_fields& h) const {
    if (h.magic != frames::hello_magic) throw std::runtime_error("it does not speak troupe's protocol");
    if (h.version != version_) {
      throw std::runtime_error("it speaks protocol version " + std::to_string(h.version) + ", this worker " +
                               std::to_string(version_));
    }
    if (h.rank != peer_ || h.size != size_) {
      throw std::runtime_error("it says rank " + std::to_string(h.rank) + " of " + std::to_string(h.size) +
                               ", expected rank " + std::to_string(peer_) + " of " + std::to_string(size_));
    }
    const bool nonce_due = stage_ == 0;
    if (nonce_due && h.nonce.size() != proof::nonce_bytes) {
      throw std::runtime_error("its hello has a nonce of " + std::to_string(h.nonce.size()) + " bytes, expected " +
                               std::to_string(proof::nonce_bytes));
    }
  }

  role role_;
  int fd_;
  const ring_auth& auth_;
  std::uint32_t version_;
  std::uint32_t self_;
  std::uint32_t peer_;
  std::uint32_t size_;
  proof_link link_;
  frames::frame_writer out_{ring_side::prev};
  frames::frame_reader in_{ring_side::prev};
  std::vector<std::uint8_t> mine_;
  std::vector<std::uint8_t> theirs_;
  std::function<bool()> admit_;
  int stage_ = 0;  // 0: first hello awaited, 1: the last (the proof, or its acknowledgement), 2: done
};

/// The accepting side closed a connection before it acknowledged the proof: it refused it (too
/// many connections proving themselves at once there, another protocol version, or it is
/// stopping). Worth another try, unlike a proof that fails.
class connection_refused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Runs a whole proof on the connected socket `fd` (blocking or not: it is made non-blocking for
/// the exchange and given back as it was) until the deadline. A failure, or a deadline that passes
/// first, is std::runtime_error saying what was wrong; a close by the accepting side before its
/// acknowledgement is connection_refused. `admit`: see proof_exchange::on_proven. Returns the key
/// of the connection's frame tags (proof_exchange::frame_key).
inline std::vector<std::uint8_t> prove_connection(int fd, proof_exchange::role r, const ring_auth& auth, std::uint32_t version, int self,
                             int expected_peer, int size, const std::string& name, const frames::deadline& until,
                             std::function<bool()> admit = {}) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    throw std::runtime_error(std::string("cannot set up the connection: ") + std::strerror(errno));
  }
  struct restore {
    int fd, flags;
    ~restore() { fcntl(fd, F_SETFL, flags); }
  } back{fd, flags};
  proof_exchange exchange(r, fd, auth, version, self, expected_peer, size, name);
  if (admit) exchange.on_proven(std::move(admit));
  for (;;) {
    try {
      exchange.progress();
    } catch (const peer_error&) {
      if (r == proof_exchange::role::accepting) throw std::runtime_error("it closed the connection during the proof");
      throw connection_refused(
          "it closed the connection before acknowledging this side's proof (it refused the connection: too many "
          "connections proving themselves there at once, another protocol version, or it is stopping; its log "
          "says which)");
    }
    if (exchange.done()) return exchange.frame_key();
    pollfd p{fd, exchange.events(), 0};
    const int rc = poll(&p, 1, until.poll_ms());
    if (rc < 0 && errno != EINTR) throw std::runtime_error(std::string("poll failed: ") + std::strerror(errno));
    if (rc == 0 && until.passed()) throw std::runtime_error("it did not prove itself in time");
  }
}

/// A TCP connection to `ep` (a host name or address), retried while nobody listens there yet,
/// until the deadline: its descriptor, non-blocking with Nagle off, owned by the caller. A peer that
/// cannot be reached in time is a peer_error naming `name`.
int connect_socket(const endpoint& ep, const frames::deadline& until, int peer, const std::string& name);

/// "10.0.0.2:41234": the remote end of the connection `fd`, for the log ("?" when unknown).
std::string remote_of(int fd);

/// An IPv4 address for `host`: itself when it is one, else the first the resolver gives; a name
/// it cannot resolve is std::runtime_error naming `what` ("data port").
std::string ipv4_of(const std::string& host, const std::string& what);

}  // namespace troupe::transport
