#include "troupe/transport/memory_ring.hpp"

#include <kj/exception.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>

#include "ring_frames.hpp"
#include "ring_proof.hpp"
#include "troupe/transport/ring_index.hpp"
#include "troupe/transport/tcp_ring.hpp"

namespace troupe::transport {
namespace {

using clock = std::chrono::steady_clock;

// One direction of one connection: the frames written and not yet read, in order.
struct stream {
  struct frame {
    std::vector<unsigned char> bytes;
    std::size_t read = 0;
    clock::time_point ready_at;
  };
  std::vector<unsigned char> partial;  // the start of a frame whose end has not been written yet
  std::deque<frame> frames;
  std::uint64_t framed = 0;  // frames cut from this stream so far, for the hook's `number`
  bool closed = false;

  bool readable(clock::time_point now) const { return closed || (!frames.empty() && frames.front().ready_at <= now); }
};

}  // namespace

struct memory_ring::state {
  int size = 0;
  fault_hook hook;
  std::string token;  // frames carry tags when set
  std::mutex mutex;
  std::condition_variable changed;
  // Connection c joins rank c (its `next` side) and rank c+1 (its `prev` side); forward[c]
  // carries c -> c+1, backward[c] carries c+1 -> c.
  std::vector<stream> forward;
  std::vector<stream> backward;
  std::vector<bool> taken;

  stream& outgoing(int rank, ring_side side) {
    return side == ring_side::next ? forward[static_cast<std::size_t>(rank)]
                                   : backward[static_cast<std::size_t>(ring_index::prev_rank(rank, size))];
  }
  stream& incoming(int rank, ring_side side) {
    return side == ring_side::next ? backward[static_cast<std::size_t>(rank)]
                                   : forward[static_cast<std::size_t>(ring_index::prev_rank(rank, size))];
  }
};

namespace {

std::string in_process_name(int rank) { return "rank " + std::to_string(rank) + " (in-process)"; }

class memory_link final : public ring_link {
 public:
  memory_link(std::shared_ptr<memory_ring::state> state, int rank)
      : ring_link(ring_peer{ring_index::next_rank(rank, state->size), in_process_name(ring_index::next_rank(rank, state->size))},
                  ring_peer{ring_index::prev_rank(rank, state->size), in_process_name(ring_index::prev_rank(rank, state->size))}),
        state_(std::move(state)),
        rank_(rank) {}
  ~memory_link() override { shutdown(); }

  std::size_t write_some(ring_side side, const iovec* iov, std::size_t count) override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    stream& s = state_->outgoing(rank_, side);
    if (s.closed) throw_gone(side);
    std::size_t written = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const auto* p = static_cast<const unsigned char*>(iov[i].iov_base);
      s.partial.insert(s.partial.end(), p, p + iov[i].iov_len);
      written += iov[i].iov_len;
    }
    const int to = peer(side).rank;
    const std::size_t tag = state_->token.empty() ? 0 : frames::frame_mac::tag_bytes;
    for (;;) {
      std::size_t n = frames::frame_length(s.partial.data(), s.partial.size());
      if (n == 0 || s.partial.size() < n + tag) break;
      n += tag;
      std::vector<unsigned char> bytes(s.partial.begin(), s.partial.begin() + static_cast<std::ptrdiff_t>(n));
      s.partial.erase(s.partial.begin(), s.partial.begin() + static_cast<std::ptrdiff_t>(n));
      frame_in_flight f{rank_, to, s.framed++, bytes};
      const frame_fate fate = state_->hook ? state_->hook(f) : frame_fate::deliver();
      if (fate.what == frame_fate::action::drop) continue;
      // In order, as on a TCP stream: a frame is never ready before the one ahead of it.
      auto ready = clock::now();
      if (fate.what == frame_fate::action::delay) ready += fate.delay;
      if (!s.frames.empty()) ready = std::max(ready, s.frames.back().ready_at);
      s.frames.push_back({std::move(bytes), 0, ready});
    }
    state_->changed.notify_all();
    return written;
  }

  std::size_t read_some(ring_side side, void* into, std::size_t n) override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    stream& s = state_->incoming(rank_, side);
    const auto now = clock::now();
    std::size_t got = 0;
    auto* out = static_cast<unsigned char*>(into);
    while (got < n && !s.frames.empty() && s.frames.front().ready_at <= now) {
      auto& f = s.frames.front();
      const std::size_t take = std::min(n - got, f.bytes.size() - f.read);
      std::memcpy(out + got, f.bytes.data() + f.read, take);
      got += take;
      f.read += take;
      if (f.read == f.bytes.size()) s.frames.pop_front();
    }
    if (got == 0 && s.closed && s.frames.empty()) throw_gone(side);
    return got;
  }

  bool wait(const ring_wants& wants, int timeout_ms) override {
    if (wants.write_next || wants.write_prev) return true;  // memory always takes what is written
    std::unique_lock<std::mutex> lock(state_->mutex);
    const auto now = clock::now();
    std::optional<clock::time_point> wake;
    if (timeout_ms >= 0) wake = now + std::chrono::milliseconds(timeout_ms);
    for (ring_side side : {ring_side::next, ring_side::prev}) {
      const bool wanted = side == ring_side::next ? wants.read_next : wants.read_prev;
      if (!wanted) continue;
      const stream& s = state_->incoming(rank_, side);
      if (s.readable(now)) return true;
      // A delayed frame: wake when it is due.
      if (!s.frames.empty() && (!wake || s.frames.front().ready_at < *wake)) wake = s.frames.front().ready_at;
    }
    if (wake) {
      state_->changed.wait_until(lock, *wake);
    } else {
      state_->changed.wait(lock);
    }
    if (timeout_ms < 0) return true;
    // True unless the timeout passed with nothing to read.
    const auto after = clock::now();
    if (after < now + std::chrono::milliseconds(timeout_ms)) return true;
    for (ring_side side : {ring_side::next, ring_side::prev}) {
      const bool wanted = side == ring_side::next ? wants.read_next : wants.read_prev;
      if (wanted && state_->incoming(rank_, side).readable(after)) return true;
    }
    return false;
  }

  void shutdown() noexcept override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    for (ring_side side : {ring_side::next, ring_side::prev}) {
      state_->outgoing(rank_, side).closed = true;
      state_->incoming(rank_, side).closed = true;
    }
    state_->changed.notify_all();
  }

 private:
  std::shared_ptr<memory_ring::state> state_;
  int rank_;
};

}  // namespace

memory_ring::memory_ring(int size, fault_hook hook, std::string token) : size_(size), state_(std::make_shared<state>()) {
  if (size < 2) {
    throw std::invalid_argument("memory_ring: " + std::to_string(size) + " ranks (expected at least 2)");
  }
  state_->size = size;
  state_->hook = std::move(hook);
  state_->token = std::move(token);
  state_->forward.resize(static_cast<std::size_t>(size));
  state_->backward.resize(static_cast<std::size_t>(size));
  state_->taken.assign(static_cast<std::size_t>(size), false);
}

memory_ring::~memory_ring() = default;

std::unique_ptr<ring_link> memory_ring::link(int rank) {
  if (rank < 0 || rank >= size_) {
    throw std::out_of_range("memory_ring: rank " + std::to_string(rank) + " out of range for " +
                            std::to_string(size_) + " ranks (expected 0.." + std::to_string(size_ - 1) + ")");
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->taken[static_cast<std::size_t>(rank)]) {
    throw std::invalid_argument("memory_ring: the link of rank " + std::to_string(rank) + " was taken already");
  }
  state_->taken[static_cast<std::size_t>(rank)] = true;
  auto link = std::make_unique<memory_link>(state_, rank);
  if (!state_->token.empty()) {
    // Connection c joins rank c (connecting, direction 0) and rank c+1 (accepting, direction 1).
    auto key_of = [&](int connection) {
      const std::vector<std::uint8_t> none;
      return proof::make(ring_auth{state_->token, "memory_ring"}, tcp_ring::protocol_version, proof::side::frames,
                         static_cast<std::uint32_t>(size_), static_cast<std::uint32_t>(connection),
                         static_cast<std::uint32_t>(ring_index::next_rank(connection, size_)), none, none);
    };
    const auto next_key = key_of(rank);
    const auto prev_key = key_of(ring_index::prev_rank(rank, size_));
    // One thread beside the rank's own hashes its large frames, both ways on both connections
    // (always here, whatever the cores, so that the tests run it).
    const auto helper = std::make_shared<frames::tag_thread>();
    link->set_frame_macs(ring_side::next, std::make_shared<frames::frame_mac>(next_key, 0, helper),
                         std::make_shared<frames::frame_mac>(next_key, 1, helper));
    link->set_frame_macs(ring_side::prev, std::make_shared<frames::frame_mac>(prev_key, 1, helper),
                         std::make_shared<frames::frame_mac>(prev_key, 0, helper));
  }
  return link;
}

namespace {

// The largest frame a test decodes, in words (a chunk of 64 MiB and its structure).
constexpr std::size_t max_test_frame_words = (std::size_t{64} << 20) / 8 + frames::header_slack_words;

}  // namespace

std::optional<chunk_fields> decode_chunk_frame(const std::vector<unsigned char>& frame) {
  frames::frame_reader reader(ring_side::prev);
  if (!reader.parse(frame.data(), frame.size(), max_test_frame_words)) return std::nullopt;
  try {
    auto c = reader.chunk();
    chunk_fields f;
    f.kind = static_cast<frame_kind>(c.getKind());
    f.step = c.getStep();
    f.sequence = c.getSequence();
    f.index = c.getIndex();
    f.type = static_cast<std::uint16_t>(c.getType());
    f.count = c.getCount();
    f.offset = c.getOffset();
    f.root = c.getRoot();
    f.total = c.getTotal();
    auto d = c.getData();
    f.data.assign(d.begin(), d.end());
    return f;
  } catch (const kj::Exception&) {
    return std::nullopt;
  }
}

std::vector<unsigned char> encode_chunk_frame(const chunk_fields& f) {
  frames::chunk_frame c;
  c.header = {static_cast<wire::Collective>(f.kind), f.step, f.sequence, f.index, f.root, f.total};
  c.type = static_cast<wire::ScalarType>(f.type);
  c.offset = f.offset;
  c.count = f.count;
  c.bytes = f.data.size();
  frames::frame_writer writer(ring_side::next);
  writer.start_chunk(c, f.data.data());
  return writer.bytes();
}

std::vector<unsigned char> encode_hello_frame(const hello_frame_fields& f) {
  frames::frame_writer writer(ring_side::next);
  writer.start_hello(f.version, f.rank, f.size, f.nonce, f.proof, f.magic);
  return writer.bytes();
}

std::optional<hello_frame_fields> decode_hello_frame(const std::vector<unsigned char>& frame) {
  frames::frame_reader reader(ring_side::prev);
  if (!reader.parse(frame.data(), frame.size(), max_test_frame_words)) return std::nullopt;
  try {
    const frames::hello_fields h = reader.take_hello();
    return hello_frame_fields{h.magic, h.version, h.rank, h.size, h.nonce, h.proof};
  } catch (const std::runtime_error&) {
    return std::nullopt;
  }
}

}  // namespace troupe::transport
