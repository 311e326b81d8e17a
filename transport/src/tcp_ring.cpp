#include "troupe/transport/tcp_ring.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <optional>
#include <cerrno>
#include <cstring>
#include <thread>

#include "frame.capnp.h"
#include "troupe/transport/reduce_kernels.hpp"
#include "troupe/transport/spin.hpp"

namespace troupe::transport {
namespace {

constexpr std::uint32_t hello_magic = 0x74727570;  // "trup"
constexpr std::uint32_t max_segments = 64;
constexpr std::size_t header_slack_words = 1024;  // room for a frame's structure beside its data
constexpr std::size_t segment_bytes = 1 << 20;       // the unit a ring step pipelines
constexpr std::size_t exchange_bytes = 64 * 1024;     // two ranks swap buffers up to this size

using clock = std::chrono::steady_clock;

// A bound on every wait; none when the timeout is 0.
class deadline {
 public:
  explicit deadline(std::chrono::milliseconds timeout)
      : bounded_(timeout.count() > 0), at_(clock::now() + timeout) {}
  // Milliseconds for poll(): -1 when unbounded.
  int poll_ms() const {
    if (!bounded_) return -1;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - clock::now()).count();
    return static_cast<int>(std::max<long long>(0, left));
  }
  bool passed() const { return bounded_ && clock::now() >= at_; }

 private:
  bool bounded_;
  clock::time_point at_;
};

std::string errno_text() { return std::strerror(errno); }

void set_socket_options(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

std::string peer_name(int peer, const std::vector<endpoint>& peers) {
  return "rank " + std::to_string(peer) + " (" + peers[static_cast<std::size_t>(peer)].to_string() + ")";
}

int connect_with_retry(const endpoint& ep, const deadline& until, int peer, const std::string& name) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  std::string last_error = "no attempt";
  for (;;) {
    addrinfo* res = nullptr;
    int rc = getaddrinfo(ep.host.c_str(), std::to_string(ep.port).c_str(), &hints, &res);
    if (rc != 0) {
      throw peer_error(peer, "cannot resolve " + name + ": " + gai_strerror(rc));
    }
    int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      freeaddrinfo(res);
      set_socket_options(fd);
      return fd;
    }
    last_error = errno_text();
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    if (until.passed()) {
      throw peer_error(peer, "could not connect to " + name + " before the timeout: " + last_error);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// One frame going out: the segment table and the message's segments, gathered by sendmsg as the
// socket accepts them. The tensor bytes are a segment of their own that points into the caller's
// buffer.
class outgoing {
 public:
  void start(std::unique_ptr<capnp::MallocMessageBuilder> builder) {
    builder_ = std::move(builder);
    auto segments = builder_->getSegmentsForOutput();
    table_.assign(((segments.size() + 2) & ~std::size_t{1}), 0);
    table_[0] = static_cast<std::uint32_t>(segments.size() - 1);
    for (std::size_t i = 0; i < segments.size(); ++i) table_[i + 1] = static_cast<std::uint32_t>(segments[i].size());
    iov_.clear();
    iov_.push_back({table_.data(), table_.size() * sizeof(std::uint32_t)});
    for (auto s : segments) {
      iov_.push_back({const_cast<capnp::word*>(s.begin()), s.size() * sizeof(capnp::word)});
    }
    next_ = 0;
  }
  bool done() const { return next_ >= iov_.size(); }
  // Writes what the socket takes; false when it would block.
  void progress(int fd, int peer, const std::string& name) {
    while (!done()) {
      const int n = static_cast<int>(std::min<std::size_t>(iov_.size() - next_, IOV_MAX));
      // sendmsg with MSG_NOSIGNAL: a peer that has gone away is an error here, never a SIGPIPE.
      msghdr msg{};
      msg.msg_iov = &iov_[next_];
      msg.msg_iovlen = static_cast<std::size_t>(n);
      ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        throw peer_error(peer, "sending to " + name + " failed: " + errno_text());
      }
      auto left = static_cast<std::size_t>(w);
      while (left > 0 && !done()) {
        if (left >= iov_[next_].iov_len) {
          left -= iov_[next_].iov_len;
          ++next_;
        } else {
          iov_[next_].iov_base = static_cast<char*>(iov_[next_].iov_base) + left;
          iov_[next_].iov_len -= left;
          left = 0;
        }
      }
      while (!done() && iov_[next_].iov_len == 0) ++next_;
    }
  }

 private:
  std::unique_ptr<capnp::MallocMessageBuilder> builder_;
  std::vector<std::uint32_t> table_;
  std::vector<iovec> iov_;
  std::size_t next_ = 0;
};

// One frame coming in: the segment table, checked against the limit, then the segments into one
// word-aligned buffer that the reader parses in place.
class incoming {
 public:
  void start(std::size_t max_words) {
    max_words_ = max_words;
    stage_ = stage::head;
    have_ = 0;
    need_ = 8;
    table_.assign(2, 0);
  }
  bool done() const { return stage_ == stage::complete; }
  // Nothing to receive this time.
  void skip() { stage_ = stage::complete; }

  void progress(int fd, int peer, const std::string& name) {
    while (!done()) {
      char* target = nullptr;
      if (stage_ == stage::head || stage_ == stage::table) {
        target = reinterpret_cast<char*>(table_.data()) + (stage_ == stage::head ? 0 : 8);
      } else {
        target = reinterpret_cast<char*>(words_.data());
      }
      ssize_t r = read(fd, target + have_, need_ - have_);
      if (r == 0) throw peer_error(peer, name + " closed its connection (the process ended or failed)");
      if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        throw peer_error(peer, "receiving from " + name + " failed: " + errno_text());
      }
      have_ += static_cast<std::size_t>(r);
      if (have_ < need_) continue;
      advance(peer, name);
    }
  }

  // The frame, read in place; valid until the next start().
  capnp::SegmentArrayMessageReader& reader() { return *reader_; }

 private:
  enum class stage { head, table, body, complete };

  void advance(int peer, const std::string& name) {
    if (stage_ == stage::head) {
      const std::uint32_t count = table_[0] + 1;
      if (table_[0] >= max_segments) {
        throw peer_error(peer, "malformed frame from " + name + ": " + std::to_string(table_[0]) + "+1 segments");
      }
      const std::size_t table_words = (count + 2) / 2;  // (1 + count) uint32 rounded up to words
      table_.resize(table_words * 2, 0);
      if (table_words > 1) {
        stage_ = stage::table;
        have_ = 0;
        need_ = (table_words - 1) * 8;
        return;
      }
    }
    // The whole table is here: size the body.
    const std::uint32_t count = table_[0] + 1;
    std::size_t total = 0;
    for (std::uint32_t i = 0; i < count; ++i) total += table_[i + 1];
    if (total > max_words_) {
      throw peer_error(peer, "oversized frame from " + name + ": " + std::to_string(total * 8) + " bytes, at most " +
                                 std::to_string(max_words_ * 8) + " expected");
    }
    if (stage_ != stage::body) {
      words_.resize(std::max<std::size_t>(total, 1));
      stage_ = stage::body;
      have_ = 0;
      need_ = total * 8;
      if (need_ > 0) return;
    }
    segments_.clear();
    std::size_t offset = 0;
    for (std::uint32_t i = 0; i < count; ++i) {
      segments_.push_back(kj::arrayPtr(words_.data() + offset, table_[i + 1]));
      offset += table_[i + 1];
    }
    capnp::ReaderOptions options;
    options.traversalLimitInWords = 2 * total + 64;
    options.nestingLimit = 16;
    reader_.emplace(kj::arrayPtr(segments_.data(), segments_.size()), options);
    stage_ = stage::complete;
  }

  std::size_t max_words_ = 0;
  stage stage_ = stage::head;
  std::size_t have_ = 0;
  std::size_t need_ = 0;
  std::vector<std::uint32_t> table_;
  std::vector<capnp::word> words_;
  std::vector<kj::ArrayPtr<const capnp::word>> segments_;
  std::optional<capnp::SegmentArrayMessageReader> reader_;
};

wire::ScalarType to_wire(scalar_type t) {
  switch (t) {
    case scalar_type::f32: return wire::ScalarType::FLOAT32;
    case scalar_type::f64: return wire::ScalarType::FLOAT64;
    case scalar_type::i32: return wire::ScalarType::INT32;
    case scalar_type::i64: return wire::ScalarType::INT64;
  }
  return wire::ScalarType::FLOAT32;
}

// Chunk c of `count` elements over `size` ranks: [begin, end), on 64-byte multiples.
std::pair<std::int64_t, std::int64_t> chunk_bounds(std::int64_t count, int size, int c) {
  auto at = [&](int k) {
    if (k <= 0) return std::int64_t{0};
    if (k >= size) return count;
    std::int64_t b = count * k / size;
    return b - b % 16;
  };
  return {at(c), at(c + 1)};
}

}  // namespace

listener::listener(const std::string& host, std::uint16_t port) {
  fd_ = socket(AF_INET, SOCK_STREAM, 0);
  if (fd_ < 0) throw std::runtime_error("listener: socket() failed: " + errno_text());
  int one = 1;
  setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    close(fd_);
    throw std::invalid_argument("listener: \"" + host + "\" is not an IPv4 address");
  }
  if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd_, 64) != 0) {
    std::string why = errno_text();
    close(fd_);
    throw std::runtime_error("listener: cannot listen on " + host + ":" + std::to_string(port) + ": " + why);
  }
  socklen_t len = sizeof addr;
  getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
}

listener::~listener() {
  if (fd_ >= 0) close(fd_);
}

struct tcp_ring::impl {
  int next_fd = -1;  // to rank + 1
  int prev_fd = -1;  // from rank - 1
  std::string next_name;
  std::string prev_name;
  int next_rank = 0;
  int prev_rank = 0;
  std::chrono::milliseconds timeout{0};
  std::chrono::microseconds spin{50};
  bool yield_while_spinning = false;
  std::atomic<bool> shut_down{false};  // by shutdown(), from another thread
  std::uint64_t sequence = 0;
  outgoing out;
  incoming in;

  ~impl() {
    if (next_fd >= 0) close(next_fd);
    if (prev_fd >= 0) close(prev_fd);
  }

  // Sends `out` to the successor while receiving `in` from the predecessor. Busy-polls the
  // sockets for `spin` first (a loopback round trip is a few microseconds; a thread sleeping in
  // poll() takes tens to wake), then sleeps in poll().
  void exchange(const deadline& until) {
    try {
      exchange_unchecked(until);
    } catch (const peer_error& e) {
      if (!shut_down.load()) throw;
      throw peer_error(e.peer(), "the ring was shut down here (a worker was declared gone) while talking to " +
                                     (e.peer() == prev_rank ? prev_name : next_name));
    }
  }

  void exchange_unchecked(const deadline& until) {
    const auto spin_until_time = clock::now() + spin;
    while (!out.done() || !in.done()) {
      if (!out.done()) out.progress(next_fd, next_rank, next_name);
      if (!in.done()) in.progress(prev_fd, prev_rank, prev_name);
      if (out.done() && in.done()) break;
      if (clock::now() < spin_until_time) {
        if (yield_while_spinning) {
          yield_cpu();  // more ranks than cores here: let the one we wait for run
        } else {
          cpu_relax();
        }
        continue;
      }
      pollfd fds[2];
      nfds_t n = 0;
      if (!out.done()) fds[n++] = {next_fd, POLLOUT, 0};
      if (!in.done()) fds[n++] = {prev_fd, POLLIN, 0};
      int rc = poll(fds, n, until.poll_ms());
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0) throw std::runtime_error("tcp_ring: poll failed: " + errno_text());
      if (rc == 0) {
        const bool waiting_in = !in.done();
        throw peer_error(waiting_in ? prev_rank : next_rank,
                         "timed out after " + std::to_string(timeout.count()) + " ms waiting for " +
                             (waiting_in ? prev_name + " to send" : next_name + " to receive"));
      }
    }
  }
};

tcp_ring::tcp_ring(int rank, int size, listener& own, const std::vector<endpoint>& peers,
                   std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), impl_(std::make_unique<impl>()) {
  if (size < 1 || rank < 0 || rank >= size || peers.size() != static_cast<std::size_t>(size)) {
    throw std::invalid_argument("tcp_ring: rank " + std::to_string(rank) + " of " + std::to_string(size) + " with " +
                                std::to_string(peers.size()) + " peer addresses");
  }
  auto& s = *impl_;
  s.timeout = timeout;
  if (size == 1) return;
  s.next_rank = (rank + 1) % size;
  s.prev_rank = (rank + size - 1) % size;
  s.next_name = peer_name(s.next_rank, peers);
  s.prev_name = peer_name(s.prev_rank, peers);
  const deadline until(timeout);
  s.next_fd = connect_with_retry(peers[static_cast<std::size_t>(s.next_rank)], until, s.next_rank, s.next_name);

  // Accept the predecessor: anyone may connect, only a hello from rank-1 is kept.
  for (;;) {
    pollfd p{own.fd(), POLLIN, 0};
    int rc = poll(&p, 1, until.poll_ms());
    if (rc == 0) throw peer_error(s.prev_rank, "timed out waiting for " + s.prev_name + " to connect");
    if (rc < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("tcp_ring: poll failed: " + errno_text());
    }
    int fd = accept(own.fd(), nullptr, nullptr);
    if (fd < 0) continue;
    set_socket_options(fd);
    s.prev_fd = fd;
    break;
  }

  // Hellos both ways: the successor learns who we are, we check who our predecessor is.
  auto hello = std::make_unique<capnp::MallocMessageBuilder>(16);
  auto h = hello->initRoot<wire::Hello>();
  h.setMagic(hello_magic);
  h.setVersion(protocol_version);
  h.setRank(static_cast<std::uint32_t>(rank));
  h.setSize(static_cast<std::uint32_t>(size));
  s.out.start(std::move(hello));
  s.in.start(64);
  try {
    s.exchange(until);
    auto got = s.in.reader().getRoot<wire::Hello>();
    if (got.getMagic() != hello_magic) {
      throw peer_error(s.prev_rank, "the peer that connected as " + s.prev_name + " does not speak troupe's protocol");
    }
    if (got.getVersion() != protocol_version) {
      throw peer_error(s.prev_rank, s.prev_name + " speaks protocol version " + std::to_string(got.getVersion()) +
                                        ", this worker " + std::to_string(protocol_version));
    }
    if (got.getRank() != static_cast<std::uint32_t>(s.prev_rank) || got.getSize() != static_cast<std::uint32_t>(size)) {
      throw peer_error(s.prev_rank, "expected " + s.prev_name + " of " + std::to_string(size) + " ranks, got rank " +
                                        std::to_string(got.getRank()) + " of " + std::to_string(got.getSize()));
    }
  } catch (const kj::Exception& e) {
    throw peer_error(s.prev_rank, "malformed hello from " + s.prev_name + ": " + e.getDescription().cStr());
  }
}

tcp_ring::~tcp_ring() = default;

void tcp_ring::set_timeout(std::chrono::milliseconds timeout) { impl_->timeout = timeout; }

void tcp_ring::shutdown() {
  impl_->shut_down.store(true);
  if (impl_->next_fd >= 0) ::shutdown(impl_->next_fd, SHUT_RDWR);
  if (impl_->prev_fd >= 0) ::shutdown(impl_->prev_fd, SHUT_RDWR);
}

void tcp_ring::set_spin(std::chrono::microseconds spin, bool yield) {
  impl_->spin = spin;
  impl_->yield_while_spinning = yield;
}

void tcp_ring::all_reduce(void* data, std::int64_t count, scalar_type type, reduce_kind op) {
  if (size_ == 1 || count == 0) return;  // a sum or mean over one rank is the value
  auto& s = *impl_;
  const std::size_t esize = scalar_size(type);
  auto* bytes = static_cast<char*>(data);
  const std::uint64_t seq = s.sequence++;
  const deadline until(s.timeout);
  // Chunks travel in segments, so that a receiver reduces one segment while the next arrives.
  const std::int64_t segment = std::max<std::int64_t>(16, static_cast<std::int64_t>(segment_bytes / esize));

  auto send_segment = [&](int c, std::int64_t b, std::int64_t e) {
    const std::size_t nbytes = static_cast<std::size_t>(e - b) * esize;
    auto msg = std::make_unique<capnp::MallocMessageBuilder>(32);
    auto chunk = msg->initRoot<wire::Chunk>();
    chunk.setSequence(seq);
    chunk.setIndex(static_cast<std::uint32_t>(c));
    chunk.setOffset(static_cast<std::uint64_t>(b));
    chunk.setType(to_wire(type));
    chunk.setCount(static_cast<std::uint64_t>(e - b));
    const char* p = bytes + static_cast<std::size_t>(b) * esize;
    if (nbytes % 8 == 0 && reinterpret_cast<std::uintptr_t>(p) % 8 == 0) {
      chunk.adoptData(msg->getOrphanage().referenceExternalData(
          capnp::Data::Reader(reinterpret_cast<const kj::byte*>(p), nbytes)));
    } else {
      // An odd-sized or unaligned tail: copied, since external segments are whole words.
      std::memcpy(chunk.initData(static_cast<unsigned>(nbytes)).begin(), p, nbytes);
    }
    s.out.start(std::move(msg));
  };
  // Checks the frame against what this rank expects and hands its bytes, read in place, to `use`.
  auto take_segment = [&](int c, std::int64_t b, std::int64_t e, auto&& use) {
    try {
      auto chunk = s.in.reader().getRoot<wire::Chunk>();
      auto d = chunk.getData();
      if (chunk.getSequence() != seq || chunk.getIndex() != static_cast<std::uint32_t>(c) ||
          chunk.getOffset() != static_cast<std::uint64_t>(b) || chunk.getType() != to_wire(type) ||
          chunk.getCount() != static_cast<std::uint64_t>(e - b) || d.size() != static_cast<std::size_t>(e - b) * esize) {
        throw peer_error(s.prev_rank, "unexpected frame from " + s.prev_name + ": chunk " +
                                          std::to_string(chunk.getIndex()) + " at " + std::to_string(chunk.getOffset()) +
                                          " of operation " + std::to_string(chunk.getSequence()) + " with " +
                                          std::to_string(d.size()) + " bytes, expected chunk " + std::to_string(c) +
                                          " at " + std::to_string(b) + " of operation " + std::to_string(seq) +
                                          " with " + std::to_string(static_cast<std::size_t>(e - b) * esize) +
                                          " bytes (the workers disagree on the collective)");
      }
      use(d.begin(), b, e);
    } catch (const kj::Exception& x) {
      throw peer_error(s.prev_rank, "malformed frame from " + s.prev_name + ": " + x.getDescription().cStr());
    }
  };
  // One ring step: chunk send_c goes to the successor while chunk recv_c comes from the
  // predecessor, segment by segment.
  auto step = [&](int send_c, int recv_c, auto&& use) {
    auto [sb, se] = chunk_bounds(count, size_, send_c);
    auto [rb, re] = chunk_bounds(count, size_, recv_c);
    for (std::int64_t k = 0; sb + k * segment < se || rb + k * segment < re; ++k) {
      const std::int64_t sk = sb + k * segment;
      const std::int64_t rk = rb + k * segment;
      const bool sending = sk < se;
      const bool receiving = rk < re;
      if (sending) send_segment(send_c, sk, std::min(se, sk + segment));
      if (receiving) {
        s.in.start(static_cast<std::size_t>(std::min(re - rk, segment)) * esize / 8 + header_slack_words);
      } else {
        s.in.skip();
      }
      s.exchange(until);
      if (receiving) take_segment(recv_c, rk, std::min(re, rk + segment), use);
    }
  };

  if (size_ == 2 && static_cast<std::size_t>(count) * esize <= exchange_bytes) {
    // Two ranks and a small buffer: one exchange of the whole buffer instead of two half steps,
    // half the latency. Each adds the other's values to its own; a + b == b + a exactly, so both
    // still get the same bits.
    send_segment(0, 0, count);
    s.in.start(static_cast<std::size_t>(count) * esize / 8 + header_slack_words);
    s.exchange(until);
    take_segment(0, 0, count, [&](const kj::byte* in, std::int64_t, std::int64_t) {
      const void* ins[2] = {bytes, in};
      void* outs[1] = {bytes};
      reduce_range(ins, 2, outs, 1, 0, count, type, reduce_kind::sum);
    });
    if (op == reduce_kind::mean) scale_range(bytes, count, type, size_);
    return;
  }
  // Reduce-scatter: after size-1 steps rank r holds the full sum of chunk r+1.
  for (int k = 0; k < size_ - 1; ++k) {
    const int send_c = ((rank_ - k) % size_ + size_) % size_;
    const int recv_c = ((rank_ - k - 1) % size_ + size_) % size_;
    step(send_c, recv_c, [&](const kj::byte* in, std::int64_t b, std::int64_t e) {
      // Local partial first, the predecessor's after it: the ring fixes the order of additions.
      const void* ins[2] = {bytes + static_cast<std::size_t>(b) * esize, in};
      void* outs[1] = {bytes + static_cast<std::size_t>(b) * esize};
      reduce_range(ins, 2, outs, 1, 0, e - b, type, reduce_kind::sum);
    });
  }
  const int owned = (rank_ + 1) % size_;
  if (op == reduce_kind::mean) {
    auto [b, e] = chunk_bounds(count, size_, owned);
    // Divide the finished chunk once, where it is complete, so every rank gets the same bits.
    scale_range(bytes + static_cast<std::size_t>(b) * esize, e - b, type, size_);
  }
  // All-gather: pass the finished chunks around.
  for (int k = 0; k < size_ - 1; ++k) {
    const int send_c = ((owned - k) % size_ + size_) % size_;
    const int recv_c = ((owned - k - 1) % size_ + size_) % size_;
    step(send_c, recv_c, [&](const kj::byte* in, std::int64_t b, std::int64_t e) {
      std::memcpy(bytes + static_cast<std::size_t>(b) * esize, in, static_cast<std::size_t>(e - b) * esize);
    });
  }
}

}  // namespace troupe::transport
