// The checkpoint reader over a file's bytes. The first input byte picks how the rest is used:
// bit 0 clear, as the whole file (magic, header checksums and all); bit 0 set, as the Cap'n Proto
// message, sealed with a correct header the way a forger would (sizes and both header checksums
// right), so the fuzzer reaches the segment table, the structure and the tensors; bit 1 turns the
// tensor checksums off (troupe-ckpt's mode). Every problem must be a checkpoint_file_error with a
// bounded message.

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "troupe/format/checkpoint_file.hpp"

namespace fmt = troupe::format;

namespace {

void put32(std::uint8_t* p, std::uint32_t v) { std::memcpy(p, &v, 4); }
void put64(std::uint8_t* p, std::uint64_t v) { std::memcpy(p, &v, 8); }
std::uint32_t get32(const std::uint8_t* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// A file with a correct preamble around `message` (padded to whole words).
std::vector<std::uint8_t> sealed(const std::uint8_t* message, std::size_t n) {
  const std::size_t words = (n + 7) / 8;
  std::vector<std::uint8_t> f(fmt::checkpoint_preamble_bytes + words * 8, 0);
  std::memcpy(f.data(), fmt::checkpoint_magic, 8);
  put32(f.data() + 8, fmt::checkpoint_format_version);
  put64(f.data() + 16, words * 8);
  if (n > 0) std::memcpy(f.data() + fmt::checkpoint_preamble_bytes, message, n);
  // The metadata checksum over the segment table and segment 0, as far as the message holds them.
  const std::uint8_t* msg = f.data() + fmt::checkpoint_preamble_bytes;
  std::size_t meta = 0;
  if (words > 0) {
    const std::uint64_t count = std::uint64_t{get32(msg)} + 1;
    const std::uint64_t table_bytes = (count + 2) / 2 * 8;
    if (table_bytes <= words * 8) {
      meta = static_cast<std::size_t>(std::min<std::uint64_t>(words * 8, table_bytes + std::uint64_t{get32(msg + 4)} * 8));
    }
  }
  put64(f.data() + 24, fmt::xxhash64(msg, meta));
  put64(f.data() + 32, fmt::xxhash64(f.data(), 32));
  return f;
}

const std::string& scratch_path() {
  // In memory when the machine has /dev/shm: a disk file costs 40x the inputs per second.
  static const std::string path = [] {
    const char* tmp = std::getenv("TMPDIR");
    const std::string dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm"
                            : tmp != nullptr && *tmp != '\0' ? tmp
                                                              : "/tmp";
    return dir + "/troupe-checkpoint-fuzz-" + std::to_string(::getpid()) + ".ckpt";
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  std::vector<std::uint8_t> file =
      (mode & 1) ? sealed(data + 1, size - 1) : std::vector<std::uint8_t>(data + 1, data + size);
  const std::string& path = scratch_path();
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    if (!file.empty()) std::fwrite(file.data(), 1, file.size(), f);
    std::fclose(f);
  } else {
    std::abort();
  }
  fmt::checkpoint_read_options options;
  options.verify_tensor_checksums = (mode & 2) == 0;
  try {
    const fmt::checkpoint_contents c = fmt::read_checkpoint_file(path, options);
    // What it accepted is consistent: every entry's bytes are there and readable.
    for (const auto& e : c.tensors()) {
      volatile std::uint8_t sink = 0;
      const auto* p = static_cast<const std::uint8_t*>(e.data);
      for (std::size_t i = 0; p != nullptr && i < e.nbytes; ++i) sink = sink ^ p[i];
      (void)sink;
      if (c.find(e.name) == nullptr) std::abort();
    }
  } catch (const fmt::checkpoint_file_error& e) {
    troupe::fuzz::check_message(e.what());
  }
  // Removed every time: libFuzzer ends its run without running atexit handlers.
  std::remove(path.c_str());
  return 0;
}
