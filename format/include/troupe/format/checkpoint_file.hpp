#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "troupe/base/elements.hpp"

namespace troupe::format {

using base::scalar_type;

// The checkpoint file format, version 1. All integers little-endian.
//
//   offset  size  field
//   0       8     magic "TROUPECK"
//   8       4     format version (1)
//   12      4     flags, 0
//   16      8     message_bytes: size of the Cap'n Proto message that follows (a multiple of 8);
//                 the file is exactly 40 + message_bytes long
//   24      8     metadata checksum: XXH64 of the message's segment table and segment 0, i.e. of
//                 every byte of the message except the tensor bytes
//   32      8     preamble checksum: XXH64 of bytes 0..31
//   40      ...   the message (schema/checkpoint.capnp) in the standard flat-array form: segment
//                 table, segment 0 (step, names, dtypes, shapes, byte sizes, tensor checksums),
//                 then one segment per tensor chunk in order. A tensor's checksum is XXH64 of its
//                 bytes; a tensor above checkpoint_max_chunk_bytes is split into several chunks.
//
// Every checksum is XXH64 with seed 0 (xxHash's 64-bit hash, implemented here and checked against
// the reference library's values in the tests). Two checksums cover the header so that a bad size
// field is reported as corruption rather than as truncation.

/// A checkpoint file that cannot be written or used. what() names the file and the problem.
class checkpoint_file_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The 8 bytes every checkpoint file starts with.
inline constexpr char checkpoint_magic[8] = {'T', 'R', 'O', 'U', 'P', 'E', 'C', 'K'};
/// The format version this build writes and reads.
inline constexpr std::uint32_t checkpoint_format_version = 1;
/// Bytes before the Cap'n Proto message.
inline constexpr std::size_t checkpoint_preamble_bytes = 40;
/// The largest chunk of one tensor: a Cap'n Proto Data holds at most 2^29 - 1 bytes, and
/// chunks are whole words so that they can be referenced in place.
inline constexpr std::size_t checkpoint_max_chunk_bytes = (std::size_t{1} << 29) - 8;
/// What the temporary file of a save adds to the final name (then a process id and a counter).
inline constexpr std::string_view checkpoint_temporary_marker = ".tmp-";

/// XXH64 of `nbytes` bytes at `data`.
std::uint64_t xxhash64(const void* data, std::size_t nbytes, std::uint64_t seed = 0) noexcept;

/// XXH64 over bytes given in pieces; digest() equals xxhash64 of their concatenation.
class xxhash64_stream {
 public:
  explicit xxhash64_stream(std::uint64_t seed = 0) noexcept;
  void update(const void* data, std::size_t nbytes) noexcept;
  std::uint64_t digest() const noexcept;

 private:
  std::uint64_t acc_[4];
  std::uint64_t seed_;
  std::uint64_t total_bytes_ = 0;
  unsigned char buffer_[32];
  std::size_t buffered_ = 0;
};

/// One tensor to save. `data` is referenced, not copied, while the file is written.
struct checkpoint_tensor {
  std::string name;  ///< unique in the file, without NUL characters
  scalar_type type = scalar_type::f32;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
  std::size_t nbytes = 0;  ///< must be the element count of `shape` times the element size
};

struct checkpoint_write_options {
  /// Chunk size for big tensors: a positive multiple of 8, at most checkpoint_max_chunk_bytes
  /// (smaller values exist for tests).
  std::size_t max_chunk_bytes = checkpoint_max_chunk_bytes;
};

/// Writes `tensors` and `step` to `path` atomically: a temporary file in the same directory
/// (path + ".tmp-<pid>-<n>"), written, fsynced, renamed over `path`, then the directory fsynced.
/// A crash leaves at worst a stray temporary file, never a partial file under `path`.
/// Bad input throws std::invalid_argument; a failed write throws checkpoint_file_error naming
/// the file, and removes the temporary file.
void write_checkpoint_file(const std::string& path, std::int64_t step, const std::vector<checkpoint_tensor>& tensors,
                           const checkpoint_write_options& options = {});

/// One tensor of a file read back.
struct checkpoint_entry {
  std::string name;
  scalar_type type = scalar_type::f32;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;  ///< nbytes bytes, owned by the checkpoint_contents; null when empty
  std::size_t nbytes = 0;
  std::uint64_t checksum = 0;  ///< as stored in the file
  std::size_t chunks = 0;      ///< how many chunks the file held it in
};

/// A checkpoint file read into memory (an 8-byte aligned buffer); the entries point into it.
/// Movable, not copyable.
class checkpoint_contents {
 public:
  checkpoint_contents() = default;
  checkpoint_contents(checkpoint_contents&&) = default;
  checkpoint_contents& operator=(checkpoint_contents&&) = default;
  checkpoint_contents(const checkpoint_contents&) = delete;
  checkpoint_contents& operator=(const checkpoint_contents&) = delete;

  const std::string& path() const noexcept { return path_; }
  std::int64_t step() const noexcept { return step_; }
  std::uint64_t file_bytes() const noexcept { return file_bytes_; }
  /// In file order.
  const std::vector<checkpoint_entry>& tensors() const noexcept { return tensors_; }
  /// The tensor called `name`, or nullptr.
  const checkpoint_entry* find(const std::string& name) const;

 private:
  friend class checkpoint_reader;
  std::string path_;
  std::int64_t step_ = 0;
  std::uint64_t file_bytes_ = 0;
  std::vector<std::uint64_t> words_;
  std::vector<std::vector<std::uint64_t>> joined_;  // tensors whose chunks were not adjacent
  std::vector<checkpoint_entry> tensors_;
  std::unordered_map<std::string, std::size_t> index_;
};

struct checkpoint_read_options {
  /// When false, tensor checksums are read but not verified (for inspection tools, which then
  /// compare xxhash64(data, nbytes) with each entry's checksum themselves). Everything else is
  /// always verified.
  bool verify_tensor_checksums = true;
};

/// Reads and verifies `path`, trusting nothing in it: magic and version, both header checksums,
/// the size against the header, the Cap'n Proto structure (traversal limit from the file size),
/// every tensor's dtype, shape and byte count, and (by default) every tensor's checksum.
/// Any problem throws checkpoint_file_error naming the file (and the tensor, for a tensor's
/// checksum), e.g. "checkpoint /d/ckpt-5.ckpt: truncated: its header says 4136 bytes, the file
/// has 4000".
checkpoint_contents read_checkpoint_file(const std::string& path, const checkpoint_read_options& options = {});

}  // namespace troupe::format
