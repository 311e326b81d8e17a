#pragma once
// The frames of the TCP data plane (schema/frame.capnp), written and read in one place: one
// writer, one reader that checks every field against what the receiver expects, and the pump that
// moves them over a ring_link. Private to transport/: Cap'n Proto does not leave this folder.

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "frame.capnp.h"
#include "troupe/base/elements.hpp"
#include "troupe/transport/ring_link.hpp"

namespace troupe::transport::frames {

using clock = std::chrono::steady_clock;

/// Room for a frame's structure beside its data, in words.
constexpr std::size_t header_slack_words = 1024;
/// A frame has at most this many segments (ours have 1 or 2).
constexpr std::uint32_t max_segments = 64;
/// "trup": the first field of a hello.
constexpr std::uint32_t hello_magic = 0x74727570;

/// A bound on every wait; none when the timeout is 0.
class deadline {
 public:
  explicit deadline(std::chrono::milliseconds timeout) : bounded_(timeout.count() > 0), at_(clock::now() + timeout) {}
  /// Milliseconds left, for poll(): -1 when unbounded.
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

/// The wire's name of a scalar type.
wire::ScalarType to_wire(base::scalar_type t);

/// What a chunk frame says about the collective it belongs to.
struct frame_header {
  wire::Collective kind = wire::Collective::ALL_REDUCE;
  std::uint64_t step = 0;      // the training step (the runtime's count of Strategy::run calls)
  std::uint64_t sequence = 0;  // the collective's number within its step
  std::uint32_t index = 0;  // all-reduce: the chunk; all-gather: the block's rank
  std::uint32_t root = 0;   // broadcast: the root; all-reduce block: the rank whose block it is
  std::uint64_t total = 0;  // broadcast: the buffer's bytes; all-gather, all-reduce block: the block's
  std::uint64_t key = 0;    // the collective's name (tcp_ring::name_next_collective), 0: none
};

/// A whole chunk frame as the receiver expects it, or as the sender writes it: the header, and
/// where its data lies (`count` elements of `type`, the first at `offset`, `bytes` bytes).
struct chunk_frame {
  frame_header header;
  wire::ScalarType type = wire::ScalarType::UINT8;
  std::uint64_t offset = 0;
  std::uint64_t count = 0;
  std::size_t bytes = 0;
};

/// A hello's fields (schema/frame.capnp), unchecked.
struct hello_fields {
  std::uint32_t magic = 0;
  std::uint32_t version = 0;
  std::uint32_t rank = 0;
  std::uint32_t size = 0;
  std::vector<std::uint8_t> nonce;
  std::vector<std::uint8_t> proof;
};

/// For error messages: "a broadcast of 1000 bytes from root 2 (step 3, collective 7)".
std::string describe(const frame_header& h);

/// The length of the frame at the start of `bytes` (segment table and segments), or 0 when its
/// end is not among the `n` bytes yet (or the table names more than max_segments segments).
std::size_t frame_length(const unsigned char* bytes, std::size_t n);

class frame_mac;

/// A thread that computes frame tags beside the ring's own thread, so that hashing a large frame
/// overlaps with moving its bytes (the rank's thread sends and receives while this one hashes).
/// The frame_macs of one link share one: their jobs run in the order they were posted. Started on
/// first use; when no thread can be started, the tags are computed by the caller as before.
class tag_thread {
 public:
  tag_thread() = default;
  ~tag_thread();
  tag_thread(const tag_thread&) = delete;
  tag_thread& operator=(const tag_thread&) = delete;

  /// Frames with at least this many bytes of data are hashed here; smaller ones by the caller
  /// (handing them over would cost more than it saves).
  static constexpr std::size_t min_frame_bytes = 64 * 1024;

  /// Whether this machine has a core for each of `ranks` ranks and one for each one's tag_thread
  /// (all ranks on this machine is the worst case): tag_hashing::automatic.
  static bool spare_cores(int ranks);

 private:
  friend class frame_mac;
  struct job {
    frame_mac* mac;
    enum class kind { begin, add, end } what;
    const void* data;
    std::size_t bytes;
    std::uint64_t number;
  };
  // Queues `j`: false when no thread runs (it could not be started), for the caller to do it.
  bool post(const job& j);
  void run();

  // Waits until `mac` holds no job here: a short spin, then asleep until the thread wakes it.
  void wait_for(const frame_mac& mac);

  std::mutex mutex_;
  std::condition_variable wake_;  // a job posted, or stop
  std::condition_variable done_;  // a job done while someone waits (waiters_)
  std::atomic<int> waiters_{0};
  std::deque<job> jobs_;
  std::atomic<std::uint64_t> queued_{0};  // jobs ever posted, read without the lock
  bool idle_ = false;  // the thread waits on wake_
  bool stop_ = false;
  bool failed_ = false;  // the thread could not be started
  std::thread thread_;
};

/// The integrity tags of one direction of one connection: AES-256-GCM used as a MAC (GMAC: the
/// whole frame, segment table and segments, is authenticated and sent in the clear) under a key
/// that both sides derive from the connection's proof, with the frame's number on the stream in
/// the nonce, so that a frame altered, replayed, reordered or moved to another connection fails.
/// Each frame is followed by its 16-byte tag.
/// With a tag_thread, the bytes of a large frame (add() with `defer`) are hashed on that thread
/// while the caller goes on; end() and matches() wait for them. The caller keeps the bytes in
/// place until then (or until drain()).
class frame_mac {
 public:
  static constexpr std::size_t tag_bytes = 16;
  /// `key`: 32 bytes; `direction`: which way on the connection (the two ways share the key);
  /// `helper`: where large frames are hashed (null: always by the caller).
  frame_mac(const std::vector<std::uint8_t>& key, std::uint32_t direction,
            std::shared_ptr<tag_thread> helper = nullptr);
  ~frame_mac();
  frame_mac(const frame_mac&) = delete;
  frame_mac& operator=(const frame_mac&) = delete;

  /// The tag of the next frame, whose bytes are the `count` buffers at `iov`.
  void tag(const iovec* iov, std::size_t count, unsigned char* out);
  /// Whether `tag` is the next frame's, whose bytes are the `count` buffers at `iov`.
  bool check(const iovec* iov, std::size_t count, const unsigned char* tag);

  /// The same piece by piece: begin() the next frame, add() its bytes in order, then end() writes
  /// its tag (or matches() compares it with a received one). add() with `defer` hands the bytes
  /// to the tag_thread, if any; finish() ends the frame without waiting, result() then waits for
  /// its tag.
  void begin();
  void add(const void* data, std::size_t n, bool defer = false);
  void end(unsigned char* out);
  bool matches(const unsigned char* tag);
  void finish();
  void result(unsigned char* out);
  /// Waits until the tag_thread holds no job of this frame_mac (its bytes may go away then).
  void drain();
  /// Whether large frames are hashed on a tag_thread.
  bool helped() const { return helper_ != nullptr; }

 private:
  friend class tag_thread;
  // Sequentially consistent: see tag_thread::wait_for.
  bool pending() const { return finished_.load() != posted_; }
  void post(tag_thread::job::kind what, const void* data, std::size_t n, std::uint64_t number);
  void do_begin(std::uint64_t number);
  void do_add(const void* data, std::size_t n);
  void do_end();

  void* ctx_;  // EVP_CIPHER_CTX
  std::uint32_t direction_;
  std::uint64_t number_ = 0;  // frames begun so far
  std::shared_ptr<tag_thread> helper_;
  std::uint64_t posted_ = 0;                // jobs handed to the helper (the caller's count)
  std::atomic<std::uint64_t> finished_{0};  // of them done (the helper's count)
  std::atomic<bool> failed_{false};         // OpenSSL failed on the helper
  unsigned char result_[tag_bytes] = {};    // the last frame's tag
};

/// One frame going out on one side: the segment table and the message's segments, gathered as the
/// link takes them. Data that is whole aligned words is a segment of its own that points into the
/// caller's buffer (no copy); the builder's first segment is scratch space reused frame after
/// frame.
class frame_writer {
 public:
  explicit frame_writer(ring_side side) : side_(side) {}
  frame_writer(const frame_writer&) = delete;
  frame_writer& operator=(const frame_writer&) = delete;

  /// Starts a chunk frame with `f.bytes` bytes at `data`, which must stay put until done().
  void start_chunk(const chunk_frame& f, const void* data);
  /// Starts a hello with `nonce` and `proof` (either may be empty); `magic` other than
  /// hello_magic only for tests that forge one.
  void start_hello(std::uint32_t version, std::uint32_t rank, std::uint32_t size, const std::vector<std::uint8_t>& nonce,
                   const std::vector<std::uint8_t>& proof, std::uint32_t magic = hello_magic);
  /// Nothing to send this time.
  void skip() { next_ = iov_.size(); }
  bool done() const { return next_ >= iov_.size(); }
  /// Bytes written since this writer was made (for the ring's progress watch).
  std::uint64_t moved() const { return moved_; }
  /// Changes whenever bytes went out (for the ring's progress watch).
  std::uint64_t mark() const { return done() ? ~std::uint64_t{0} : (std::uint64_t{next_} << 40) ^ iov_[next_].iov_len; }
  /// Writes what the link takes now.
  void progress(ring_link& link);
  ring_side side() const { return side_; }
  /// The whole frame started last as it goes on the wire (for the in-process ring's tests).
  std::vector<unsigned char> bytes() const;
  /// Every frame started from now on is followed by its tag (null: none).
  void tag_with(frame_mac* mac) { mac_ = mac; }

 private:
  capnp::MallocMessageBuilder& fresh_builder();
  void frame_segments();

  ring_side side_;
  frame_mac* mac_ = nullptr;
  unsigned char tag_[frame_mac::tag_bytes] = {};
  std::size_t body_iovs_ = 0;  // the frame's own buffers; with a tag, one more follows
  bool tagged_ = false;        // the tag is computed
  bool hashed_ahead_ = false;  // the frame is hashed on the tag_thread, not as it goes out
  alignas(8) std::array<capnp::word, 64> scratch_{};
  std::optional<capnp::MallocMessageBuilder> builder_;
  std::vector<std::uint32_t> table_;
  std::vector<iovec> iov_;
  std::size_t next_ = 0;
  std::uint64_t moved_ = 0;
};

/// One frame coming in on one side: the segment table, checked against the limit, then the
/// segments into one word-aligned buffer parsed in place (Cap'n Proto traversal limits set per
/// frame). Its checks turn every problem, a Cap'n Proto exception included, into a peer_error
/// naming the peer.
class frame_reader {
 public:
  explicit frame_reader(ring_side side) : side_(side) {}
  frame_reader(const frame_reader&) = delete;
  frame_reader& operator=(const frame_reader&) = delete;

  /// Starts receiving a frame of at most `max_words` words.
  void start(std::size_t max_words);
  /// Nothing to receive this time.
  void skip() { stage_ = stage::complete; }
  bool done() const { return stage_ == stage::complete; }
  /// Whether any byte of the frame started last has arrived.
  bool begun() const { return stage_ != stage::head || have_ > 0; }
  /// Bytes read since this reader was made (for the ring's progress watch).
  std::uint64_t moved() const { return moved_; }
  /// Changes whenever bytes came in (for the ring's progress watch).
  std::uint64_t mark() const { return (static_cast<std::uint64_t>(stage_) << 56) ^ have_; }
  /// Reads what the link has.
  void progress(ring_link& link);
  /// Reads one whole frame of at most `max_words` words from `n` bytes: false when they are not
  /// exactly one frame (for the in-process ring's tests).
  bool parse(const unsigned char* bytes, std::size_t n, std::size_t max_words);
  ring_side side() const { return side_; }
  /// Every frame received from now on must be followed by its tag (null: none); one whose tag
  /// does not match is a peer_error naming the peer, for every worker to learn.
  void check_with(frame_mac* mac) { mac_ = mac; }

  /// Checks the chunk frame just received against `want` (`op` and `self` name the collective and
  /// this rank in errors) and returns its `want.bytes` bytes, read in place: valid until the next
  /// start(). Null when `want.bytes` is 0.
  const kj::byte* take_chunk(const ring_link& link, const char* op, int self, const chunk_frame& want);
  /// The hello just received, as the sender wrote it; a malformed one is std::runtime_error.
  hello_fields take_hello();
  /// The chunk frame just received, unchecked; reading it may throw kj::Exception.
  wire::Chunk::Reader chunk() { return reader_->getRoot<wire::Chunk>(); }

 private:
  enum class stage { head, table, body, tag, complete };
  // Reads through `read(into, n)` (bytes read, 0: none yet) until the frame is done or nothing
  // more comes; `from` names the peer in errors.
  template <typename Read>
  void pull(Read&& read, const ring_peer& from);
  void advance(const ring_peer& from);

  void finish(const ring_peer& from);

  ring_side side_;
  frame_mac* mac_ = nullptr;
  unsigned char tag_[frame_mac::tag_bytes] = {};
  std::size_t total_words_ = 0;
  std::size_t max_words_ = 0;
  stage stage_ = stage::complete;
  std::size_t have_ = 0;
  std::size_t need_ = 0;
  std::vector<std::uint32_t> table_;
  std::vector<std::uint64_t> words_;  // the body, as words (capnp::word is not movable under clang)
  std::vector<kj::ArrayPtr<const capnp::word>> segments_;
  std::optional<capnp::SegmentArrayMessageReader> reader_;
  std::uint64_t moved_ = 0;
};

/// How a wait spends its first moments: busy-polling (a loopback round trip is a few microseconds;
/// a thread asleep in poll() takes tens to wake), yielding the CPU between polls when ranks share
/// too few cores.
struct spin_policy {
  std::chrono::microseconds spin{50};
  bool yield = false;
};

/// A rank's four directions over its link: frames to the successor and from the predecessor (every
/// collective), and the other way round (the small all-reduce only).
class frame_pump {
 public:
  /// Over `link`, which outlives the pump (null for a ring of one rank, which sends nothing);
  /// frames carry the link's tags when it has them.
  explicit frame_pump(ring_link* link) : link_(link) {
    if (link_ == nullptr) return;
    to_next.tag_with(link_->out_mac(ring_side::next));
    to_prev.tag_with(link_->out_mac(ring_side::prev));
    from_prev.check_with(link_->in_mac(ring_side::prev));
    from_next.check_with(link_->in_mac(ring_side::next));
  }

  frame_writer to_next{ring_side::next};
  frame_reader from_prev{ring_side::prev};
  frame_writer to_prev{ring_side::prev};
  frame_reader from_next{ring_side::next};

  /// Moves to_next and from_prev (and, with `both`, to_prev and from_next) until all are done:
  /// busy-polls for the spin, then sleeps in the link's wait(). Past the deadline, a peer_error
  /// names the neighbour waited for; `timeout` is the bound it reports.
  /// `first_from_prev`, when given and still unset (the epoch), receives the moment the first
  /// byte from the predecessor was seen.
  void exchange(const deadline& until, std::chrono::milliseconds timeout, const spin_policy& spin, bool both = false,
                clock::time_point* first_from_prev = nullptr);

  /// The progress watch, read from any thread: the rank an exchange waits on (-1: none waits),
  /// and when the pump last moved a byte (steady clock ticks; 0: never).
  std::atomic<int> waiting_on{-1};
  std::atomic<clock::rep> last_progress{0};
  /// Bytes sent to the successor and received from the predecessor since the ring began, as of the
  /// last progress: the two ends of one link count the same stream.
  std::atomic<std::uint64_t> sent_next{0};
  std::atomic<std::uint64_t> received_prev{0};

 private:
  void exchange_frames(const deadline& until, std::chrono::milliseconds timeout, const spin_policy& spin, bool both,
                       clock::time_point* first_from_prev);

  ring_link* link_;
};

}  // namespace troupe::transport::frames
