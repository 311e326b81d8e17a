#include "ring_frames.hpp"

#include <kj/exception.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include "troupe/transport/spin.hpp"

namespace troupe::transport::frames {

namespace {
// The most a reader takes from the link at once while its frame is hashed on the tag_thread.
// Small enough that little is left to hash once the last piece is in, large enough that the
// reads stay few.
constexpr std::size_t deferred_piece_bytes = 128 * 1024;
// How long the tag_thread watches for the next job before it sleeps: the pieces of a frame come
// tens of microseconds apart, and waking a sleeping thread costs about as much.
constexpr std::chrono::microseconds tag_thread_linger{50};
}  // namespace

wire::ScalarType to_wire(base::scalar_type t) {
  switch (t) {
    case base::scalar_type::f32: return wire::ScalarType::FLOAT32;
    case base::scalar_type::f64: return wire::ScalarType::FLOAT64;
    case base::scalar_type::i32: return wire::ScalarType::INT32;
    case base::scalar_type::i64: return wire::ScalarType::INT64;
    case base::scalar_type::f16: return wire::ScalarType::FLOAT16;
    case base::scalar_type::bf16: return wire::ScalarType::BFLOAT16;
  }
  return wire::ScalarType::FLOAT32;
}

namespace {

std::string type_name(wire::ScalarType t) {
  switch (t) {
    case wire::ScalarType::FLOAT32: return "float32";
    case wire::ScalarType::FLOAT64: return "float64";
    case wire::ScalarType::INT32: return "int32";
    case wire::ScalarType::INT64: return "int64";
    case wire::ScalarType::UINT8: return "bytes";
    case wire::ScalarType::FLOAT16: return "float16";
    case wire::ScalarType::BFLOAT16: return "bfloat16";
  }
  return "code " + std::to_string(static_cast<unsigned>(t));
}

}  // namespace

std::string describe(const frame_header& h) {
  const std::string operation = " (step " + std::to_string(h.step) + ", collective " + std::to_string(h.sequence) + ")";
  const std::string bytes = std::to_string(h.total) + " bytes";
  switch (h.kind) {
    case wire::Collective::ALL_REDUCE: return "an all-reduce of chunk " + std::to_string(h.index) + operation;
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

std::size_t frame_length(const unsigned char* bytes, std::size_t n) {
  if (n < 8) return 0;
  std::uint32_t head = 0;
  std::memcpy(&head, bytes, 4);
  if (head >= max_segments) return 0;
  const std::size_t count = std::size_t{head} + 1;
  const std::size_t table_bytes = (count + 2) / 2 * 8;
  if (n < table_bytes) return 0;
  std::size_t total = table_bytes;
  for (std::size_t i = 0; i < count; ++i) {
    std::uint32_t words = 0;
    std::memcpy(&words, bytes + 4 * (i + 1), 4);
    total += std::size_t{words} * 8;
  }
  return n >= total ? total : 0;
}

// ---- tags ----

tag_thread::~tag_thread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

bool tag_thread::spare_cores(int ranks) {
  return std::thread::hardware_concurrency() >= 2 * static_cast<unsigned>(std::max(ranks, 1));
}

bool tag_thread::post(const job& j) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (failed_) return false;
  if (!thread_.joinable()) {
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::system_error&) {
      failed_ = true;  // no thread to be had (a thread limit): the callers hash their frames themselves
      return false;
    }
  }
  jobs_.push_back(j);
  queued_.fetch_add(1, std::memory_order_release);
  const bool sleeping = idle_;
  lock.unlock();
  if (sleeping) wake_.notify_one();
  return true;
}

void tag_thread::run() {
  std::uint64_t taken = 0;
  for (;;) {
    job j{};
    spin_until([&] { return queued_.load(std::memory_order_acquire) != taken; }, tag_thread_linger);
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (jobs_.empty() && !stop_) {
        idle_ = true;
        wake_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        idle_ = false;
      }
      if (jobs_.empty()) return;  // stopped, every job done
      j = jobs_.front();
      jobs_.pop_front();
      ++taken;
    }
    try {
      switch (j.what) {
        case job::kind::begin: j.mac->do_begin(j.number); break;
        case job::kind::add: j.mac->do_add(j.data, j.bytes); break;
        case job::kind::end: j.mac->do_end(); break;
      }
    } catch (const std::exception&) {
      j.mac->failed_.store(true, std::memory_order_relaxed);
    }
    // Sequentially consistent with wait_for's: either it sees this job done, or this sees it wait.
    j.mac->finished_.fetch_add(1);
    if (waiters_.load() > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      done_.notify_all();
    }
  }
}

void tag_thread::wait_for(const frame_mac& mac) {
  if (spin_until([&] { return !mac.pending(); }, std::chrono::microseconds(50))) return;
  std::unique_lock<std::mutex> lock(mutex_);
  ++waiters_;
  done_.wait(lock, [&] { return !mac.pending(); });
  --waiters_;
}

frame_mac::frame_mac(const std::vector<std::uint8_t>& key, std::uint32_t direction, std::shared_ptr<tag_thread> helper)
    : ctx_(EVP_CIPHER_CTX_new()), direction_(direction), helper_(std::move(helper)) {
  auto* ctx = static_cast<EVP_CIPHER_CTX*>(ctx_);
  if (ctx == nullptr || key.size() != 32 ||
      EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr, key.data(), nullptr) != 1) {
    EVP_CIPHER_CTX_free(ctx);
    throw std::runtime_error("tcp_ring: cannot set up the frame tags (OpenSSL AES-256-GCM)");
  }
}

frame_mac::~frame_mac() {
  drain();
  EVP_CIPHER_CTX_free(static_cast<EVP_CIPHER_CTX*>(ctx_));
}

void frame_mac::post(tag_thread::job::kind what, const void* data, std::size_t n, std::uint64_t number) {
  // Only when nothing is pending may the caller do a job itself; then the helper holds none of
  // this frame_mac's, and a job it cannot take is the caller's.
  if (helper_ != nullptr) {
    ++posted_;
    if (helper_->post({this, what, data, n, number})) return;
    --posted_;
  }
  switch (what) {
    case tag_thread::job::kind::begin: do_begin(number); break;
    case tag_thread::job::kind::add: do_add(data, n); break;
    case tag_thread::job::kind::end: do_end(); break;
  }
}

void frame_mac::begin() {
  const std::uint64_t number = number_++;
  if (pending()) {
    post(tag_thread::job::kind::begin, nullptr, 0, number);
  } else {
    do_begin(number);
  }
}

void frame_mac::add(const void* data, std::size_t n, bool defer) {
  if (n == 0) return;
  if (pending() || (defer && helper_ != nullptr)) {
    post(tag_thread::job::kind::add, data, n, 0);
  } else {
    do_add(data, n);
  }
}

void frame_mac::finish() {
  if (pending()) {
    post(tag_thread::job::kind::end, nullptr, 0, 0);
  } else {
    do_end();
  }
}

void frame_mac::drain() {
  if (helper_ != nullptr && pending()) helper_->wait_for(*this);
}

void frame_mac::result(unsigned char* out) {
  drain();
  if (failed_.load(std::memory_order_relaxed)) throw std::runtime_error("tcp_ring: OpenSSL failed to tag a frame");
  std::memcpy(out, result_, tag_bytes);
}

void frame_mac::end(unsigned char* out) {
  finish();
  result(out);
}

void frame_mac::do_begin(std::uint64_t number) {
  // The nonce: the direction, then the frame's number on this stream (never reused under a key).
  unsigned char nonce[12];
  std::memcpy(nonce, &direction_, 4);
  std::memcpy(nonce + 4, &number, 8);
  if (EVP_EncryptInit_ex(static_cast<EVP_CIPHER_CTX*>(ctx_), nullptr, nullptr, nullptr, nonce) != 1) {
    throw std::runtime_error("tcp_ring: OpenSSL failed to tag a frame");
  }
}

void frame_mac::do_add(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const int k = static_cast<int>(std::min<std::size_t>(n, std::size_t{1} << 30));
    int len = 0;
    // Authenticated, not encrypted: the bytes go in the clear.
    if (EVP_EncryptUpdate(static_cast<EVP_CIPHER_CTX*>(ctx_), nullptr, &len, p, k) != 1) {
      throw std::runtime_error("tcp_ring: OpenSSL failed to tag a frame");
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

void frame_mac::do_end() {
  auto* ctx = static_cast<EVP_CIPHER_CTX*>(ctx_);
  int len = 0;
  unsigned char none[16];
  if (EVP_EncryptFinal_ex(ctx, none, &len) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, static_cast<int>(tag_bytes), result_) != 1) {
    throw std::runtime_error("tcp_ring: OpenSSL failed to tag a frame");
  }
}

bool frame_mac::matches(const unsigned char* tag) {
  unsigned char want[tag_bytes];
  end(want);
  return CRYPTO_memcmp(want, tag, tag_bytes) == 0;
}

void frame_mac::tag(const iovec* iov, std::size_t count, unsigned char* out) {
  begin();
  for (std::size_t i = 0; i < count; ++i) add(iov[i].iov_base, iov[i].iov_len);
  end(out);
}

bool frame_mac::check(const iovec* iov, std::size_t count, const unsigned char* tag) {
  begin();
  for (std::size_t i = 0; i < count; ++i) add(iov[i].iov_base, iov[i].iov_len);
  return matches(tag);
}

// ---- writer ----

capnp::MallocMessageBuilder& frame_writer::fresh_builder() {
  // The previous frame is done (its builder zeroes the scratch again as it goes): no allocation
  // for a frame's structure.
  builder_.reset();
  builder_.emplace(kj::arrayPtr(scratch_.data(), scratch_.size()));
  return *builder_;
}

void frame_writer::start_chunk(const chunk_frame& f, const void* data) {
  auto& msg = fresh_builder();
  auto chunk = msg.initRoot<wire::Chunk>();
  chunk.setKind(f.header.kind);
  chunk.setStep(f.header.step);
  chunk.setSequence(f.header.sequence);
  chunk.setIndex(f.header.index);
  chunk.setRoot(f.header.root);
  chunk.setTotal(f.header.total);
  chunk.setKey(f.header.key);
  chunk.setType(f.type);
  chunk.setOffset(f.offset);
  chunk.setCount(f.count);
  const auto* p = static_cast<const kj::byte*>(data);
  const std::size_t n = f.bytes;
  if (n > 0) {
    if (n % 8 == 0 && reinterpret_cast<std::uintptr_t>(p) % 8 == 0) {
      chunk.adoptData(msg.getOrphanage().referenceExternalData(capnp::Data::Reader(p, n)));
    } else {
      // An odd-sized or unaligned piece: copied, since external segments are whole words.
      std::memcpy(chunk.initData(static_cast<unsigned>(n)).begin(), p, n);
    }
  }
  frame_segments();
}

void frame_writer::start_hello(std::uint32_t version, std::uint32_t rank, std::uint32_t size,
                               const std::vector<std::uint8_t>& nonce, const std::vector<std::uint8_t>& proof,
                               std::uint32_t magic) {
  auto h = fresh_builder().initRoot<wire::Hello>();
  h.setMagic(magic);
  h.setVersion(version);
  h.setRank(rank);
  h.setSize(size);
  if (!nonce.empty()) h.setNonce(capnp::Data::Reader(nonce.data(), nonce.size()));
  if (!proof.empty()) h.setProof(capnp::Data::Reader(proof.data(), proof.size()));
  frame_segments();
}

void frame_writer::frame_segments() {
  auto segments = builder_->getSegmentsForOutput();
  table_.assign(((segments.size() + 2) & ~std::size_t{1}), 0);
  table_[0] = static_cast<std::uint32_t>(segments.size() - 1);
  for (std::size_t i = 0; i < segments.size(); ++i) table_[i + 1] = static_cast<std::uint32_t>(segments[i].size());
  iov_.clear();
  iov_.push_back({table_.data(), table_.size() * sizeof(std::uint32_t)});
  for (auto s : segments) iov_.push_back({const_cast<capnp::word*>(s.begin()), s.size() * sizeof(capnp::word)});
  next_ = 0;
  body_iovs_ = iov_.size();
  tagged_ = false;
  if (mac_ != nullptr) {
    // The tag follows the frame. A large frame is hashed on the link's tag_thread, all of it at
    // once, while its bytes go out; any other as it goes out (progress()), so that its first
    // bytes leave at once.
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < body_iovs_; ++i) bytes += iov_[i].iov_len;
    hashed_ahead_ = mac_->helped() && bytes >= tag_thread::min_frame_bytes;
    mac_->begin();
    if (hashed_ahead_) {
      for (std::size_t i = 0; i < body_iovs_; ++i) mac_->add(iov_[i].iov_base, iov_[i].iov_len, true);
      mac_->finish();
    }
    iov_.push_back({tag_, sizeof tag_});
  }
}

void frame_writer::progress(ring_link& link) {
  while (!done()) {
    // With a tag, the frame's body goes first, hashed as it is written unless it was hashed
    // ahead; the tag once it is all out (and computed).
    const bool body = mac_ != nullptr && next_ < body_iovs_;
    const bool hash = body && !hashed_ahead_;
    if (mac_ != nullptr && next_ == body_iovs_ && !tagged_) {
      if (hashed_ahead_) {
        mac_->result(tag_);
      } else {
        mac_->end(tag_);
      }
      tagged_ = true;
    }
    const std::size_t n = std::min<std::size_t>((body ? body_iovs_ : iov_.size()) - next_, IOV_MAX);
    std::size_t left = link.write_some(side_, &iov_[next_], n);
    if (left == 0) return;
    moved_ += left;
    while (left > 0 && !done()) {
      if (left >= iov_[next_].iov_len) {
        if (hash) mac_->add(iov_[next_].iov_base, iov_[next_].iov_len);
        left -= iov_[next_].iov_len;
        ++next_;
      } else {
        if (hash) mac_->add(iov_[next_].iov_base, left);
        iov_[next_].iov_base = static_cast<char*>(iov_[next_].iov_base) + left;
        iov_[next_].iov_len -= left;
        left = 0;
      }
    }
    while (!done() && iov_[next_].iov_len == 0 && next_ != body_iovs_) ++next_;
  }
}

std::vector<unsigned char> frame_writer::bytes() const {
  std::vector<unsigned char> out;
  for (std::size_t i = next_; i < iov_.size(); ++i) {
    const auto* p = static_cast<const unsigned char*>(iov_[i].iov_base);
    out.insert(out.end(), p, p + iov_[i].iov_len);
  }
  return out;
}

// ---- reader ----

void frame_reader::start(std::size_t max_words) {
  max_words_ = max_words;
  stage_ = stage::head;
  have_ = 0;
  need_ = 8;
  table_.assign(2, 0);
  if (mac_ != nullptr) mac_->begin();  // the frame's bytes join its tag as they arrive
}

template <typename Read>
void frame_reader::pull(Read&& read, const ring_peer& from) {
  while (!done()) {
    char* target = stage_ == stage::body  ? reinterpret_cast<char*>(words_.data())
                   : stage_ == stage::tag ? reinterpret_cast<char*>(tag_)
                                          : reinterpret_cast<char*>(table_.data()) + (stage_ == stage::head ? 0 : 8);
    // A large body is hashed on the link's tag_thread piece by piece as it arrives, each piece
    // while the next is read.
    const bool defer = mac_ != nullptr && mac_->helped() && stage_ == stage::body && need_ >= tag_thread::min_frame_bytes;
    const std::size_t r = read(target + have_, defer ? std::min(need_ - have_, deferred_piece_bytes) : need_ - have_);
    if (r == 0) return;
    moved_ += r;
    if (mac_ != nullptr && stage_ != stage::tag) mac_->add(target + have_, r, defer);
    have_ += r;
    if (have_ < need_) continue;
    advance(from);
  }
}

void frame_reader::progress(ring_link& link) {
  pull([&](void* into, std::size_t n) { return link.read_some(side_, into, n); }, link.peer(side_));
}

bool frame_reader::parse(const unsigned char* bytes, std::size_t n, std::size_t max_words) {
  start(max_words);
  std::size_t at = 0;
  try {
    pull(
        [&](void* into, std::size_t want) {
          const std::size_t take = std::min(want, n - at);
          std::memcpy(into, bytes + at, take);
          at += take;
          return take;
        },
        ring_peer{-1, "a frame in memory"});
  } catch (const peer_error&) {
    return false;
  }
  return done() && at == n;
}

void frame_reader::advance(const ring_peer& from) {
  if (stage_ == stage::tag) {
    if (!mac_->matches(tag_)) {
      const std::string what = "a frame from " + from.name +
                               " failed its integrity check (its tag does not match: the bytes were altered, "
                               "replayed or reordered on the way; the link from rank " + std::to_string(from.rank) +
                               " is not to be trusted)";
      throw peer_error(from.rank, what, what, peer_error::fault::altered);
    }
    finish(from);
    return;
  }
  if (stage_ == stage::head) {
    // Checked before anything is sized from it: the count comes from the peer.
    if (table_[0] >= max_segments) {
      throw peer_error(from.rank,
                       "malformed frame from " + from.name + ": " + std::to_string(table_[0]) + "+1 segments");
    }
    const std::size_t table_words = (table_[0] + 1 + 2) / 2;  // (1 + count) uint32 rounded up to words
    table_.resize(table_words * 2, 0);
    if (table_words > 1) {
      stage_ = stage::table;
      have_ = 0;
      need_ = (table_words - 1) * 8;
      return;
    }
  }
  // The whole table is here: size the body, within the limit.
  const std::uint32_t count = table_[0] + 1;
  std::size_t total = 0;
  for (std::uint32_t i = 0; i < count; ++i) total += table_[i + 1];
  if (total > max_words_) {
    throw peer_error(from.rank, "oversized frame from " + from.name + ": " + std::to_string(total * 8) +
                                    " bytes, at most " + std::to_string(max_words_ * 8) + " expected");
  }
  if (stage_ != stage::body) {
    if (words_.size() < std::max<std::size_t>(total, 1)) words_.resize(std::max<std::size_t>(total, 1));
    stage_ = stage::body;
    have_ = 0;
    need_ = total * 8;
    total_words_ = total;
    if (need_ > 0) return;
  }
  if (mac_ != nullptr) {
    stage_ = stage::tag;
    have_ = 0;
    need_ = sizeof tag_;
    return;
  }
  finish(from);
}

void frame_reader::finish(const ring_peer&) {
  const std::uint32_t count = table_[0] + 1;
  const std::size_t total = total_words_;
  segments_.clear();
  std::size_t offset = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    segments_.push_back(kj::arrayPtr(reinterpret_cast<const capnp::word*>(words_.data()) + offset, table_[i + 1]));
    offset += table_[i + 1];
  }
  capnp::ReaderOptions options;
  options.traversalLimitInWords = 2 * total + 64;
  options.nestingLimit = 16;
  reader_.emplace(kj::arrayPtr(segments_.data(), segments_.size()), options);
  stage_ = stage::complete;
}

const kj::byte* frame_reader::take_chunk(const ring_link& link, const char* op, int self, const chunk_frame& want) {
  const ring_peer& from = link.peer(side_);
  try {
    auto chunk = reader_->getRoot<wire::Chunk>();
    const frame_header got{chunk.getKind(),  chunk.getStep(),  chunk.getSequence(), chunk.getIndex(),
                           chunk.getRoot(),  chunk.getTotal(), chunk.getKey()};
    const frame_header& h = want.header;
    if (got.key != h.key && got.step == h.step && got.sequence == h.sequence) {
      auto say = [&](const std::string& me) {
        return std::string(op) + ": " + from.name + " runs the collective named " + std::to_string(got.key) +
               " as " + describe(got) + ", " + me + " the one named " + std::to_string(h.key) +
               " (the workers run their collectives in different orders)";
      };
      throw peer_error(from.rank, say("rank " + std::to_string(self) + " (this worker)"),
                       say("rank " + std::to_string(self)));
    }
    if (got.step != h.step || got.sequence != h.sequence) {
      // A worker that skipped, added or reordered a collective: never sum values of different
      // steps or collectives.
      auto say = [&](const std::string& me) {
        return std::string(op) + ": " + from.name + " is at step " + std::to_string(got.step) + ", collective " +
               std::to_string(got.sequence) + " (it sent " + describe(got) + "), " + me + " at step " +
               std::to_string(h.step) + ", collective " + std::to_string(h.sequence) + " (it expected " +
               describe(h) + ") (the workers disagree on the collective: one skipped, added or reordered a collective)";
      };
      throw peer_error(from.rank, say("rank " + std::to_string(self) + " (this worker)"),
                       say("rank " + std::to_string(self)));
    }
    if (got.kind != h.kind || got.index != h.index || got.root != h.root || got.total != h.total) {
      auto say = [&](const std::string& me) {
        return std::string(op) + ": " + from.name + " sent " + describe(got) + ", " + me + " expected " +
               describe(h) + " (the workers disagree on the collective)";
      };
      throw peer_error(from.rank, say("rank " + std::to_string(self) + " (this worker)"),
                       say("rank " + std::to_string(self)));
    }
    auto d = chunk.getData();  // read once: every getData() counts against the traversal limit
    if (chunk.getType() != want.type || chunk.getOffset() != want.offset || chunk.getCount() != want.count ||
        d.size() != want.bytes) {
      throw peer_error(from.rank, std::string(op) + ": malformed frame from " + from.name + ": " +
                                      std::to_string(d.size()) + " bytes, " + std::to_string(chunk.getCount()) +
                                      " elements of type " + std::to_string(static_cast<unsigned>(chunk.getType())) +
                                      " at offset " + std::to_string(chunk.getOffset()) + " in " + describe(got) +
                                      ", expected " + std::to_string(want.bytes) + " bytes, " +
                                      std::to_string(want.count) + " elements of type " +
                                      std::to_string(static_cast<unsigned>(want.type)) + " at offset " +
                                      std::to_string(want.offset) +
                                      (chunk.getType() != want.type
                                           ? " (it sent " + type_name(chunk.getType()) + ", this worker expected " +
                                                 type_name(want.type) +
                                                 ": every worker must all-reduce the same dtype with the same "
                                                 "CommunicationOptions::compression)"
                                           : std::string()));
    }
    return want.bytes == 0 ? nullptr : d.begin();
  } catch (const kj::Exception& x) {
    throw peer_error(from.rank,
                     std::string(op) + ": malformed frame from " + from.name + ": " + x.getDescription().cStr());
  }
}

hello_fields frame_reader::take_hello() {
  try {
    auto got = reader_->getRoot<wire::Hello>();
    hello_fields h;
    h.magic = got.getMagic();
    h.version = got.getVersion();
    h.rank = got.getRank();
    h.size = got.getSize();
    auto nonce = got.getNonce();
    auto proof = got.getProof();
    h.nonce.assign(nonce.begin(), nonce.end());
    h.proof.assign(proof.begin(), proof.end());
    return h;
  } catch (const kj::Exception& e) {
    throw std::runtime_error(std::string("malformed hello: ") + e.getDescription().cStr());
  }
}

// ---- pump ----

void frame_pump::exchange(const deadline& until, std::chrono::milliseconds timeout, const spin_policy& spin,
                          bool both, clock::time_point* first_from_prev) {
  try {
    exchange_frames(until, timeout, spin, both, first_from_prev);
  } catch (...) {
    // The frames given up may still be hashed on the tag_thread: done before their bytes (the
    // caller's buffers among them) go away.
    for (ring_side side : {ring_side::next, ring_side::prev}) {
      if (frame_mac* m = link_->out_mac(side)) m->drain();
      if (frame_mac* m = link_->in_mac(side)) m->drain();
    }
    throw;
  }
}

void frame_pump::exchange_frames(const deadline& until, std::chrono::milliseconds timeout, const spin_policy& spin,
                                 bool both, clock::time_point* first_from_prev) {
  ring_link& link = *link_;
  const auto spin_until_time = clock::now() + spin.spin;
  auto finished = [&] {
    return to_next.done() && from_prev.done() && (!both || (to_prev.done() && from_next.done()));
  };
  if (first_from_prev != nullptr && *first_from_prev != clock::time_point{}) first_from_prev = nullptr;
  // The progress watch: which neighbour this waits on, and when a byte last moved.
  auto marks = [&] {
    return to_next.mark() ^ (from_prev.mark() * 3) ^ (both ? (to_prev.mark() * 5) ^ (from_next.mark() * 7) : 0);
  };
  std::uint64_t seen = marks();
  last_progress.store(clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  struct idle_again {
    std::atomic<int>& w;
    ~idle_again() { w.store(-1, std::memory_order_relaxed); }
  } idle{waiting_on};
  while (!finished()) {
    if (!to_next.done()) to_next.progress(link);
    if (!from_prev.done()) from_prev.progress(link);
    waiting_on.store(!from_prev.done() ? link.peer(ring_side::prev).rank
                     : (both && !from_next.done()) || !to_next.done() ? link.peer(ring_side::next).rank
                                                                      : link.peer(ring_side::prev).rank,
                     std::memory_order_relaxed);
    if (first_from_prev != nullptr && from_prev.begun()) {
      *first_from_prev = clock::now();
      first_from_prev = nullptr;
    }
    if (both) {
      if (!to_prev.done()) to_prev.progress(link);
      if (!from_next.done()) from_next.progress(link);
    }
    if (finished()) break;
    if (const std::uint64_t now_marks = marks(); now_marks != seen) {
      seen = now_marks;
      last_progress.store(clock::now().time_since_epoch().count(), std::memory_order_relaxed);
      sent_next.store(to_next.moved(), std::memory_order_relaxed);
      received_prev.store(from_prev.moved(), std::memory_order_relaxed);
    }
    if (clock::now() < spin_until_time) {
      if (spin.yield) {
        yield_cpu();  // more ranks than cores here: let the one we wait for run
      } else {
        cpu_relax();
      }
      continue;
    }
    ring_wants wants;
    wants.write_next = !to_next.done();
    wants.read_prev = !from_prev.done();
    wants.write_prev = both && !to_prev.done();
    wants.read_next = both && !from_next.done();
    if (link.wait(wants, until.poll_ms())) continue;
    const std::string after = "timed out after " + std::to_string(timeout.count()) + " ms waiting for ";
    const ring_peer& next = link.peer(ring_side::next);
    const ring_peer& prev = link.peer(ring_side::prev);
    if (!from_prev.done()) throw peer_error(prev.rank, after + prev.name + " to send");
    if (both && !from_next.done()) throw peer_error(next.rank, after + next.name + " to send");
    if (!to_next.done()) throw peer_error(next.rank, after + next.name + " to receive");
    throw peer_error(prev.rank, after + prev.name + " to receive");
  }
  sent_next.store(to_next.moved(), std::memory_order_relaxed);
  received_prev.store(from_prev.moved(), std::memory_order_relaxed);
}

}  // namespace troupe::transport::frames
