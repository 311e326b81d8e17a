#include "troupe/transport/tcp_ring.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <optional>
#include <thread>

#include "frame.capnp.h"
#include "troupe/kernels/reduce_kernels.hpp"
#include "troupe/transport/spin.hpp"

namespace troupe::transport {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

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

// A peer whose process ended shows up as end of stream, a reset or a broken pipe, depending on
// which side of the connection noticed first: all say the same to the user.
bool peer_gone(int error) { return error == ECONNRESET || error == EPIPE || error == ENOTCONN; }
const char* gone_text = " closed its connection (the process ended or failed)";

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

// Nagle off (a ring step's last segment must not wait for an ACK) and non-blocking: the
// collectives drive the native handle with sendmsg/read and poll().
void prepare_for_frames(tcp::socket& socket, int peer, const std::string& name) {
  boost::system::error_code ec;
  socket.set_option(tcp::no_delay(true), ec);
  if (!ec) socket.non_blocking(true, ec);
  if (ec) throw peer_error(peer, "cannot set up the connection with " + name + ": " + ec.message());
}

// Connects to `ep` (a host name or address), retrying while nobody listens there yet, until the
// deadline. Each attempt is bounded by the deadline too (a host that drops SYNs would otherwise
// hold connect() for minutes).
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
        if (peer_gone(errno)) throw peer_error(peer, name + gone_text);
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
      if (r == 0) throw peer_error(peer, name + gone_text);
      if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        if (peer_gone(errno)) throw peer_error(peer, name + gone_text);
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

// What a frame says about the collective it belongs to.
struct frame_header {
  wire::Collective kind = wire::Collective::ALL_REDUCE;
  std::uint64_t sequence = 0;
  std::uint32_t index = 0;  // all-gather: the block's rank
  std::uint32_t root = 0;   // broadcast: the root; all-reduce block: the rank whose block it is
  std::uint64_t total = 0;  // broadcast: the buffer's bytes; all-gather, all-reduce block: the block's
};

// For error messages: "a broadcast of 1000 bytes from root 2 (operation 7)".
std::string describe(const frame_header& h) {
  const std::string operation = " (operation " + std::to_string(h.sequence) + ")";
  const std::string bytes = std::to_string(h.total) + " bytes";
  switch (h.kind) {
    case wire::Collective::ALL_REDUCE: return "an all-reduce" + operation;
    case wire::Collective::BROADCAST:
      return "a broadcast of " + bytes + " from root " + std::to_string(h.root) + operation;
    case wire::Collective::BROADCAST_CLOSE:
      return "the end of a broadcast of " + bytes + " from root " + std::to_string(h.root) + operation;
    case wire::Collective::ALL_GATHER:
      return "an all-gather with a block of " + bytes + " from rank " + std::to_string(h.index) + operation;
    case wire::Collective::ALL_REDUCE_BLOCK:
      return "a small all-reduce with the block of " + bytes + " of rank " + std::to_string(h.root) + operation;
  }
  return "a frame of unknown kind " + std::to_string(static_cast<unsigned>(h.kind)) + operation;
}

// Puts `n` bytes at `p` into `chunk`: referenced in place when they are whole aligned words (an
// external segment, no copy), copied otherwise.
void set_data(capnp::MallocMessageBuilder& msg, wire::Chunk::Builder chunk, const char* p, std::size_t n) {
  if (n == 0) return;
  if (n % 8 == 0 && reinterpret_cast<std::uintptr_t>(p) % 8 == 0) {
    chunk.adoptData(
        msg.getOrphanage().referenceExternalData(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(p), n)));
  } else {
    // An odd-sized or unaligned piece: copied, since external segments are whole words.
    std::memcpy(chunk.initData(static_cast<unsigned>(n)).begin(), p, n);
  }
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

struct listener::impl {
  asio::io_context io;  // runs the acceptor's asynchronous accept in tcp_ring's constructor
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

struct tcp_ring::impl {
  // Connection setup runs on Boost.Asio; once connected, the collectives drive the sockets'
  // native handles with sendmsg/read and a busy-poll before poll(): tuned for latency, with no
  // reactor in between. `io` is declared first so that it outlives the sockets.
  asio::io_context io;
  std::optional<tcp::socket> next_socket;
  std::optional<tcp::socket> prev_socket;
  int next_fd = -1;  // to rank + 1: next_socket's native handle
  int prev_fd = -1;  // from rank - 1: prev_socket's native handle
  std::string next_name;
  std::string prev_name;
  int next_rank = 0;
  int prev_rank = 0;
  std::chrono::milliseconds timeout{0};
  std::chrono::microseconds spin{50};
  bool yield_while_spinning = false;
  std::atomic<bool> shut_down{false};  // by shutdown(), from another thread
  std::uint64_t sequence = 0;
  outgoing out;       // to the successor
  incoming in;        // from the predecessor
  outgoing out_back;  // to the predecessor: small all-reduces only
  incoming in_back;   // from the successor: small all-reduces only
  std::vector<capnp::word> blocks;  // small all-reduce: the other ranks' buffers, word-aligned

  // Sends `out` to the successor while receiving `in` from the predecessor. Busy-polls the
  // sockets for `spin` first (a loopback round trip is a few microseconds; a thread sleeping in
  // poll() takes tens to wake), then sleeps in poll().
  // `both`: also sends `out_back` to the predecessor and receives `in_back` from the successor.
  void exchange(const deadline& until, bool both = false) {
    try {
      exchange_unchecked(until, both);
    } catch (const peer_error& e) {
      if (!shut_down.load()) throw;
      throw peer_error(e.peer(), "the ring was shut down here (a worker was declared gone) while talking to " +
                                     (e.peer() == prev_rank ? prev_name : next_name));
    }
  }

  void exchange_unchecked(const deadline& until, bool both) {
    const auto spin_until_time = clock::now() + spin;
    auto finished = [&] { return out.done() && in.done() && (!both || (out_back.done() && in_back.done())); };
    while (!finished()) {
      if (!out.done()) out.progress(next_fd, next_rank, next_name);
      if (!in.done()) in.progress(prev_fd, prev_rank, prev_name);
      if (both) {
        if (!out_back.done()) out_back.progress(prev_fd, prev_rank, prev_name);
        if (!in_back.done()) in_back.progress(next_fd, next_rank, next_name);
      }
      if (finished()) break;
      if (clock::now() < spin_until_time) {
        if (yield_while_spinning) {
          yield_cpu();  // more ranks than cores here: let the one we wait for run
        } else {
          cpu_relax();
        }
        continue;
      }
      const short next_events = static_cast<short>((out.done() ? 0 : POLLOUT) | (both && !in_back.done() ? POLLIN : 0));
      const short prev_events = static_cast<short>((in.done() ? 0 : POLLIN) | (both && !out_back.done() ? POLLOUT : 0));
      pollfd fds[2];
      nfds_t n = 0;
      if (next_events != 0) fds[n++] = {next_fd, next_events, 0};
      if (prev_events != 0) fds[n++] = {prev_fd, prev_events, 0};
      int rc = poll(fds, n, until.poll_ms());
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0) throw std::runtime_error("tcp_ring: poll failed: " + errno_text());
      if (rc == 0) {
        const std::string waited = " ms waiting for ";
        const std::string after = "timed out after " + std::to_string(timeout.count()) + waited;
        if (!in.done()) throw peer_error(prev_rank, after + prev_name + " to send");
        if (both && !in_back.done()) throw peer_error(next_rank, after + next_name + " to send");
        if (!out.done()) throw peer_error(next_rank, after + next_name + " to receive");
        throw peer_error(prev_rank, after + prev_name + " to receive");
      }
    }
  }

  // Starts a frame of a byte collective to the successor: `n` bytes at `p`, at `offset` of a
  // whole of `total` bytes.
  void send_bytes(const frame_header& h, std::uint64_t offset, const char* p, std::size_t n) {
    auto msg = std::make_unique<capnp::MallocMessageBuilder>(32);
    auto chunk = msg->initRoot<wire::Chunk>();
    chunk.setKind(h.kind);
    chunk.setSequence(h.sequence);
    chunk.setIndex(h.index);
    chunk.setRoot(h.root);
    chunk.setTotal(h.total);
    chunk.setType(wire::ScalarType::UINT8);
    chunk.setOffset(offset);
    chunk.setCount(n);
    set_data(*msg, chunk, p, n);
    out.start(std::move(msg));
  }

  // Starts a small all-reduce frame on `to`: the whole buffer of rank `h.root`, `count` elements
  // at `p`.
  static void send_block(outgoing& to, const frame_header& h, scalar_type type, std::int64_t count, const char* p) {
    auto msg = std::make_unique<capnp::MallocMessageBuilder>(32);
    auto chunk = msg->initRoot<wire::Chunk>();
    chunk.setKind(h.kind);
    chunk.setSequence(h.sequence);
    chunk.setRoot(h.root);
    chunk.setTotal(h.total);
    chunk.setType(to_wire(type));
    chunk.setCount(static_cast<std::uint64_t>(count));
    set_data(*msg, chunk, p, h.total);
    to.start(std::move(msg));
  }

  // Checks the small all-reduce frame just received on `from` (from `peer`, called `name`) against
  // `want`, `type` and `count`, and copies its bytes to `dst`.
  void take_block(incoming& from, int peer, const std::string& name, int self, const frame_header& want,
                  scalar_type type, std::int64_t count, char* dst) {
    try {
      auto chunk = from.reader().getRoot<wire::Chunk>();
      const frame_header got{chunk.getKind(), chunk.getSequence(), chunk.getIndex(), chunk.getRoot(), chunk.getTotal()};
      if (got.kind != want.kind || got.sequence != want.sequence || got.root != want.root || got.total != want.total) {
        throw peer_error(peer, "all_reduce: " + name + " sent " + describe(got) + ", rank " + std::to_string(self) +
                                   " (this worker) expected " + describe(want) +
                                   " (the workers disagree on the collective)");
      }
      auto d = chunk.getData();  // read once: every getData() counts against the traversal limit
      if (chunk.getType() != to_wire(type) || chunk.getOffset() != 0 ||
          chunk.getCount() != static_cast<std::uint64_t>(count) || d.size() != want.total) {
        throw peer_error(peer, "all_reduce: malformed frame from " + name + ": " + std::to_string(d.size()) +
                                   " bytes, " + std::to_string(chunk.getCount()) + " elements of type " +
                                   std::to_string(static_cast<unsigned>(chunk.getType())) + " in " + describe(got) +
                                   ", expected " + std::to_string(count) + " of type " +
                                   std::to_string(static_cast<unsigned>(to_wire(type))));
      }
      std::memcpy(dst, d.begin(), d.size());
    } catch (const kj::Exception& x) {
      throw peer_error(peer, "all_reduce: malformed frame from " + name + ": " + x.getDescription().cStr());
    }
  }

  // The small all-reduce (see the walkthrough in the header): whole buffers both ways around the
  // ring, then every rank adds all of them in rank order.
  void small_all_reduce(int self, int size, char* data, std::int64_t count, scalar_type type, reduce_kind op,
                        std::uint64_t seq, const deadline& until) {
    const std::size_t nbytes = static_cast<std::size_t>(count) * scalar_size(type);
    const std::size_t stride_words = (nbytes + sizeof(capnp::word) - 1) / sizeof(capnp::word);
    const std::size_t words = static_cast<std::size_t>(size) * stride_words;
    if (blocks.size() < words) blocks.resize(words);
    auto wrap = [&](int r) { return ((r % size) + size) % size; };
    // This rank's block is `data` itself; the others land in `blocks`, at their rank's place.
    auto block_of = [&](int owner) {
      if (owner == self) return data;
      return reinterpret_cast<char*>(blocks.data() + static_cast<std::size_t>(owner) * stride_words);
    };
    auto header_of = [&](int owner) {
      return frame_header{wire::Collective::ALL_REDUCE_BLOCK, seq, 0, static_cast<std::uint32_t>(owner), nbytes};
    };
    // A whole segment's limit, not the block's: a peer that disagrees on the size (or runs the large
    // path) still has its frame read, and the error says how the two differ.
    const std::size_t limit_words = segment_bytes / 8 + header_slack_words;
    const int from_prev_steps = size / 2;        // the blocks of ranks self-1 .. self-size/2
    const int from_next_steps = (size - 1) / 2;  // the blocks of ranks self+1 .. self+(size-1)/2
    for (int k = 1; k <= from_prev_steps; ++k) {
      const bool back = k <= from_next_steps;
      const int forward_owner = wrap(self - (k - 1));  // to the successor: own block first
      send_block(out, header_of(forward_owner), type, count, block_of(forward_owner));
      in.start(limit_words);
      if (back) {
        const int backward_owner = wrap(self + (k - 1));
        send_block(out_back, header_of(backward_owner), type, count, block_of(backward_owner));
        in_back.start(limit_words);
      }
      exchange(until, back);
      const int from_prev = wrap(self - k);
      take_block(in, prev_rank, prev_name, self, header_of(from_prev), type, count, block_of(from_prev));
      if (back) {
        const int from_next = wrap(self + k);
        take_block(in_back, next_rank, next_name, self, header_of(from_next), type, count, block_of(from_next));
      }
    }
    // Rank order 0..size-1 on every rank: the same additions, so the same bits everywhere.
    std::vector<const void*> ins(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) ins[static_cast<std::size_t>(r)] = block_of(r);
    void* outs[1] = {data};
    kernels::reduce_range(ins.data(), size, outs, 1, 0, count, type, op);
  }

  // Starts receiving a frame of a byte collective. The limit is a whole segment whatever this
  // rank expects, so that a disagreeing peer's frame is still read and the error says how the
  // two disagree.
  void receive_bytes() { in.start(segment_bytes / 8 + header_slack_words); }

  // Checks the frame just received against `want` and `n` bytes at `offset`; returns its bytes,
  // read in place (valid until the next receive).
  const kj::byte* take_bytes(const char* op, int self, const frame_header& want, std::uint64_t offset, std::size_t n) {
    try {
      auto chunk = in.reader().getRoot<wire::Chunk>();
      const frame_header got{chunk.getKind(), chunk.getSequence(), chunk.getIndex(), chunk.getRoot(), chunk.getTotal()};
      if (got.kind != want.kind || got.sequence != want.sequence || got.index != want.index || got.root != want.root ||
          got.total != want.total) {
        throw peer_error(prev_rank, std::string(op) + ": " + prev_name + " sent " + describe(got) + ", rank " +
                                        std::to_string(self) + " (this worker) expected " + describe(want) +
                                        " (the workers disagree on the collective)");
      }
      auto d = chunk.getData();  // read once: every getData() counts against the traversal limit
      if (chunk.getType() != wire::ScalarType::UINT8 || chunk.getOffset() != offset || chunk.getCount() != n ||
          d.size() != n) {
        throw peer_error(prev_rank, std::string(op) + ": malformed frame from " + prev_name + ": " +
                                        std::to_string(d.size()) + " bytes at offset " +
                                        std::to_string(chunk.getOffset()) + " of " + describe(got) + ", expected " +
                                        std::to_string(n) + " at " + std::to_string(offset));
      }
      return d.begin();
    } catch (const kj::Exception& x) {
      throw peer_error(prev_rank, std::string(op) + ": malformed frame from " + prev_name + ": " +
                                      x.getDescription().cStr());
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
  s.next_socket.emplace(
      connect_with_retry(s.io, peers[static_cast<std::size_t>(s.next_rank)], until, s.next_rank, s.next_name));
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
      prepare_for_frames(socket, s.prev_rank, s.prev_name);
      s.prev_socket.emplace(std::move(socket));
      s.prev_fd = s.prev_socket->native_handle();
      break;
    }
    if (result == asio::error::operation_aborted) {
      throw peer_error(s.prev_rank, "timed out waiting for " + s.prev_name + " to connect");
    }
    // A connection that was reset before it was accepted: wait for the next one.
    if (result == asio::error::connection_aborted || result == asio::error::interrupted ||
        result == asio::error::try_again) {
      continue;
    }
    throw std::runtime_error("tcp_ring: accepting " + s.prev_name + " failed: " + result.message());
  }

  // Hellos both ways, as frames through the same checked reader as the collectives': the successor
  // learns who we are, we check who our predecessor is.
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
    set_data(*msg, chunk, bytes + static_cast<std::size_t>(b) * esize, nbytes);
    s.out.start(std::move(msg));
  };
  // Checks the frame against what this rank expects and hands its bytes, read in place, to `use`.
  auto take_segment = [&](int c, std::int64_t b, std::int64_t e, auto&& use) {
    try {
      auto chunk = s.in.reader().getRoot<wire::Chunk>();
      if (chunk.getKind() != wire::Collective::ALL_REDUCE) {
        const frame_header got{chunk.getKind(), chunk.getSequence(), chunk.getIndex(), chunk.getRoot(),
                               chunk.getTotal()};
        throw peer_error(s.prev_rank, "all_reduce: " + s.prev_name + " sent " + describe(got) + ", rank " +
                                          std::to_string(rank_) + " (this worker) expected an all-reduce (operation " +
                                          std::to_string(seq) + ") (the workers disagree on the collective)");
      }
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
      kernels::reduce_range(ins, 2, outs, 1, 0, count, type, reduce_kind::sum);
    });
    if (op == reduce_kind::mean) kernels::scale_range(bytes, count, type, size_);
    return;
  }
  if (size_ > 2 && static_cast<std::size_t>(count) * esize <= small_all_reduce_bytes) {
    s.small_all_reduce(rank_, size_, bytes, count, type, op, seq, until);
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
      kernels::reduce_range(ins, 2, outs, 1, 0, e - b, type, reduce_kind::sum);
    });
  }
  const int owned = (rank_ + 1) % size_;
  if (op == reduce_kind::mean) {
    auto [b, e] = chunk_bounds(count, size_, owned);
    // Divide the finished chunk once, where it is complete, so every rank gets the same bits.
    kernels::scale_range(bytes + static_cast<std::size_t>(b) * esize, e - b, type, size_);
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

void tcp_ring::broadcast(void* data, std::size_t bytes, int root) {
  if (root < 0 || root >= size_) {
    throw std::invalid_argument("broadcast: root " + std::to_string(root) + " out of range for a ring of " +
                                std::to_string(size_) + " ranks (expected 0.." + std::to_string(size_ - 1) + ")");
  }
  if (bytes == 0 || size_ == 1) return;  // every rank passes the same size: all return here
  if (data == nullptr) throw std::invalid_argument("broadcast: null buffer for " + std::to_string(bytes) + " bytes");
  auto& s = *impl_;
  auto* buf = static_cast<char*>(data);
  const deadline until(s.timeout);
  const frame_header segment_header{wire::Collective::BROADCAST, s.sequence++, 0, static_cast<std::uint32_t>(root),
                                    bytes};
  frame_header close_header = segment_header;
  close_header.kind = wire::Collective::BROADCAST_CLOSE;
  const std::size_t segments = (bytes + segment_bytes - 1) / segment_bytes;
  auto begin_of = [&](std::size_t k) { return k * segment_bytes; };
  auto size_of = [&](std::size_t k) { return std::min(bytes, (k + 1) * segment_bytes) - k * segment_bytes; };
  // The rank's place in the chain: 0 is the root, size-1 the rank before it, which does not
  // forward.
  const int position = (rank_ - root + size_) % size_;
  const bool last = position == size_ - 1;
  // Round k: the root sends segment k; a middle rank receives segment k while it forwards k-1 (one
  // round more to forward the last); the last rank receives segment k. In round 0 the last rank
  // also sends the root the closing frame, which the root checks.
  const std::size_t rounds = position != 0 && !last ? segments + 1 : segments;
  for (std::size_t k = 0; k < rounds; ++k) {
    if (position == 0) {
      s.send_bytes(segment_header, begin_of(k), buf + begin_of(k), size_of(k));
    } else if (!last && k >= 1) {
      s.send_bytes(segment_header, begin_of(k - 1), buf + begin_of(k - 1), size_of(k - 1));
    } else if (last && k == 0) {
      s.send_bytes(close_header, 0, nullptr, 0);
    }
    const bool receiving = position == 0 ? k == 0 : k < segments;
    if (receiving) {
      s.receive_bytes();
    } else {
      s.in.skip();
    }
    s.exchange(until);
    if (!receiving) continue;
    if (position == 0) {
      s.take_bytes("broadcast", rank_, close_header, 0, 0);
    } else {
      const kj::byte* in = s.take_bytes("broadcast", rank_, segment_header, begin_of(k), size_of(k));
      std::memcpy(buf + begin_of(k), in, size_of(k));
    }
  }
}

void tcp_ring::all_gather(const void* mine, std::size_t my_bytes, void* out,
                          const std::vector<std::size_t>& bytes_per_rank) {
  if (bytes_per_rank.size() != static_cast<std::size_t>(size_)) {
    throw std::invalid_argument("all_gather: " + std::to_string(bytes_per_rank.size()) +
                                " block sizes for a ring of " + std::to_string(size_) +
                                " ranks (expected one per rank)");
  }
  const auto me = static_cast<std::size_t>(rank_);
  if (my_bytes != bytes_per_rank[me]) {
    throw std::invalid_argument("all_gather: rank " + std::to_string(rank_) + " gives " + std::to_string(my_bytes) +
                                " bytes, but bytes_per_rank[" + std::to_string(rank_) + "] is " +
                                std::to_string(bytes_per_rank[me]) + " (expected them equal)");
  }
  std::vector<std::size_t> offsets(bytes_per_rank.size() + 1, 0);
  for (std::size_t r = 0; r < bytes_per_rank.size(); ++r) {
    if (bytes_per_rank[r] > SIZE_MAX - offsets[r]) {
      throw std::invalid_argument("all_gather: the block sizes add up to more than SIZE_MAX bytes");
    }
    offsets[r + 1] = offsets[r] + bytes_per_rank[r];
  }
  if (offsets.back() > 0 && out == nullptr) {
    throw std::invalid_argument("all_gather: null output for " + std::to_string(offsets.back()) + " bytes");
  }
  if (my_bytes > 0 && mine == nullptr) {
    throw std::invalid_argument("all_gather: null block for " + std::to_string(my_bytes) + " bytes");
  }
  auto* dst = static_cast<char*>(out);
  if (my_bytes > 0 && dst + offsets[me] != mine) std::memmove(dst + offsets[me], mine, my_bytes);  // may overlap
  if (size_ == 1) return;

  auto& s = *impl_;
  const deadline until(s.timeout);
  const std::uint64_t seq = s.sequence++;
  // A block of n bytes travels as max(1, ceil(n / segment)) frames: an empty block still sends one,
  // so that the receiver checks its size.
  auto segments_of = [&](std::size_t block) {
    return std::max<std::size_t>(1, (bytes_per_rank[block] + segment_bytes - 1) / segment_bytes);
  };
  auto header_of = [&](std::size_t block) {
    return frame_header{wire::Collective::ALL_GATHER, seq, static_cast<std::uint32_t>(block), 0,
                        bytes_per_rank[block]};
  };
  // Step k: send block rank-k (own first, then the one received last step) while receiving
  // block rank-k-1, segment by segment.
  for (int k = 0; k < size_ - 1; ++k) {
    const auto send_block = static_cast<std::size_t>(((rank_ - k) % size_ + size_) % size_);
    const auto recv_block = static_cast<std::size_t>(((rank_ - k - 1) % size_ + size_) % size_);
    const std::size_t send_segments = segments_of(send_block);
    const std::size_t recv_segments = segments_of(recv_block);
    const frame_header send_header = header_of(send_block);
    const frame_header recv_header = header_of(recv_block);
    for (std::size_t j = 0; j < std::max(send_segments, recv_segments); ++j) {
      const std::size_t b = j * segment_bytes;
      if (j < send_segments) {
        const std::size_t n = std::min(bytes_per_rank[send_block], b + segment_bytes) - b;
        s.send_bytes(send_header, b, dst + offsets[send_block] + b, n);
      }
      const bool receiving = j < recv_segments;
      if (receiving) {
        s.receive_bytes();
      } else {
        s.in.skip();
      }
      s.exchange(until);
      if (!receiving) continue;
      const std::size_t n = std::min(bytes_per_rank[recv_block], b + segment_bytes) - b;
      const kj::byte* in = s.take_bytes("all_gather", rank_, recv_header, b, n);
      if (n > 0) std::memcpy(dst + offsets[recv_block] + b, in, n);
    }
  }
}

}  // namespace troupe::transport
