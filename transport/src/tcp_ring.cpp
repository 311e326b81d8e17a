#include "troupe/transport/tcp_ring.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <utility>

#include "ring_frames.hpp"
#include "troupe/kernels/reduce_kernels.hpp"
#include "troupe/transport/ring_index.hpp"

namespace troupe::transport {
namespace {

using frames::chunk_frame;
using frames::deadline;
using frames::frame_header;
using namespace ring_index;

constexpr std::size_t exchange_bytes = 64 * 1024;  // two ranks swap buffers up to this size

std::size_t words_for(std::size_t bytes) { return (bytes + 7) / 8 + frames::header_slack_words; }

tcp_ring_options checked(tcp_ring_options o) {
  if (o.segment_bytes < tcp_ring_options::min_segment_bytes || o.segment_bytes > tcp_ring_options::max_segment_bytes ||
      o.segment_bytes % 8 != 0) {
    throw std::invalid_argument("tcp_ring: segment_bytes " + std::to_string(o.segment_bytes) +
                                " (expected a multiple of 8 in " + std::to_string(tcp_ring_options::min_segment_bytes) +
                                ".." + std::to_string(tcp_ring_options::max_segment_bytes) + ")");
  }
  return o;
}

tcp_ring_options with_timeout(std::chrono::milliseconds timeout) {
  tcp_ring_options o;
  o.timeout = timeout;
  return o;
}

}  // namespace

struct tcp_ring::impl {
  impl(std::unique_ptr<ring_link> l, const tcp_ring_options& o) : options(o), link(std::move(l)), pump(link.get()) {}

  tcp_ring_options options;
  std::unique_ptr<ring_link> link;  // null with one rank
  frames::frame_pump pump;          // over *link
  std::atomic<bool> shut_down{false};  // by shutdown(), from another thread
  std::uint64_t step = 0;      // begin_step's
  std::uint64_t sequence = 0;  // collectives run in this step
  std::uint64_t next_key = 0;  // name_next_collective's, for the next collective only
  std::vector<capnp::word> blocks;  // small all-reduce: the other ranks' buffers, word-aligned
  // The last all_reduce: when it began, and when the predecessor's first byte arrived.
  frames::clock::time_point op_begin{};
  frames::clock::time_point first_from_prev{};

  frames::spin_policy spin() const { return {options.spin, options.yield_while_spinning}; }

  // One round of frames (see frame_pump::exchange); after shutdown() any failure says so.
  void exchange(const deadline& until, bool both = false) {
    try {
      pump.exchange(until, options.timeout, spin(), both, &first_from_prev);
    } catch (const peer_error& e) {
      if (!shut_down.load()) throw;
      throw shut_down_error(e);
    }
  }

  // Writes what the successor's socket takes now of the frame begun on to_next, without waiting
  // (the rest goes out in the next exchange); after shutdown() any failure says so.
  void push_next() {
    try {
      pump.to_next.progress(*link);
    } catch (const peer_error& e) {
      if (!shut_down.load()) throw;
      throw shut_down_error(e);
    }
  }

  peer_error shut_down_error(const peer_error& e) const {
    return peer_error(e.peer(), "the ring was shut down here (the cluster watch declared a worker gone, the workers out "
                                "of step or a link tampered with) while talking to " +
                                    link->peer(e.peer() == link->peer(ring_side::prev).rank ? ring_side::prev
                                                                                            : ring_side::next)
                                        .name);
  }

  // Expected frame sizes are a whole segment whatever this rank expects (at least a small
  // all-reduce block), so that a disagreeing peer's frame is still read and the error says how the
  // two disagree.
  std::size_t segment_limit_words() const {
    return words_for(std::max(options.segment_bytes, tcp_ring::small_all_reduce_bytes));
  }

  // The small all-reduce (see the walkthrough in the header): whole buffers both ways around the
  // ring, then every rank adds all of them in rank order.
  void small_all_reduce(int self, int size, char* data, std::int64_t count, scalar_type type, reduce_kind op,
                        std::uint64_t seq, std::uint64_t key, const deadline& until) {
    const std::uint64_t at_step = step;
    const std::size_t nbytes = static_cast<std::size_t>(count) * scalar_size(type);
    const std::size_t stride_words = (nbytes + sizeof(capnp::word) - 1) / sizeof(capnp::word);
    const std::size_t words = static_cast<std::size_t>(size) * stride_words;
    if (blocks.size() < words) blocks.resize(words);
    // This rank's block is `data` itself; the others land in `blocks`, at their rank's place.
    auto block_of = [&](int owner) {
      if (owner == self) return data;
      return reinterpret_cast<char*>(blocks.data() + static_cast<std::size_t>(owner) * stride_words);
    };
    auto frame_of = [&](int owner) {
      return chunk_frame{frame_header{wire::Collective::ALL_REDUCE_BLOCK, at_step, seq, 0, static_cast<std::uint32_t>(owner), nbytes, key},
                         frames::to_wire(type), 0, static_cast<std::uint64_t>(count), nbytes};
    };
    const std::size_t limit_words = segment_limit_words();
    for (int k = 1; k <= small_steps_from_prev(size); ++k) {
      const bool back = k <= small_steps_from_next(size);
      const int forward_owner = small_forward_owner(self, k, size);
      pump.to_next.start_chunk(frame_of(forward_owner), block_of(forward_owner));
      pump.from_prev.start(limit_words);
      if (back) {
        const int backward_owner = small_backward_owner(self, k, size);
        pump.to_prev.start_chunk(frame_of(backward_owner), block_of(backward_owner));
        pump.from_next.start(limit_words);
      }
      exchange(until, back);
      const int from_prev = small_from_prev_owner(self, k, size);
      std::memcpy(block_of(from_prev), pump.from_prev.take_chunk(*link, "all_reduce", self, frame_of(from_prev)), nbytes);
      if (back) {
        const int from_next = small_from_next_owner(self, k, size);
        std::memcpy(block_of(from_next), pump.from_next.take_chunk(*link, "all_reduce", self, frame_of(from_next)),
                    nbytes);
      }
    }
    // Rank order 0..size-1 on every rank: the same additions, so the same bits everywhere.
    std::vector<const void*> ins(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) ins[static_cast<std::size_t>(r)] = block_of(r);
    void* outs[1] = {data};
    kernels::reduce_range(ins.data(), size, outs, 1, 0, count, type, op);
  }
};

tcp_ring::tcp_ring(int rank, int size, listener& own, const std::vector<endpoint>& peers,
                   std::chrono::milliseconds timeout)
    : tcp_ring(rank, size, own, peers, with_timeout(timeout)) {}

tcp_ring::tcp_ring(int rank, int size, listener& own, const std::vector<endpoint>& peers,
                   const tcp_ring_options& options)
    : rank_(rank), size_(size) {
  if (size < 1 || rank < 0 || rank >= size || peers.size() != static_cast<std::size_t>(size)) {
    throw std::invalid_argument("tcp_ring: rank " + std::to_string(rank) + " of " + std::to_string(size) + " with " +
                                std::to_string(peers.size()) + " peer addresses");
  }
  const tcp_ring_options o = checked(options);
  impl_ = std::make_unique<impl>(connect_ring(rank, size, own, peers, o.timeout, protocol_version, o.auth, o.hash_tags), o);
}

tcp_ring::tcp_ring(int rank, int size, std::unique_ptr<ring_link> link, const tcp_ring_options& options)
    : rank_(rank), size_(size) {
  if (size < 1 || rank < 0 || rank >= size || (size > 1 && link == nullptr)) {
    throw std::invalid_argument("tcp_ring: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                                (link == nullptr ? " without a link" : ""));
  }
  impl_ = std::make_unique<impl>(std::move(link), checked(options));
}

tcp_ring::~tcp_ring() = default;

const tcp_ring_options& tcp_ring::options() const noexcept { return impl_->options; }

void tcp_ring::set_timeout(std::chrono::milliseconds timeout) { impl_->options.timeout = timeout; }

void tcp_ring::shutdown() {
  impl_->shut_down.store(true);
  if (impl_->link) impl_->link->shutdown();
}

void tcp_ring::begin_step(std::uint64_t step) {
  impl_->step = step;
  impl_->sequence = 0;
}

std::uint64_t tcp_ring::step() const noexcept { return impl_->step; }

std::uint64_t tcp_ring::next_collective() const noexcept { return impl_->sequence; }

void tcp_ring::name_next_collective(std::uint64_t key) { impl_->next_key = key; }

void tcp_ring::set_spin(std::chrono::microseconds spin, bool yield) {
  impl_->options.spin = spin;
  impl_->options.yield_while_spinning = yield;
}

tcp_ring::progress_view tcp_ring::progress() const noexcept {
  progress_view v;
  v.peer = impl_->pump.waiting_on.load(std::memory_order_relaxed);
  v.last = frames::clock::time_point(frames::clock::duration(impl_->pump.last_progress.load(std::memory_order_relaxed)));
  v.sent_next = impl_->pump.sent_next.load(std::memory_order_relaxed);
  v.received_prev = impl_->pump.received_prev.load(std::memory_order_relaxed);
  return v;
}

tcp_ring::peer_wait tcp_ring::last_all_reduce_wait() const noexcept {
  return {impl_->op_begin, std::max(impl_->op_begin, impl_->first_from_prev)};
}

void tcp_ring::all_reduce(void* data, std::int64_t count, scalar_type type, reduce_kind op) {
  auto& s = *impl_;
  const std::uint64_t key = std::exchange(s.next_key, 0);
  s.op_begin = frames::clock::now();
  s.first_from_prev = {};
  if (size_ == 1 || count == 0) {  // a sum or mean over one rank is the value
    s.first_from_prev = s.op_begin;
    return;
  }
  auto& pump = s.pump;
  const std::size_t esize = scalar_size(type);
  const wire::ScalarType wire_type = frames::to_wire(type);
  auto* bytes = static_cast<char*>(data);
  const std::uint64_t seq = s.sequence++;
  const deadline until(s.options.timeout);
  // Chunks travel in segments, so that a receiver reduces one segment while the next arrives.
  const std::int64_t segment = std::max<std::int64_t>(16, static_cast<std::int64_t>(s.options.segment_bytes / esize));

  // The frame of elements [b, e) of chunk c.
  auto frame_of = [&](int c, std::int64_t b, std::int64_t e) {
    return chunk_frame{frame_header{wire::Collective::ALL_REDUCE, s.step, seq, static_cast<std::uint32_t>(c), 0, 0, key}, wire_type,
                       static_cast<std::uint64_t>(b), static_cast<std::uint64_t>(e - b),
                       static_cast<std::size_t>(e - b) * esize};
  };
  auto at = [&](std::int64_t element) { return bytes + static_cast<std::size_t>(element) * esize; };
  // One ring step: chunk send_c goes to the successor while chunk recv_c comes from the
  // predecessor, segment by segment; `use` gets each received segment's bytes, read in place.
  //
  // The sent chunk is complete before the step begins, so segment k+1 starts out (as much of it as
  // the socket takes at once) before segment k's bytes are handled: the successor receives while
  // this rank adds, and a rank's next send never waits for its own addition.
  auto step = [&](int send_c, int recv_c, auto&& use) {
    auto [sb, se] = chunk_bounds(count, size_, send_c);
    auto [rb, re] = chunk_bounds(count, size_, recv_c);
    auto start_send = [&](std::int64_t k) {
      const std::int64_t sk = sb + k * segment;
      if (sk < se) {
        pump.to_next.start_chunk(frame_of(send_c, sk, std::min(se, sk + segment)), at(sk));
      } else {
        pump.to_next.skip();
      }
    };
    bool sent_ahead = false;
    for (std::int64_t k = 0; sb + k * segment < se || rb + k * segment < re; ++k) {
      const std::int64_t rk = rb + k * segment;
      const bool receiving = rk < re;
      if (!sent_ahead) start_send(k);
      sent_ahead = false;
      if (receiving) {
        pump.from_prev.start(words_for(static_cast<std::size_t>(std::min(re - rk, segment)) * esize));
      } else {
        pump.from_prev.skip();
      }
      s.exchange(until);
      if (!receiving) continue;
      const chunk_frame want = frame_of(recv_c, rk, std::min(re, rk + segment));
      const kj::byte* in = pump.from_prev.take_chunk(*s.link, "all_reduce", rank_, want);
      if (s.options.send_ahead && sb + (k + 1) * segment < se) {
        start_send(k + 1);
        s.push_next();
        sent_ahead = true;
      }
      use(in, rk, rk + static_cast<std::int64_t>(want.count));
    }
  };

  if (size_ == 2 && static_cast<std::size_t>(count) * esize <= exchange_bytes) {
    // Two ranks and a small buffer: one exchange of the whole buffer instead of two half steps,
    // half the latency. Each adds the other's values to its own; a + b == b + a exactly, so both
    // still get the same bits.
    pump.to_next.start_chunk(frame_of(0, 0, count), bytes);
    pump.from_prev.start(words_for(static_cast<std::size_t>(count) * esize));
    s.exchange(until);
    const void* ins[2] = {bytes, pump.from_prev.take_chunk(*s.link, "all_reduce", rank_, frame_of(0, 0, count))};
    void* outs[1] = {bytes};
    kernels::reduce_range(ins, 2, outs, 1, 0, count, type, reduce_kind::sum);
    if (op == reduce_kind::mean) kernels::scale_range(bytes, count, type, size_);
    return;
  }
  if (size_ > 2 && static_cast<std::size_t>(count) * esize <= small_all_reduce_bytes) {
    s.small_all_reduce(rank_, size_, bytes, count, type, op, seq, key, until);
    return;
  }
  // Reduce-scatter: after size-1 steps rank r holds the full sum of chunk r+1.
  for (int k = 0; k < size_ - 1; ++k) {
    step(ring_send_index(rank_, k, size_), ring_recv_index(rank_, k, size_),
         [&](const kj::byte* in, std::int64_t b, std::int64_t e) {
           // Local partial first, the predecessor's after it: the ring fixes the order of additions.
           const void* ins[2] = {at(b), in};
           void* outs[1] = {at(b)};
           kernels::reduce_range(ins, 2, outs, 1, 0, e - b, type, reduce_kind::sum);
         });
  }
  const int owned = owned_chunk(rank_, size_);
  if (op == reduce_kind::mean) {
    auto [b, e] = chunk_bounds(count, size_, owned);
    // Divide the finished chunk once, where it is complete, so every rank gets the same bits.
    kernels::scale_range(at(b), e - b, type, size_);
  }
  // All-gather: pass the finished chunks around.
  for (int k = 0; k < size_ - 1; ++k) {
    step(ring_send_index(owned, k, size_), ring_recv_index(owned, k, size_),
         [&](const kj::byte* in, std::int64_t b, std::int64_t e) {
           std::memcpy(at(b), in, static_cast<std::size_t>(e - b) * esize);
         });
  }
}

void tcp_ring::broadcast(void* data, std::size_t bytes, int root) {
  const std::uint64_t key = std::exchange(impl_->next_key, 0);
  if (root < 0 || root >= size_) {
    throw std::invalid_argument("broadcast: root " + std::to_string(root) + " out of range for a ring of " +
                                std::to_string(size_) + " ranks (expected 0.." + std::to_string(size_ - 1) + ")");
  }
  if (bytes == 0 || size_ == 1) return;  // every rank passes the same size: all return here
  if (data == nullptr) throw std::invalid_argument("broadcast: null buffer for " + std::to_string(bytes) + " bytes");
  auto& s = *impl_;
  auto& pump = s.pump;
  auto* buf = static_cast<char*>(data);
  const deadline until(s.options.timeout);
  const std::size_t segment = s.options.segment_bytes;
  const frame_header segment_header{wire::Collective::BROADCAST, s.step, s.sequence++, 0, static_cast<std::uint32_t>(root),
                                    bytes, key};
  frame_header close_header = segment_header;
  close_header.kind = wire::Collective::BROADCAST_CLOSE;
  auto frame_of = [&](std::size_t k) {
    const std::size_t n = segment_size(k, bytes, segment);
    return chunk_frame{segment_header, wire::ScalarType::UINT8, segment_begin(k, segment), n, n};
  };
  const chunk_frame close_frame{close_header, wire::ScalarType::UINT8, 0, 0, 0};
  const std::size_t segments = segments_of(bytes, segment);
  // The rank's place in the chain: 0 is the root, size-1 the rank before it, which does not
  // forward.
  const int position = chain_position(rank_, root, size_);
  const bool last = position == size_ - 1;
  // Round k: the root sends segment k; a middle rank receives segment k while it forwards k-1 (one
  // round more to forward the last); the last rank receives segment k. In round 0 the last rank
  // also sends the root the closing frame, which the root checks.
  const std::size_t rounds = position != 0 && !last ? segments + 1 : segments;
  for (std::size_t k = 0; k < rounds; ++k) {
    if (position == 0) {
      pump.to_next.start_chunk(frame_of(k), buf + segment_begin(k, segment));
    } else if (!last && k >= 1) {
      pump.to_next.start_chunk(frame_of(k - 1), buf + segment_begin(k - 1, segment));
    } else if (last && k == 0) {
      pump.to_next.start_chunk(close_frame, nullptr);
    } else {
      pump.to_next.skip();
    }
    const bool receiving = position == 0 ? k == 0 : k < segments;
    if (receiving) {
      pump.from_prev.start(s.segment_limit_words());
    } else {
      pump.from_prev.skip();
    }
    s.exchange(until);
    if (!receiving) continue;
    if (position == 0) {
      pump.from_prev.take_chunk(*s.link, "broadcast", rank_, close_frame);
    } else {
      const chunk_frame want = frame_of(k);
      const kj::byte* in = pump.from_prev.take_chunk(*s.link, "broadcast", rank_, want);
      std::memcpy(buf + want.offset, in, want.bytes);
    }
  }
}

void tcp_ring::all_gather(const void* mine, std::size_t my_bytes, void* out,
                          const std::vector<std::size_t>& bytes_per_rank) {
  const std::uint64_t key = std::exchange(impl_->next_key, 0);
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
  auto& pump = s.pump;
  const deadline until(s.options.timeout);
  const std::uint64_t seq = s.sequence++;
  const std::size_t segment = s.options.segment_bytes;
  // Segment j of `block`: an empty block still travels as one empty frame, so that the receiver
  // checks its size.
  auto frame_of = [&](std::size_t block, std::size_t j) {
    const std::size_t n = segment_size(j, bytes_per_rank[block], segment);
    return chunk_frame{frame_header{wire::Collective::ALL_GATHER, s.step, seq, static_cast<std::uint32_t>(block), 0,
                                    bytes_per_rank[block], key},
                       wire::ScalarType::UINT8, segment_begin(j, segment), n, n};
  };
  // Step k: send block rank-k (own first, then the one received last step) while receiving
  // block rank-k-1, segment by segment.
  for (int k = 0; k < size_ - 1; ++k) {
    const auto send_block = static_cast<std::size_t>(ring_send_index(rank_, k, size_));
    const auto recv_block = static_cast<std::size_t>(ring_recv_index(rank_, k, size_));
    const std::size_t send_segments = segments_of(bytes_per_rank[send_block], segment);
    const std::size_t recv_segments = segments_of(bytes_per_rank[recv_block], segment);
    for (std::size_t j = 0; j < std::max(send_segments, recv_segments); ++j) {
      if (j < send_segments) {
        pump.to_next.start_chunk(frame_of(send_block, j), dst + offsets[send_block] + segment_begin(j, segment));
      } else {
        pump.to_next.skip();
      }
      const bool receiving = j < recv_segments;
      if (receiving) {
        pump.from_prev.start(s.segment_limit_words());
      } else {
        pump.from_prev.skip();
      }
      s.exchange(until);
      if (!receiving) continue;
      const chunk_frame want = frame_of(recv_block, j);
      const kj::byte* in = pump.from_prev.take_chunk(*s.link, "all_gather", rank_, want);
      if (want.bytes > 0) std::memcpy(dst + offsets[recv_block] + want.offset, in, want.bytes);
    }
  }
}

}  // namespace troupe::transport
