#include "troupe/format/checkpoint_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <capnp/message.h>
#include <capnp/orphan.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <unordered_set>

#include "checkpoint.capnp.h"
#include "troupe/base/quote.hpp"

namespace troupe::format {

// ---------------------------------------------------------------------------------------------
// XXH64, as specified in xxHash's doc/xxhash_spec.md.

namespace {

constexpr std::uint64_t prime1 = 0x9E3779B185EBCA87ULL;
constexpr std::uint64_t prime2 = 0xC2B2AE3D27D4EB4FULL;
constexpr std::uint64_t prime3 = 0x165667B19E3779F9ULL;
constexpr std::uint64_t prime4 = 0x85EBCA77C2B2AE63ULL;
constexpr std::uint64_t prime5 = 0x27D4EB2F165667C5ULL;

inline std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline std::uint64_t load_le64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline std::uint32_t load_le32(const unsigned char* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

inline void store_le64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

inline void store_le32(unsigned char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

inline std::uint64_t xxh_round(std::uint64_t acc, std::uint64_t lane) {
  acc += lane * prime2;
  return rotl(acc, 31) * prime1;
}

inline std::uint64_t xxh_merge(std::uint64_t h, std::uint64_t acc) {
  h ^= xxh_round(0, acc);
  return h * prime1 + prime4;
}

// Consumes whole 32-byte stripes; returns the bytes consumed.
std::size_t xxh_stripes(std::uint64_t* acc, const unsigned char* p, std::size_t n) {
  std::uint64_t a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
  const std::size_t whole = n - n % 32;
  for (std::size_t i = 0; i < whole; i += 32) {
    std::uint64_t l[4];
    std::memcpy(l, p + i, 32);  // little-endian hosts only; see the static_assert below
    a0 = xxh_round(a0, l[0]);
    a1 = xxh_round(a1, l[1]);
    a2 = xxh_round(a2, l[2]);
    a3 = xxh_round(a3, l[3]);
  }
  acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3;
  return whole;
}

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the checkpoint format and XXH64 lanes assume little-endian");

}  // namespace

xxhash64_stream::xxhash64_stream(std::uint64_t seed) noexcept
    : acc_{seed + prime1 + prime2, seed + prime2, seed, seed - prime1}, seed_(seed), buffer_{} {}

void xxhash64_stream::update(const void* data, std::size_t nbytes) noexcept {
  if (nbytes == 0) return;
  const auto* p = static_cast<const unsigned char*>(data);
  total_bytes_ += nbytes;
  if (buffered_ > 0) {
    const std::size_t take = std::min(nbytes, 32 - buffered_);
    std::memcpy(buffer_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    nbytes -= take;
    if (buffered_ < 32) return;
    xxh_stripes(acc_, buffer_, 32);
    buffered_ = 0;
  }
  const std::size_t done = xxh_stripes(acc_, p, nbytes);
  std::memcpy(buffer_, p + done, nbytes - done);
  buffered_ = nbytes - done;
}

std::uint64_t xxhash64_stream::digest() const noexcept {
  std::uint64_t h;
  if (total_bytes_ >= 32) {
    h = rotl(acc_[0], 1) + rotl(acc_[1], 7) + rotl(acc_[2], 12) + rotl(acc_[3], 18);
    for (std::uint64_t a : acc_) h = xxh_merge(h, a);
  } else {
    h = seed_ + prime5;
  }
  h += total_bytes_;
  const unsigned char* p = buffer_;
  std::size_t n = buffered_;
  for (; n >= 8; p += 8, n -= 8) {
    h ^= xxh_round(0, load_le64(p));
    h = rotl(h, 27) * prime1 + prime4;
  }
  if (n >= 4) {
    h ^= static_cast<std::uint64_t>(load_le32(p)) * prime1;
    h = rotl(h, 23) * prime2 + prime3;
    p += 4;
    n -= 4;
  }
  for (; n > 0; ++p, --n) {
    h ^= *p * prime5;
    h = rotl(h, 11) * prime1;
  }
  h ^= h >> 33;
  h *= prime2;
  h ^= h >> 29;
  h *= prime3;
  h ^= h >> 32;
  return h;
}

std::uint64_t xxhash64(const void* data, std::size_t nbytes, std::uint64_t seed) noexcept {
  xxhash64_stream s(seed);
  s.update(data, nbytes);
  return s.digest();
}

// ---------------------------------------------------------------------------------------------
// Shared helpers.

namespace {

namespace wire = troupe::wire::ckpt;

std::string errno_text(int err) { return std::strerror(err); }

std::string hex(std::uint64_t v) {
  static const char digits[] = "0123456789abcdef";
  std::string s = "0x0000000000000000";
  for (int i = 17; i >= 2; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 15];
  return s;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

wire::ElementType to_wire(scalar_type t) {
  switch (t) {
    case scalar_type::f32: return wire::ElementType::FLOAT32;
    case scalar_type::f64: return wire::ElementType::FLOAT64;
    case scalar_type::i32: return wire::ElementType::INT32;
    case scalar_type::i64: return wire::ElementType::INT64;
    case scalar_type::f16: return wire::ElementType::FLOAT16;
    case scalar_type::bf16: return wire::ElementType::BFLOAT16;
  }
  throw std::invalid_argument("write_checkpoint_file: unknown element type " +
                              std::to_string(static_cast<int>(t)));
}

bool from_wire(wire::ElementType t, scalar_type& out) {
  switch (t) {
    case wire::ElementType::FLOAT32: out = scalar_type::f32; return true;
    case wire::ElementType::FLOAT64: out = scalar_type::f64; return true;
    case wire::ElementType::INT32: out = scalar_type::i32; return true;
    case wire::ElementType::INT64: out = scalar_type::i64; return true;
    case wire::ElementType::FLOAT16: out = scalar_type::f16; return true;
    case wire::ElementType::BFLOAT16: out = scalar_type::bf16; return true;
  }
  return false;
}

// Element count x element size, or false when a dimension is negative or the product overflows.
// A zero dimension makes any shape empty ([0, 2^40, 2^40] is 0 bytes); the element count must
// also fit the int64 a Tensor counts in.
bool byte_size_of(const std::vector<std::int64_t>& shape, scalar_type t, std::uint64_t& out) {
  bool empty = false;
  for (std::int64_t d : shape) {
    if (d < 0) return false;
    empty = empty || d == 0;
  }
  if (empty) {
    out = 0;
    return true;
  }
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return false;
  }
  return !__builtin_mul_overflow(static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(scalar_size(t)), &out);
}

// Closes a file descriptor on every path out.
class file_descriptor {
 public:
  explicit file_descriptor(int fd) : fd_(fd) {}
  ~file_descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  file_descriptor(const file_descriptor&) = delete;
  file_descriptor& operator=(const file_descriptor&) = delete;
  int get() const { return fd_; }
  // Closes now, reporting the error that close() can give for a written file.
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

// ---------------------------------------------------------------------------------------------
// Writing.

void write_all(int fd, const void* data, std::size_t nbytes, const std::string& tmp) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (nbytes > 0) {
    const ssize_t n = ::write(fd, p, std::min<std::size_t>(nbytes, std::size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw checkpoint_file_error("checkpoint " + tmp + ": write failed: " + errno_text(errno));
    }
    p += n;
    nbytes -= static_cast<std::size_t>(n);
  }
}

void check_input(const std::string& path, const std::vector<checkpoint_tensor>& tensors,
                 const checkpoint_write_options& options) {
  const std::string who = "write_checkpoint_file(" + path + ")";
  if (options.max_chunk_bytes == 0 || options.max_chunk_bytes % 8 != 0 ||
      options.max_chunk_bytes > checkpoint_max_chunk_bytes) {
    throw std::invalid_argument(who + ": max_chunk_bytes " + std::to_string(options.max_chunk_bytes) +
                                " (expected a positive multiple of 8, at most " +
                                std::to_string(checkpoint_max_chunk_bytes) + ")");
  }
  std::unordered_set<std::string> names;
  for (const checkpoint_tensor& t : tensors) {
    if (t.name.find('\0') != std::string::npos) {
      throw std::invalid_argument(who + ": tensor name " + base::quoted(t.name) + " contains a NUL character");
    }
    if (!names.insert(t.name).second) {
      throw std::invalid_argument(who + ": two tensors are named " + base::quoted(t.name));
    }
    std::uint64_t expected = 0;
    if (!byte_size_of(t.shape, t.type, expected)) {
      throw std::invalid_argument(who + ": tensor " + base::quoted(t.name) + " has an invalid shape " + shape_text(t.shape));
    }
    if (expected != t.nbytes) {
      throw std::invalid_argument(who + ": tensor " + base::quoted(t.name) + " has " + std::to_string(t.nbytes) + " bytes, a " +
                                  scalar_name(t.type) + " tensor of shape " + shape_text(t.shape) + " has " +
                                  std::to_string(expected));
    }
    if (t.nbytes > 0 && t.data == nullptr) {
      throw std::invalid_argument(who + ": tensor " + base::quoted(t.name) + " has no data");
    }
  }
}

// The pieces a tensor's bytes are saved in. Whole words at a word-aligned address are referenced
// in place; a tail of fewer than 8 bytes, or a whole tensor at an unaligned address, is copied
// into a zero-padded buffer first, because a referenced segment is read in whole words.
struct chunk_plan {
  std::vector<std::pair<const void*, std::size_t>> chunks;
};

chunk_plan plan_chunks(const checkpoint_tensor& t, std::size_t max_chunk, std::deque<std::vector<std::uint64_t>>& copies) {
  chunk_plan plan;
  if (t.nbytes == 0) return plan;
  const auto* base = static_cast<const unsigned char*>(t.data);
  std::size_t whole = t.nbytes - t.nbytes % 8;
  if (reinterpret_cast<std::uintptr_t>(base) % 8 != 0) {
    auto& copy = copies.emplace_back((t.nbytes + 7) / 8, 0);
    std::memcpy(copy.data(), base, t.nbytes);
    base = reinterpret_cast<const unsigned char*>(copy.data());
    whole = t.nbytes;  // the copy's padding is ours and zero: its last chunk may end mid-word
  }
  for (std::size_t at = 0; at < whole; at += max_chunk) {
    plan.chunks.emplace_back(base + at, std::min(max_chunk, whole - at));
  }
  if (whole < t.nbytes) {
    auto& tail = copies.emplace_back(1, 0);
    std::memcpy(tail.data(), base + whole, t.nbytes - whole);
    plan.chunks.emplace_back(tail.data(), t.nbytes - whole);
  }
  return plan;
}

// Fills the message: the metadata in segment 0, each chunk referenced as a segment of its own.
void build_message(capnp::MallocMessageBuilder& message, std::int64_t step, const std::vector<checkpoint_tensor>& tensors,
                   const std::vector<chunk_plan>& plans, std::vector<const void*>& chunk_starts) {
  auto root = message.initRoot<wire::Checkpoint>();
  root.setStep(step);
  auto list = root.initTensors(static_cast<unsigned>(tensors.size()));
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const checkpoint_tensor& t = tensors[i];
    auto out = list[static_cast<unsigned>(i)];
    out.setName(capnp::Text::Reader(t.name.c_str(), t.name.size()));
    out.setElementType(to_wire(t.type));
    auto shape = out.initShape(static_cast<unsigned>(t.shape.size()));
    for (std::size_t d = 0; d < t.shape.size(); ++d) shape.set(static_cast<unsigned>(d), t.shape[d]);
    out.setByteSize(t.nbytes);
    out.setChecksum(xxhash64(t.data, t.nbytes));
    const auto& chunks = plans[i].chunks;
    auto data = out.initChunks(static_cast<unsigned>(chunks.size()));
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      auto bytes = capnp::Data::Reader(static_cast<const kj::byte*>(chunks[c].first), chunks[c].second);
      data.adopt(static_cast<unsigned>(c), message.getOrphanage().referenceExternalData(bytes));
      chunk_starts.push_back(chunks[c].first);
    }
  }
}

std::string temporary_name(const std::string& path) {
  static std::atomic<std::uint64_t> counter{0};
  return path + std::string(checkpoint_temporary_marker) + std::to_string(::getpid()) + "-" +
         std::to_string(counter.fetch_add(1));
}

void sync_directory(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  file_descriptor fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0 || ::fsync(fd.get()) != 0) {
    throw checkpoint_file_error("checkpoint " + path + ": written, but syncing its directory " + dir.string() +
                                " failed: " + errno_text(errno));
  }
}

}  // namespace

void write_checkpoint_file(const std::string& path, std::int64_t step, const std::vector<checkpoint_tensor>& tensors,
                           const checkpoint_write_options& options) {
  check_input(path, tensors, options);

  // Plan the chunks first, so that segment 0 can be sized to hold all the metadata.
  std::deque<std::vector<std::uint64_t>> copies;
  std::vector<chunk_plan> plans;
  plans.reserve(tensors.size());
  std::size_t meta_words = 64;
  std::size_t total_chunks = 0;
  for (const checkpoint_tensor& t : tensors) {
    plans.push_back(plan_chunks(t, options.max_chunk_bytes, copies));
    // The Tensor struct (3 data + 3 pointer words), its name, its shape, and per chunk a pointer
    // plus the two-word landing pad of a far pointer into the chunk's own segment.
    meta_words += 6 + (t.name.size() + 8) / 8 + t.shape.size() + 3 * plans.back().chunks.size();
    total_chunks += plans.back().chunks.size();
  }

  capnp::MallocMessageBuilder message(static_cast<unsigned>(std::min<std::size_t>(meta_words, 1u << 28)));
  std::vector<const void*> chunk_starts;
  chunk_starts.reserve(total_chunks);
  try {
    build_message(message, step, tensors, plans, chunk_starts);
  } catch (const kj::Exception& e) {
    throw checkpoint_file_error("checkpoint " + path + ": cannot encode it: " + e.getDescription().cStr());
  }

  // The layout the format promises: segment 0 holds the metadata, then one segment per chunk.
  auto segments = message.getSegmentsForOutput();
  if (segments.size() != 1 + total_chunks) {
    throw std::logic_error("write_checkpoint_file: " + std::to_string(segments.size()) + " segments for " +
                           std::to_string(total_chunks) + " chunks (metadata sized at " +
                           std::to_string(meta_words) + " words)");
  }
  for (std::size_t c = 0; c < total_chunks; ++c) {
    if (static_cast<const void*>(segments[1 + c].begin()) != chunk_starts[c]) {
      throw std::logic_error("write_checkpoint_file: segment " + std::to_string(1 + c) + " is not chunk " +
                             std::to_string(c));
    }
  }

  std::vector<unsigned char> table(((segments.size() + 2) / 2) * 8, 0);
  store_le32(table.data(), static_cast<std::uint32_t>(segments.size() - 1));
  std::uint64_t message_bytes = table.size();
  for (std::size_t s = 0; s < segments.size(); ++s) {
    store_le32(table.data() + 4 * (s + 1), static_cast<std::uint32_t>(segments[s].size()));
    message_bytes += segments[s].size() * 8;
  }

  unsigned char preamble[checkpoint_preamble_bytes] = {};
  std::memcpy(preamble, checkpoint_magic, 8);
  store_le32(preamble + 8, checkpoint_format_version);
  store_le32(preamble + 12, 0);
  store_le64(preamble + 16, message_bytes);
  xxhash64_stream meta;
  meta.update(table.data(), table.size());
  meta.update(segments[0].begin(), segments[0].size() * 8);
  store_le64(preamble + 24, meta.digest());
  store_le64(preamble + 32, xxhash64(preamble, 32));

  const std::string tmp = temporary_name(path);
  file_descriptor fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    throw checkpoint_file_error("checkpoint " + path + ": cannot create the temporary file " + tmp + ": " +
                                errno_text(errno));
  }
  try {
    write_all(fd.get(), preamble, sizeof preamble, tmp);
    write_all(fd.get(), table.data(), table.size(), tmp);
    for (const auto& segment : segments) write_all(fd.get(), segment.begin(), segment.size() * 8, tmp);
    if (::fsync(fd.get()) != 0) {
      throw checkpoint_file_error("checkpoint " + tmp + ": fsync failed: " + errno_text(errno));
    }
    if (fd.close() != 0) {
      throw checkpoint_file_error("checkpoint " + tmp + ": close failed: " + errno_text(errno));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      throw checkpoint_file_error("checkpoint " + path + ": cannot rename " + tmp + " to it: " + errno_text(errno));
    }
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  sync_directory(path);
}

// ---------------------------------------------------------------------------------------------
// Reading.

const checkpoint_entry* checkpoint_contents::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

class checkpoint_reader {
 public:
  checkpoint_reader(const std::string& path, const checkpoint_read_options& options)
      : path_(path), options_(options) {}

  checkpoint_contents read() {
    checkpoint_contents out;
    out.path_ = path_;
    read_file(out);
    const std::uint64_t message_bytes = check_preamble(out);
    std::vector<kj::ArrayPtr<const capnp::word>> segments = split_segments(out, message_bytes);
    try {
      capnp::ReaderOptions limits;
      limits.traversalLimitInWords = 2 * (message_bytes / 8) + 64;
      limits.nestingLimit = 16;
      capnp::SegmentArrayMessageReader message(kj::arrayPtr(segments.data(), segments.size()), limits);
      read_tensors(out, message.getRoot<wire::Checkpoint>());
    } catch (const kj::Exception& e) {
      fail("malformed Cap'n Proto message: " + std::string(e.getDescription().cStr()));
    }
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw checkpoint_file_error("checkpoint " + path_ + ": " + what);
  }

  void read_file(checkpoint_contents& out) {
    file_descriptor fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) fail("cannot open it: " + errno_text(errno));
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) fail("cannot stat it: " + errno_text(errno));
    if (!S_ISREG(st.st_mode)) fail("not a regular file");
    const auto size = static_cast<std::uint64_t>(st.st_size);
    out.words_.assign((size + 7) / 8, 0);  // 8-byte aligned, as Cap'n Proto requires
    auto* p = reinterpret_cast<unsigned char*>(out.words_.data());
    std::uint64_t have = 0;
    while (have < size) {
      const ssize_t n = ::read(fd.get(), p + have, std::min<std::uint64_t>(size - have, std::uint64_t{1} << 30));
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("read failed: " + errno_text(errno));
      }
      if (n == 0) break;  // it shrank since fstat
      have += static_cast<std::uint64_t>(n);
    }
    out.file_bytes_ = have;
  }

  const unsigned char* bytes(const checkpoint_contents& c) const {
    return reinterpret_cast<const unsigned char*>(c.words_.data());
  }

  // Returns the message size the preamble declares, once the preamble is known intact and the
  // file is exactly that long.
  std::uint64_t check_preamble(const checkpoint_contents& c) const {
    const std::uint64_t size = c.file_bytes_;
    const unsigned char* p = bytes(c);
    if (size == 0) fail("empty file (0 bytes), not a troupe checkpoint");
    if (std::memcmp(p, checkpoint_magic, std::min<std::uint64_t>(size, 8)) != 0) {
      fail("not a troupe checkpoint (its first bytes are not \"TROUPECK\")");
    }
    if (size < checkpoint_preamble_bytes) {
      fail("truncated: " + std::to_string(size) + " bytes, shorter than the " +
           std::to_string(checkpoint_preamble_bytes) + "-byte header");
    }
    const std::uint64_t stored = load_le64(p + 32);
    const std::uint64_t computed = xxhash64(p, 32);
    if (stored != computed) {
      fail("corrupt header: checksum mismatch in its first 40 bytes (stored " + hex(stored) + ", computed " +
           hex(computed) + ")");
    }
    const std::uint32_t version = load_le32(p + 8);
    if (version != checkpoint_format_version) {
      fail("format version " + std::to_string(version) + ", this build reads version " +
           std::to_string(checkpoint_format_version));
    }
    if (load_le32(p + 12) != 0) fail("unknown flags " + std::to_string(load_le32(p + 12)) + " in its header");
    const std::uint64_t message_bytes = load_le64(p + 16);
    if (message_bytes % 8 != 0 || message_bytes < 8 ||
        message_bytes > std::numeric_limits<std::uint64_t>::max() - checkpoint_preamble_bytes) {
      fail("corrupt header: message size " + std::to_string(message_bytes) + " is not a positive multiple of 8");
    }
    const std::uint64_t expected = checkpoint_preamble_bytes + message_bytes;
    if (size < expected) {
      fail("truncated: its header says " + std::to_string(expected) + " bytes, the file has " + std::to_string(size));
    }
    if (size > expected) {
      fail("has " + std::to_string(size) + " bytes, " + std::to_string(size - expected) +
           " more than the " + std::to_string(expected) + " its header says");
    }
    return message_bytes;
  }

  // Parses the segment table ourselves (bounds checked) and verifies the metadata checksum before
  // Cap'n Proto sees any of it.
  std::vector<kj::ArrayPtr<const capnp::word>> split_segments(const checkpoint_contents& c,
                                                              std::uint64_t message_bytes) const {
    const unsigned char* msg = bytes(c) + checkpoint_preamble_bytes;
    const std::uint64_t message_words = message_bytes / 8;
    const std::uint64_t count = std::uint64_t{load_le32(msg)} + 1;
    const std::uint64_t table_words = (count + 2) / 2;
    if (table_words > message_words) {
      fail("corrupt header: a segment table of " + std::to_string(count) + " segments does not fit in the " +
           std::to_string(message_bytes) + "-byte message");
    }
    std::uint64_t sum = 0;
    for (std::uint64_t s = 0; s < count; ++s) sum += load_le32(msg + 4 * (s + 1));
    if (sum != message_words - table_words) {
      fail("corrupt header: its segments add up to " + std::to_string(sum * 8) + " bytes, the message holds " +
           std::to_string((message_words - table_words) * 8) + " after the segment table");
    }
    xxhash64_stream meta;
    meta.update(msg, table_words * 8 + std::uint64_t{load_le32(msg + 4)} * 8);
    const std::uint64_t stored = load_le64(bytes(c) + 24);
    if (meta.digest() != stored) {
      fail("corrupt header: the checksum of its metadata does not match (stored " + hex(stored) + ", computed " +
           hex(meta.digest()) + ")");
    }
    std::vector<kj::ArrayPtr<const capnp::word>> segments;
    segments.reserve(count);
    const auto* at = reinterpret_cast<const capnp::word*>(msg) + table_words;
    for (std::uint64_t s = 0; s < count; ++s) {
      const std::uint32_t words = load_le32(msg + 4 * (s + 1));
      segments.push_back(kj::arrayPtr(at, words));
      at += words;
    }
    return segments;
  }

  void read_tensors(checkpoint_contents& out, wire::Checkpoint::Reader root) const {
    out.step_ = root.getStep();
    const auto list = root.getTensors();
    out.tensors_.reserve(list.size());
    for (const auto t : list) {
      checkpoint_entry e;
      e.name = std::string(t.getName().cStr(), t.getName().size());
      const std::string tensor = "tensor " + base::quoted(e.name);
      if (!from_wire(t.getElementType(), e.type)) {
        fail(tensor + " has unknown element type " + std::to_string(static_cast<unsigned>(t.getElementType())));
      }
      for (std::int64_t d : t.getShape()) e.shape.push_back(d);
      std::uint64_t expected = 0;
      if (!byte_size_of(e.shape, e.type, expected)) fail(tensor + " has an invalid shape " + shape_text(e.shape));
      if (t.getByteSize() != expected) {
        fail(tensor + " says " + std::to_string(t.getByteSize()) + " bytes, a " + scalar_name(e.type) +
             " tensor of shape " + shape_text(e.shape) + " has " + std::to_string(expected));
      }
      const auto chunks = t.getChunks();
      std::vector<capnp::Data::Reader> pieces;
      std::uint64_t total = 0;
      for (const auto chunk : chunks) {  // each Data read once: reads count against the traversal limit
        pieces.push_back(chunk);
        total += chunk.size();
      }
      if (total != expected) {
        fail(tensor + " holds " + std::to_string(total) + " bytes of data, a " + scalar_name(e.type) +
             " tensor of shape " + shape_text(e.shape) + " has " + std::to_string(expected));
      }
      e.nbytes = static_cast<std::size_t>(total);
      e.checksum = t.getChecksum();
      e.chunks = pieces.size();
      e.data = join(out, pieces);
      if (options_.verify_tensor_checksums) {
        const std::uint64_t computed = xxhash64(e.data, e.nbytes);
        if (computed != e.checksum) {
          fail(tensor + " fails its checksum (stored " + hex(e.checksum) + ", computed " + hex(computed) +
               "): its data is corrupt");
        }
      }
      if (!out.index_.emplace(e.name, out.tensors_.size()).second) fail("holds " + tensor + " twice");
      out.tensors_.push_back(std::move(e));
    }
  }

  // The tensor's bytes in one piece: in place when its chunks are adjacent (as the writer lays
  // them out), else copied.
  static const void* join(checkpoint_contents& out, const std::vector<capnp::Data::Reader>& pieces) {
    std::vector<capnp::Data::Reader> nonempty;
    for (const auto& p : pieces) {
      if (p.size() > 0) nonempty.push_back(p);
    }
    if (nonempty.empty()) return nullptr;
    bool adjacent = true;
    for (std::size_t i = 1; i < nonempty.size(); ++i) adjacent = adjacent && nonempty[i - 1].end() == nonempty[i].begin();
    if (adjacent) return nonempty[0].begin();
    std::size_t total = 0;
    for (const auto& p : nonempty) total += p.size();
    auto& copy = out.joined_.emplace_back((total + 7) / 8, 0);
    auto* dst = reinterpret_cast<unsigned char*>(copy.data());
    for (const auto& p : nonempty) {
      std::memcpy(dst, p.begin(), p.size());
      dst += p.size();
    }
    return copy.data();
  }

  const std::string& path_;
  const checkpoint_read_options& options_;
};

checkpoint_contents read_checkpoint_file(const std::string& path, const checkpoint_read_options& options) {
  return checkpoint_reader(path, options).read();
}

}  // namespace troupe::format
