#include "troupe/transport/bulk_channel.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <list>
#include <mutex>
#include <system_error>
#include <thread>

#include "proof_exchange.hpp"

namespace troupe::transport {
namespace {

constexpr std::uint32_t request_magic = 0x64737074;  // "tpsd"
constexpr std::uint32_t reply_magic = 0x72737074;    // "tpsr"
constexpr std::size_t request_header_bytes = 24;
constexpr std::size_t reply_header_bytes = 16;
constexpr std::uint8_t status_ok = 0;
constexpr std::uint8_t status_error = 1;

// The ranks and ring size the proof is made for: the connecting side is 1, the listener 0.
constexpr int listening_rank = 0;
constexpr int connecting_rank = 1;
constexpr int pair_size = 2;

std::string errno_text(int e) { return std::strerror(e); }

void set_blocking_with_timeout(int fd, std::chrono::milliseconds timeout, const std::string& name) {
  const int flags = fcntl(fd, F_GETFL);
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  const int one = 1;
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
    throw std::runtime_error("cannot set up the data connection with " + name + ": " + errno_text(errno));
  }
}

}  // namespace

// --- bulk_stream ------------------------------------------------------------------------------

std::unique_ptr<bulk_stream> bulk_stream::connect(const endpoint& ep, const ring_auth& auth,
                                                  std::chrono::milliseconds timeout, std::string name,
                                                  tag_hashing hashing) {
  // A proof takes milliseconds: a listener that does not answer it soon is stopped or gone.
  const frames::deadline until(std::min(timeout, std::chrono::milliseconds(10000)));
  int retry_ms = 5;
  for (;;) {
    // The port was handed out by a listener that is up: a refused connection means it is gone, so
    // the connect is not retried for long.
    const frames::deadline connect_until(std::min(timeout, std::chrono::milliseconds(500)));
    const int fd = connect_socket(ep, connect_until, listening_rank, name);
    auto stream = std::make_unique<bulk_stream>(fd, timeout, name);
    std::vector<std::uint8_t> key;
    try {
      key = prove_connection(fd, proof_exchange::role::connecting, auth, bulk_protocol_version, connecting_rank,
                             listening_rank, pair_size, name, until);
    } catch (const connection_refused& e) {
      // Pushed out by connections that had not proven themselves (a flood of strangers), or the
      // listener is stopping: tried again while the bound allows.
      const int left = until.poll_ms();
      if (until.passed() || (left >= 0 && left < retry_ms)) {
        throw std::runtime_error("the data port of " + name + " at " + ep.to_string() +
                                 " refused this task until the timeout: " + e.what());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(retry_ms));
      retry_ms = std::min(2 * retry_ms, 200);
      continue;
    } catch (const std::exception& e) {
      throw std::runtime_error("the data port of " + name + " at " + ep.to_string() + " refused this task: " +
                               e.what());
    }
    set_blocking_with_timeout(fd, timeout, name);
    if (!auth.token.empty()) stream->tag_messages(key, true, hashing);
    return stream;
  }
}

bulk_stream::bulk_stream(int fd, std::chrono::milliseconds timeout, std::string name)
    : fd_(fd), timeout_(timeout), name_(std::move(name)) {}

bulk_stream::~bulk_stream() {
  if (fd_ >= 0) close(fd_);
}

void bulk_stream::shutdown() noexcept { ::shutdown(fd_, SHUT_RDWR); }

void bulk_stream::tag_messages(const std::vector<std::uint8_t>& key, bool connecting, tag_hashing hashing) {
  // One thread beside this connection's hashes its large messages both ways (started on first use).
  const auto helper = hashing == tag_hashing::beside ? std::make_shared<frames::tag_thread>() : nullptr;
  out_mac_ = std::make_shared<frames::frame_mac>(key, connecting ? 0 : 1, helper);
  in_mac_ = std::make_shared<frames::frame_mac>(key, connecting ? 1 : 0, helper);
}

void bulk_stream::start_message(const void* header, std::size_t n) {
  in_left_ = 0;
  if (!in_mac_) return;
  in_mac_->begin();
  in_mac_->add(header, n);
}

void bulk_stream::add_to_message(const void* data, std::size_t n) {
  if (in_mac_) in_mac_->add(data, n);
}

void bulk_stream::end_message_when_read() {
  if (!in_mac_ || in_left_ > 0) return;
  unsigned char tag[frames::frame_mac::tag_bytes];
  read_exact(tag, sizeof tag);
  if (!in_mac_->matches(tag)) {
    throw std::runtime_error("a message from " + name_ +
                             " failed its integrity check (its tag does not match: the bytes were altered, replayed "
                             "or reordered on the way)");
  }
}

void bulk_stream::send_all(const void* header, std::size_t header_n, const void* a, std::size_t an, const void* b,
                           std::size_t bn, const void* c, std::size_t cn) {
  constexpr int parts = 5;
  unsigned char tag[frames::frame_mac::tag_bytes];
  iovec iov[parts] = {{const_cast<void*>(header), header_n},
                      {const_cast<void*>(a), an},
                      {const_cast<void*>(b), bn},
                      {const_cast<void*>(c), cn},
                      {tag, 0}};
  if (out_mac_ && out_mac_->helped() && an + bn + cn >= frames::tag_thread::min_frame_bytes) {
    // Hashed beside while the body is written; the tag goes once both are done. The caller's
    // bytes stay in place until the thread has let go of them, also when the write fails.
    out_mac_->begin();
    for (int i = 0; i < 4; ++i) out_mac_->add(iov[i].iov_base, iov[i].iov_len, true);
    out_mac_->finish();
    try {
      write_all(iov, 4);
    } catch (...) {
      out_mac_->drain();
      throw;
    }
    out_mac_->result(tag);
    iov[4].iov_len = sizeof tag;
    write_all(iov + 4, 1);
    return;
  }
  if (out_mac_) {
    out_mac_->tag(iov, 4, tag);
    iov[4].iov_len = sizeof tag;
  }
  write_all(iov, parts);
}

void bulk_stream::write_all(iovec* iov, int parts) {
  int first = 0;
  while (first < parts) {
    if (iov[first].iov_len == 0) {
      ++first;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = static_cast<std::size_t>(std::min(parts - first, 1024));  // IOV_MAX
    const ssize_t w = sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        throw std::runtime_error(name_ + " took no data for " + std::to_string(timeout_.count()) +
                                 " ms (stalled or hung?)");
      }
      throw std::runtime_error("sending to " + name_ + " failed: " + errno_text(errno));
    }
    auto left = static_cast<std::size_t>(w);
    while (first < parts && left >= iov[first].iov_len) {
      left -= iov[first].iov_len;
      iov[first].iov_len = 0;
      ++first;
    }
    if (first < parts) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
}

void bulk_stream::receive(void* into, std::size_t n) {
  if (n == 0) return;
  const auto too_many = [&] {
    return std::runtime_error("data connection with " + name_ + ": " + std::to_string(n) +
                              " bytes asked of a message with " + std::to_string(in_left_) + " left");
  };
  if (in_mac_ && in_mac_->helped() && n >= frames::tag_thread::min_frame_bytes) {
    if (n > in_left_) throw too_many();
    // Read a piece at a time, each hashed beside while the next is read: only the last is left
    // to hash once the last byte is in. The bytes stay in place until the thread let go of them.
    constexpr std::size_t piece = 128 * 1024;
    auto* at = static_cast<unsigned char*>(into);
    try {
      for (std::size_t done = 0; done < n;) {
        const std::size_t k = std::min(piece, n - done);
        read_exact(at + done, k);
        in_mac_->add(at + done, k, true);
        done += k;
      }
      in_left_ -= n;
      if (in_left_ > 0) in_mac_->drain();  // the caller may reuse `into` before the message ends
      end_message_when_read();
    } catch (...) {
      in_mac_->drain();
      throw;
    }
    return;
  }
  read_exact(into, n);
  if (!in_mac_) return;
  if (n > in_left_) throw too_many();
  add_to_message(into, n);
  in_left_ -= n;
  end_message_when_read();
}

void bulk_stream::read_exact(void* into, std::size_t n) {
  auto* at = static_cast<char*>(into);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = recv(fd_, at + got, n - got, MSG_WAITALL);
    if (r > 0) {
      got += static_cast<std::size_t>(r);
      continue;
    }
    if (r == 0) {
      throw std::runtime_error(name_ + " closed its data connection after " + std::to_string(got) + " of " +
                               std::to_string(n) + " bytes (truncated frame; is it lost?)");
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      throw std::runtime_error(name_ + " sent nothing for " + std::to_string(timeout_.count()) + " ms after " +
                               std::to_string(got) + " of " + std::to_string(n) + " bytes (stalled or hung?)");
    }
    throw std::runtime_error("receiving from " + name_ + " failed: " + errno_text(errno));
  }
}

void bulk_stream::send_request(const bulk_request& r, const void* data, const void* more, std::size_t more_n) {
  if (r.key.size() > bulk_max_key) {
    throw std::invalid_argument("data connection: a key of " + std::to_string(r.key.size()) + " bytes (at most " +
                                std::to_string(bulk_max_key) + ")");
  }
  const bool with_data = r.kind != bulk_request::read;
  if (with_data && more_n > r.bytes) {
    throw std::invalid_argument("data connection: a request of " + std::to_string(r.bytes) + " bytes with " +
                                std::to_string(more_n) + " of them in its second part");
  }
  unsigned char h[request_header_bytes] = {};
  put_value<std::uint32_t>(h, request_magic);
  h[4] = r.kind;
  h[5] = r.op;
  h[6] = r.dtype;
  put_value<std::uint32_t>(h + 8, static_cast<std::uint32_t>(r.key.size()));
  put_value<std::uint64_t>(h + 16, r.bytes);
  const std::size_t first_n = with_data ? static_cast<std::size_t>(r.bytes) - more_n : 0;
  send_all(h, sizeof h, r.key.data(), r.key.size(), with_data ? data : nullptr, first_n, with_data ? more : nullptr,
           with_data ? more_n : 0);
}

std::optional<bulk_request> bulk_stream::receive_request() {
  // Idle between requests for as long as the peer likes: only a close or shutdown() ends the wait.
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    const int rc = poll(&p, 1, -1);
    if (rc > 0) break;
    if (rc < 0 && errno != EINTR) throw std::runtime_error("data connection: poll failed: " + errno_text(errno));
  }
  unsigned char h[request_header_bytes];
  {
    const ssize_t r = recv(fd_, h, 1, 0);
    if (r == 0) return std::nullopt;
    if (r < 0) {
      if (errno == ECONNRESET || errno == ENOTCONN || errno == EPIPE) return std::nullopt;
      throw std::runtime_error("receiving from " + name_ + " failed: " + errno_text(errno));
    }
  }
  read_exact(h + 1, sizeof h - 1);
  start_message(h, sizeof h);
  bulk_request r;
  if (get_value<std::uint32_t>(h) != request_magic) {
    throw std::runtime_error(name_ + " sent a request that is not troupe's (magic " +
                             std::to_string(get_value<std::uint32_t>(h)) + ")");
  }
  r.kind = h[4];
  r.op = h[5];
  r.dtype = h[6];
  if (r.kind < bulk_request::read || r.kind > bulk_request::apply_rows) {
    throw std::runtime_error(name_ + " sent a request of unknown kind " + std::to_string(r.kind));
  }
  const auto key_n = get_value<std::uint32_t>(h + 8);
  if (key_n > bulk_max_key) {
    throw std::runtime_error(name_ + " sent a key of " + std::to_string(key_n) + " bytes (at most " +
                             std::to_string(bulk_max_key) + ")");
  }
  r.bytes = get_value<std::uint64_t>(h + 16);
  r.key.resize(key_n);
  read_exact(r.key.data(), key_n);
  add_to_message(r.key.data(), key_n);
  in_left_ = r.kind == bulk_request::read ? 0 : r.bytes;
  end_message_when_read();
  return r;
}

void bulk_stream::send_reply(const void* data, std::size_t n) {
  unsigned char h[reply_header_bytes] = {};
  put_value<std::uint32_t>(h, reply_magic);
  h[4] = status_ok;
  put_value<std::uint64_t>(h + 8, n);
  send_all(h, sizeof h, data, n, nullptr, 0, nullptr, 0);
}

void bulk_stream::send_error(const std::string& text) {
  const std::string cut = text.substr(0, bulk_max_error);
  unsigned char h[reply_header_bytes] = {};
  put_value<std::uint32_t>(h, reply_magic);
  h[4] = status_error;
  put_value<std::uint64_t>(h + 8, cut.size());
  send_all(h, sizeof h, cut.data(), cut.size(), nullptr, 0, nullptr, 0);
}

void bulk_stream::receive_reply(std::uint64_t expected) {
  unsigned char h[reply_header_bytes];
  read_exact(h, sizeof h);
  start_message(h, sizeof h);
  if (get_value<std::uint32_t>(h) != reply_magic) {
    throw std::runtime_error(name_ + " sent a reply that is not troupe's (magic " +
                             std::to_string(get_value<std::uint32_t>(h)) + ")");
  }
  const auto n = get_value<std::uint64_t>(h + 8);
  if (h[4] == status_error) {
    if (n > bulk_max_error) {
      throw std::runtime_error(name_ + " sent an error of " + std::to_string(n) + " bytes (at most " +
                               std::to_string(bulk_max_error) + ")");
    }
    std::string text(static_cast<std::size_t>(n), '\0');
    in_left_ = n;
    if (text.empty()) {
      end_message_when_read();
    } else {
      receive(text.data(), text.size());
    }
    throw std::runtime_error(name_ + ": " + text);
  }
  if (h[4] != status_ok) throw std::runtime_error(name_ + " sent a reply of unknown status " + std::to_string(h[4]));
  if (n != expected) {
    throw std::runtime_error(name_ + " answered with " + std::to_string(n) + " bytes, expected " +
                             std::to_string(expected) + " (the shard's registered shape and dtype)");
  }
  in_left_ = n;
  end_message_when_read();
}

bool bulk_stream::wait_message(int wait_ms) {
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    const int rc = poll(&p, 1, wait_ms);
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) throw std::runtime_error("data connection: poll failed: " + errno_text(errno));
  }
}

bool bulk_stream::receive_header(void* into, std::size_t n) {
  auto* h = static_cast<unsigned char*>(into);
  for (;;) {
    const ssize_t r = recv(fd_, h, 1, 0);
    if (r == 1) break;
    if (r == 0) return false;
    if (errno == EINTR) continue;
    if (errno == ECONNRESET || errno == ENOTCONN || errno == EPIPE) return false;
    throw std::runtime_error("receiving from " + name_ + " failed: " + errno_text(errno));
  }
  read_exact(h + 1, n - 1);
  start_message(h, n);
  return true;
}

void bulk_stream::expect_body(std::uint64_t n) {
  in_left_ = n;
  end_message_when_read();
}

void bulk_stream::send_message(const iovec* parts, int n) {
  constexpr int most = 1000;
  if (n < 0 || n > most) throw std::invalid_argument("data connection: a message of " + std::to_string(n) + " parts");
  iovec iov[most + 1];
  std::copy(parts, parts + n, iov);
  unsigned char tag[frames::frame_mac::tag_bytes];
  int count = n;
  if (out_mac_) {
    out_mac_->tag(iov, static_cast<std::size_t>(n), tag);
    iov[count++] = iovec{tag, sizeof tag};
  }
  write_all(iov, count);
}

// --- bulk_listener ----------------------------------------------------------------------------

struct bulk_listener::impl {
  std::unique_ptr<listener> socket;
  std::uint16_t port = 0;
  ring_auth auth;
  std::chrono::milliseconds timeout{0};
  std::string owner;
  std::function<void(bulk_stream&)> serve;
  std::size_t max_connections = 64;
  tag_hashing hashing = tag_hashing::automatic;
  // Open connections of any kind (a thread each), proven ones included: pushed-out ones whose
  // threads have not ended yet count until they do.
  static constexpr std::size_t max_open_connections = 1024;
  std::atomic<bool> stopping{false};
  std::atomic<std::uint64_t> refused{0};

  struct connection {
    int fd = -1;  // until a bulk_stream owns it
    bulk_stream* stream = nullptr;
    std::thread thread;
    bool proven = false;   // its proof checked out: never pushed out for a newer connection
    bool evicted = false;  // pushed out while it proved itself
    bool finished = false;
  };
  std::mutex mutex;
  std::list<connection> connections;
  std::thread acceptor;

  void refuse(const std::string& remote, const std::string& why) {
    const auto n = ++refused;
    // A flood is logged at powers of two.
    if ((n & (n - 1)) == 0) {
      std::fprintf(stderr, "troupe: %s refused a data connection from %s: %s (%llu so far)\n", owner.c_str(),
                   remote.c_str(), why.c_str(), static_cast<unsigned long long>(n));
    }
  }

  void reap() {  // with the mutex held: joins the threads that finished
    for (auto it = connections.begin(); it != connections.end();) {
      if (it->finished) {
        it->thread.join();
        it = connections.erase(it);
      } else {
        ++it;
      }
    }
  }

  void run_connection(connection* c, std::string remote) {
    const int fd = c->fd;
    std::vector<std::uint8_t> key;
    try {
      const frames::deadline until(std::min(timeout, std::chrono::milliseconds(10000)));
      key = prove_connection(fd, proof_exchange::role::accepting, auth, bulk_protocol_version, listening_rank,
                             connecting_rank, pair_size, "the connection from " + remote, until, [this, c] {
                         std::lock_guard<std::mutex> lock(mutex);
                         if (c->evicted) return false;
                         c->proven = true;
                         return true;
                       });
      set_blocking_with_timeout(fd, timeout, "the connection from " + remote);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!stopping) {
        refuse(remote, c->evicted ? std::string("pushed out by newer connections before it proved itself (at most ") +
                                        std::to_string(max_connections) + " prove themselves at once)"
                                  : std::string(e.what()));
      }
      close(fd);
      c->fd = -1;
      c->finished = true;
      return;
    }
    bulk_stream stream(fd, timeout, "the data connection from " + remote);
    if (!auth.token.empty()) stream.tag_messages(key, false, hashing);
    {
      std::lock_guard<std::mutex> lock(mutex);
      c->fd = -1;
      c->stream = &stream;
      if (stopping) stream.shutdown();
    }
    try {
      serve(stream);
    } catch (const std::exception& e) {
      if (!stopping) std::fprintf(stderr, "troupe: %s dropped %s: %s\n", owner.c_str(), stream.name().c_str(), e.what());
    }
    std::lock_guard<std::mutex> lock(mutex);
    c->stream = nullptr;
    c->finished = true;
  }

  void accept_loop() {
    const int listen_fd = socket->fd();
    while (!stopping) {
      pollfd p{listen_fd, POLLIN, 0};
      const int rc = poll(&p, 1, 100);
      if (rc <= 0) continue;
      const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno != EINTR && errno != ECONNABORTED && errno != EAGAIN) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));  // out of descriptors: no spin
        }
        continue;
      }
      std::string remote = remote_of(fd);
      std::lock_guard<std::mutex> lock(mutex);
      reap();
      // At most max_connections prove themselves at once: beyond that the oldest one still proving
      // itself is pushed out (a stranger that says nothing holds a place only until newer ones
      // come; a worker pushed out tries again). Proven connections are never pushed out.
      std::size_t unproven = 0;
      connection* oldest = nullptr;
      for (auto& c : connections) {
        if (c.finished || c.proven || c.evicted) continue;
        ++unproven;
        if (oldest == nullptr) oldest = &c;
      }
      if (unproven >= max_connections && oldest != nullptr) {
        oldest->evicted = true;
        if (oldest->fd >= 0) ::shutdown(oldest->fd, SHUT_RDWR);
      }
      if (connections.size() >= max_open_connections) {
        close(fd);
        refuse(remote, "too many data connections open at once (" + std::to_string(max_open_connections) + ")");
        continue;
      }
      connections.emplace_back();
      connection* c = &connections.back();
      c->fd = fd;
      try {
        c->thread = std::thread([this, c, remote] { run_connection(c, remote); });
      } catch (const std::system_error& e) {  // no thread to be had: refused, never a crash
        connections.pop_back();
        close(fd);
        refuse(remote, std::string("no thread for it: ") + e.what());
      }
    }
  }
};

bulk_listener::bulk_listener(const std::string& host, std::uint16_t port, ring_auth auth,
                             std::chrono::milliseconds timeout, std::string owner,
                             std::function<void(bulk_stream&)> serve, std::size_t max_connections,
                             tag_hashing hashing)
    : impl_(std::make_unique<impl>()) {
  auto& s = *impl_;
  s.socket = std::make_unique<listener>(ipv4_of(host, "data port"), port);
  s.port = s.socket->port();
  s.auth = std::move(auth);
  s.timeout = timeout;
  s.owner = std::move(owner);
  s.serve = std::move(serve);
  s.max_connections = max_connections;
  s.hashing = hashing;
  s.acceptor = std::thread([&s] { s.accept_loop(); });
}

bulk_listener::~bulk_listener() {
  auto& s = *impl_;
  s.stopping = true;
  s.acceptor.join();
  // Closed first, so that a connection attempt from now on is refused at once rather than left in
  // the backlog with nobody to prove it.
  s.socket.reset();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    for (auto& c : s.connections) {
      if (c.stream != nullptr) c.stream->shutdown();
      if (c.fd >= 0) ::shutdown(c.fd, SHUT_RDWR);
    }
  }
  // Each thread ends within its bounds: a proof within its deadline, a connection once shut down.
  for (auto& c : s.connections) c.thread.join();
}

std::uint16_t bulk_listener::port() const noexcept { return impl_->port; }
std::uint64_t bulk_listener::refused() const noexcept { return impl_->refused; }

}  // namespace troupe::transport
