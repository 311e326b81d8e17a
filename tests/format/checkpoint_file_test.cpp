#include <doctest/doctest.h>

#include "../common/temp_dir.hpp"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "troupe/format/checkpoint_file.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::format;
namespace fs = std::filesystem;

using troupe::testing::read_bytes;
using troupe::testing::temp_dir;
using troupe::testing::write_bytes;

namespace {


std::string error_of(const std::string& path, const checkpoint_read_options& options = {}) {
  try {
    read_checkpoint_file(path, options);
  } catch (const checkpoint_file_error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::uint64_t le64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
std::uint32_t le32(const unsigned char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
void put64(unsigned char* p, std::uint64_t v) { std::memcpy(p, &v, 8); }

// Bytes 0..end of the metadata: preamble, segment table and segment 0 (see checkpoint_file.hpp).
std::size_t metadata_end(const std::vector<unsigned char>& f) {
  const std::size_t count = le32(f.data() + 40) + std::size_t{1};
  return checkpoint_preamble_bytes + (count + 2) / 2 * 8 + le32(f.data() + 44) * std::size_t{8};
}

// Recomputes both header checksums, as a forger would: what is left to catch is the structure.
void reseal(std::vector<unsigned char>& f) {
  const std::size_t end = metadata_end(f);
  put64(f.data() + 24, xxhash64(f.data() + checkpoint_preamble_bytes, end - checkpoint_preamble_bytes));
  put64(f.data() + 32, xxhash64(f.data(), 32));
}

// The offset of the first occurrence of `v` (8 bytes, little-endian) in [begin, end).
std::size_t find64(const std::vector<unsigned char>& f, std::size_t begin, std::size_t end, std::uint64_t v) {
  for (std::size_t i = begin; i + 8 <= end; i += 8) {
    if (le64(f.data() + i) == v) return i;
  }
  FAIL("value " << v << " not found");
  return 0;
}

template <class T>
checkpoint_tensor tensor_of(const std::string& name, scalar_type type, std::vector<std::int64_t> shape,
                            const std::vector<T>& values) {
  return checkpoint_tensor{name, type, std::move(shape), values.data(), values.size() * sizeof(T)};
}

template <class T>
std::vector<T> values_of(const checkpoint_entry& e) {
  std::vector<T> out(e.nbytes / sizeof(T));
  if (e.nbytes > 0) std::memcpy(out.data(), e.data, e.nbytes);
  return out;
}

// A small file of three tensors: the fixture of the corruption tests.
struct small_file {
  std::vector<float> w{1.5f, -2.0f, 3.25f, 4.0f, 5.0f, 6.0f};
  std::vector<std::int32_t> b{7, 8, 9};  // 12 bytes: a tail chunk
  std::vector<double> s{0.125};
  void write(const std::string& path) const {
    write_checkpoint_file(path, 42,
                          {tensor_of("dense/kernel", scalar_type::f32, {2, 3}, w),
                           tensor_of("dense/bias", scalar_type::i32, {3}, b), tensor_of("scale", scalar_type::f64, {}, s)});
  }
};

}  // namespace

TEST_CASE("xxhash64 matches the reference library's values, in one piece or many") {
  CHECK(xxhash64("", 0) == 0xef46db3751d8e999ULL);
  CHECK(xxhash64("a", 1) == 0xd24ec4f1a98c6e5bULL);
  CHECK(xxhash64("abc", 3) == 0x44bc2cf5ad770999ULL);
  CHECK(xxhash64("123456789", 9) == 0x8cb841db40e6ae83ULL);
  const std::string fox = "The quick brown fox jumps over the lazy dog";
  CHECK(xxhash64(fox.data(), fox.size()) == 0x0b242d361fda71bcULL);
  CHECK(xxhash64("abc", 3, 0x9E3779B185EBCA87ULL) == 0xa7cb2aac405e36c7ULL);
  std::string long_input;
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 256; ++i) long_input.push_back(static_cast<char>(i));
  }
  long_input += "xyz";
  CHECK(xxhash64(long_input.data(), long_input.size()) == 0xe146cb31b65bc21aULL);
  CHECK(xxhash64(long_input.data(), long_input.size(), 0x9E3779B185EBCA87ULL) == 0xaee8a8f151110399ULL);

  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    xxhash64_stream s;
    std::size_t at = 0;
    while (at < long_input.size()) {
      const std::size_t n = std::min<std::size_t>(rng() % 70, long_input.size() - at);
      s.update(long_input.data() + at, n);
      at += n;
    }
    REQUIRE(s.digest() == 0xe146cb31b65bc21aULL);
  }
}

TEST_CASE("a checkpoint file round-trips every dtype, scalars, empty tensors and odd sizes") {
  temp_dir dir;
  const std::string path = dir.file("all.ckpt");
  std::vector<float> f32{1.0f, -0.5f, 3.0f};  // 12 bytes: not whole words
  std::vector<double> f64{1e300, -2.5, 0.0, 4.0};
  std::vector<std::int32_t> i32{-7};
  std::vector<std::int64_t> i64{1, 2, 3, 4, 5, 6};
  std::vector<float> empty;
  // An unaligned source: the writer must copy it rather than reference it.
  std::vector<unsigned char> raw(8 * 5 + 4);
  for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<unsigned char>(i * 37 + 1);
  const void* unaligned = raw.data() + 4;
  write_checkpoint_file(path, -3,
                        {tensor_of("f32", scalar_type::f32, {3}, f32), tensor_of("f64", scalar_type::f64, {2, 2}, f64),
                         tensor_of("i32", scalar_type::i32, {}, i32), tensor_of("i64", scalar_type::i64, {3, 1, 2}, i64),
                         tensor_of("empty", scalar_type::f32, {0, 4}, empty),
                         checkpoint_tensor{"unaligned", scalar_type::i64, {5}, unaligned, 40}});
  const checkpoint_contents c = read_checkpoint_file(path);
  CHECK(c.step() == -3);
  CHECK(c.path() == path);
  CHECK(c.file_bytes() == fs::file_size(path));
  REQUIRE(c.tensors().size() == 6);
  CHECK(c.tensors()[0].name == "f32");  // file order is the order given
  CHECK(values_of<float>(*c.find("f32")) == f32);
  CHECK(c.find("f64")->shape == std::vector<std::int64_t>{2, 2});
  CHECK(values_of<double>(*c.find("f64")) == f64);
  CHECK(c.find("i32")->shape.empty());
  CHECK(values_of<std::int32_t>(*c.find("i32")) == i32);
  CHECK(c.find("i64")->type == scalar_type::i64);
  CHECK(values_of<std::int64_t>(*c.find("i64")) == i64);
  CHECK(c.find("empty")->nbytes == 0);
  CHECK(c.find("empty")->data == nullptr);
  CHECK(c.find("empty")->shape == std::vector<std::int64_t>{0, 4});
  CHECK(std::memcmp(c.find("unaligned")->data, unaligned, 40) == 0);
  CHECK(c.find("missing") == nullptr);
  for (const auto& e : c.tensors()) CHECK(e.checksum == xxhash64(e.data, e.nbytes));
}

TEST_CASE("big tensors are split into chunks and read back in one piece") {
  temp_dir dir;
  const std::string path = dir.file("chunks.ckpt");
  std::vector<std::int32_t> big(1001);  // 4004 bytes: 62 chunks of 64, one of 32, a copied tail of 4
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::int32_t>(i * i);
  std::vector<double> exact(16, 2.0);   // 128 bytes: exactly 2 chunks
  checkpoint_write_options options;
  options.max_chunk_bytes = 64;
  write_checkpoint_file(path, 9, {tensor_of("big", scalar_type::i32, {7, 143}, big), tensor_of("exact", scalar_type::f64, {16}, exact)},
                        options);
  const checkpoint_contents c = read_checkpoint_file(path);
  CHECK(c.find("big")->chunks == 64);
  CHECK(values_of<std::int32_t>(*c.find("big")) == big);
  CHECK(c.find("exact")->chunks == 2);
  CHECK(values_of<double>(*c.find("exact")) == exact);
  // The chunks lie back to back in the file, so the reader hands out the bytes in place.
  const auto* data = static_cast<const unsigned char*>(c.find("big")->data);
  CHECK(reinterpret_cast<std::uintptr_t>(data) % 8 == 0);

  checkpoint_write_options bad;
  bad.max_chunk_bytes = 12;
  CHECK_THROWS_AS(write_checkpoint_file(path, 0, {}, bad), std::invalid_argument);
  bad.max_chunk_bytes = checkpoint_max_chunk_bytes + 8;
  CHECK_THROWS_AS(write_checkpoint_file(path, 0, {}, bad), std::invalid_argument);
  CHECK(checkpoint_max_chunk_bytes < (std::size_t{1} << 29));
}

TEST_CASE("a tensor above 512 MiB is saved in several chunks and restored intact") {
  temp_dir dir;
  const std::string path = dir.file("huge.ckpt");
  const std::size_t count = (std::size_t{1} << 29) / 8 + 1000;  // 512 MiB + 8000 bytes of int64
  std::vector<std::int64_t> huge(count);
  for (std::size_t i = 0; i < count; ++i) huge[i] = static_cast<std::int64_t>(i * 2654435761u);
  write_checkpoint_file(path, 1, {tensor_of("huge", scalar_type::i64, {static_cast<std::int64_t>(count)}, huge)});
  const checkpoint_contents c = read_checkpoint_file(path);
  const checkpoint_entry& e = *c.find("huge");
  CHECK(e.chunks == 2);
  REQUIRE(e.nbytes == count * 8);
  CHECK(std::memcmp(e.data, huge.data(), e.nbytes) == 0);
}

TEST_CASE("a save is atomic: no temporary file is left, and an existing file is replaced whole") {
  temp_dir dir;
  const std::string path = dir.file("a.ckpt");
  small_file f;
  f.write(path);
  std::vector<float> other{9.0f};
  write_checkpoint_file(path, 43, {tensor_of("only", scalar_type::f32, {1}, other)});
  const checkpoint_contents c = read_checkpoint_file(path);
  CHECK(c.step() == 43);
  CHECK(c.tensors().size() == 1);
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path)) {
    ++files;
    CHECK(entry.path().filename() == "a.ckpt");
  }
  CHECK(files == 1);

  // A directory that does not exist: a clear error, nothing created.
  const std::string nowhere = dir.file("no/such/dir/b.ckpt");
  std::string msg;
  try {
    f.write(nowhere);
  } catch (const checkpoint_file_error& e) {
    msg = e.what();
  }
  CHECK(contains(msg, "checkpoint " + nowhere + ": cannot create the temporary file"));
  CHECK(contains(msg, "No such file or directory"));
}

TEST_CASE("bad tensors to save are refused before anything is written") {
  temp_dir dir;
  const std::string path = dir.file("bad.ckpt");
  std::vector<float> v{1, 2, 3};
  auto message = [&](const std::vector<checkpoint_tensor>& t) {
    try {
      write_checkpoint_file(path, 0, t);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(contains(message({tensor_of("x", scalar_type::f32, {2, 2}, v)}),
                 "tensor 'x' has 12 bytes, a float32 tensor of shape [2, 2] has 16"));
  CHECK(contains(message({tensor_of("x", scalar_type::f32, {3}, v), tensor_of("x", scalar_type::f32, {3}, v)}),
                 "two tensors are named 'x'"));
  CHECK(contains(message({tensor_of("x", scalar_type::f32, {-3}, v)}), "invalid shape [-3]"));
  CHECK(contains(message({tensor_of(std::string("a\0b", 3), scalar_type::f32, {3}, v)}),
                 "tensor name 'a\\0b' contains a NUL character"));
  CHECK_FALSE(fs::exists(path));
}

TEST_CASE("missing, empty, random and non-regular files are clear errors naming the file") {
  temp_dir dir;
  const std::string missing = dir.file("missing.ckpt");
  CHECK(contains(error_of(missing), "checkpoint " + missing + ": cannot open it: No such file or directory"));

  const std::string empty = dir.file("empty.ckpt");
  write_bytes(empty, {});
  CHECK(error_of(empty) == "checkpoint " + empty + ": empty file (0 bytes), not a troupe checkpoint");

  const std::string random = dir.file("random.ckpt");
  std::mt19937 rng(3);
  std::vector<unsigned char> noise(4096);
  for (auto& b : noise) b = static_cast<unsigned char>(rng());
  write_bytes(random, noise);
  CHECK(contains(error_of(random), "checkpoint " + random + ": not a troupe checkpoint"));

  // Random bytes behind a correct magic: the header checksum catches them.
  std::memcpy(noise.data(), checkpoint_magic, 8);
  write_bytes(random, noise);
  CHECK(contains(error_of(random), "checkpoint " + random + ": corrupt header: checksum mismatch"));

  CHECK(contains(error_of(dir.path.string()), "not a regular file"));
}

TEST_CASE("a truncated file is reported with the expected and actual sizes, at every length") {
  temp_dir dir;
  const std::string path = dir.file("t.ckpt");
  small_file().write(path);
  const std::vector<unsigned char> whole = read_bytes(path);
  const std::string cut = dir.file("cut.ckpt");
  for (std::size_t n = 0; n < whole.size(); ++n) {
    write_bytes(cut, std::vector<unsigned char>(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(n)));
    const std::string msg = error_of(cut);
    INFO("length " << n);
    REQUIRE(contains(msg, "checkpoint " + cut + ": "));
    if (n >= checkpoint_preamble_bytes) {
      REQUIRE(contains(msg, "truncated: its header says " + std::to_string(whole.size()) + " bytes, the file has " +
                                std::to_string(n)));
    } else if (n >= 8) {
      REQUIRE(contains(msg, "truncated: " + std::to_string(n) + " bytes, shorter than the 40-byte header"));
    }
  }
  std::vector<unsigned char> longer = whole;
  longer.resize(whole.size() + 8, 0);
  write_bytes(cut, longer);
  CHECK(contains(error_of(cut), "8 more than the " + std::to_string(whole.size()) + " its header says"));
}

TEST_CASE("every flipped byte is caught: the header by its checksums, tensor data by the tensor's") {
  temp_dir dir;
  const std::string path = dir.file("f.ckpt");
  small_file f;
  f.write(path);
  const std::vector<unsigned char> good = read_bytes(path);
  const std::size_t meta_end = metadata_end(good);
  const std::string bad = dir.file("bad.ckpt");
  int data_errors = 0;
  for (std::size_t i = 0; i < good.size(); ++i) {
    std::vector<unsigned char> flipped = good;
    flipped[i] ^= 0x10;
    write_bytes(bad, flipped);
    INFO("byte " << i);
    const std::string msg = error_of(bad);
    if (i < meta_end) {
      REQUIRE(contains(msg, "checkpoint " + bad + ": "));
      if (i >= 8) REQUIRE((contains(msg, "corrupt header") || contains(msg, "truncated") || contains(msg, "more than")));
    } else if (!msg.empty()) {
      REQUIRE(contains(msg, "fails its checksum"));
      ++data_errors;
    } else {
      // Only the zero padding after a tensor's last bytes is outside every checksum; what is
      // read back must then still be exactly what was saved.
      const checkpoint_contents c = read_checkpoint_file(bad);
      REQUIRE(values_of<float>(*c.find("dense/kernel")) == f.w);
      REQUIRE(values_of<std::int32_t>(*c.find("dense/bias")) == f.b);
      REQUIRE(values_of<double>(*c.find("scale")) == f.s);
    }
  }
  CHECK(data_errors == static_cast<int>(6 * 4 + 3 * 4 + 8));  // every byte of every tensor

  // The message names the tensor.
  std::vector<unsigned char> flipped = good;
  flipped[good.size() - 1] ^= 1;  // the last byte of "scale"
  write_bytes(bad, flipped);
  CHECK(contains(error_of(bad), "checkpoint " + bad + ": tensor 'scale' fails its checksum"));
  // Read without verification, the entry's checksum no longer matches its bytes.
  checkpoint_read_options lenient;
  lenient.verify_tensor_checksums = false;
  const checkpoint_contents c = read_checkpoint_file(bad, lenient);
  const checkpoint_entry& s = *c.find("scale");
  CHECK(xxhash64(s.data, s.nbytes) != s.checksum);
}

TEST_CASE("a well-sealed file that lies is still refused: version, sizes and structure are checked") {
  temp_dir dir;
  const std::string path = dir.file("l.ckpt");
  small_file().write(path);
  const std::vector<unsigned char> good = read_bytes(path);
  const std::string bad = dir.file("bad.ckpt");

  std::vector<unsigned char> v2 = good;
  v2[8] = 2;
  reseal(v2);
  write_bytes(bad, v2);
  CHECK(contains(error_of(bad), "format version 2, this build reads version 1"));

  // A shape that disagrees with the bytes: [2, 3] float32 claims 24 bytes; make it [2, 5].
  std::vector<unsigned char> shape = good;
  const std::size_t meta_end = metadata_end(good);
  const std::size_t dim = find64(shape, 48, meta_end, 3);  // the first 3 is the kernel's second dim
  put64(shape.data() + dim, 5);
  reseal(shape);
  write_bytes(bad, shape);
  CHECK(contains(error_of(bad), "tensor 'dense/kernel' says 24 bytes, a float32 tensor of shape [2, 5] has 40"));
  // ...and with the byte size forged too, the data itself is too short.
  put64(shape.data() + find64(shape, 48, meta_end, 24), 40);
  reseal(shape);
  write_bytes(bad, shape);
  CHECK(contains(error_of(bad), "tensor 'dense/kernel' holds 24 bytes of data, a float32 tensor of shape [2, 5] has 40"));

  // A negative dimension.
  std::vector<unsigned char> negative = good;
  put64(negative.data() + find64(negative, 48, meta_end, 3), static_cast<std::uint64_t>(-3));
  reseal(negative);
  write_bytes(bad, negative);
  CHECK(contains(error_of(bad), "tensor 'dense/kernel' has an invalid shape [2, -3]"));

  // A segment table that does not add up.
  std::vector<unsigned char> table = good;
  put64(table.data() + 40, le64(table.data() + 40) + (std::uint64_t{1} << 32));  // segment 0 one word longer
  reseal(table);
  write_bytes(bad, table);
  CHECK(contains(error_of(bad), "corrupt header: its segments add up to"));

  // A root pointer far outside the message: Cap'n Proto's own error, turned into ours.
  std::vector<unsigned char> forged(checkpoint_preamble_bytes + 16, 0);
  std::memcpy(forged.data(), checkpoint_magic, 8);
  forged[8] = 1;
  put64(forged.data() + 16, 16);
  forged[44] = 1;                                             // one segment of one word
  put64(forged.data() + 48, (std::uint64_t{1} << 32) | 0x7ffffffcULL);  // struct pointer, huge offset
  reseal(forged);
  write_bytes(bad, forged);
  CHECK(contains(error_of(bad), "checkpoint " + bad + ": malformed Cap'n Proto message:"));
}

TEST_CASE("an empty tensor whose other dimensions are huge round-trips, an overflowing shape is refused") {
  temp_dir dir;
  const std::string path = dir.file("e.ckpt");
  const std::int64_t big = std::int64_t{1} << 40;
  const std::vector<float> none;
  write_checkpoint_file(path, 1, {tensor_of("empty", scalar_type::f32, {big, 0, big}, none)});
  const checkpoint_contents c = read_checkpoint_file(path);
  REQUIRE(c.find("empty") != nullptr);
  CHECK(c.find("empty")->shape == std::vector<std::int64_t>{big, 0, big});
  CHECK(c.find("empty")->nbytes == 0);

  // A file whose shape multiplies past 64 bits: [2, 3] forged into [2, 2^62] (2^63 elements).
  small_file().write(path);
  std::vector<unsigned char> f = read_bytes(path);
  put64(f.data() + find64(f, 48, metadata_end(f), 3), std::uint64_t{1} << 62);
  reseal(f);
  write_bytes(path, f);
  CHECK(contains(error_of(path), "tensor 'dense/kernel' has an invalid shape [2, 4611686018427387904]"));
}

TEST_CASE("a long tensor name is echoed once, cut short") {
  temp_dir dir;
  const std::string path = dir.file("n.ckpt");
  std::vector<float> v{1, 2, 3};
  const std::string name(100'000, 'n');
  std::string msg;
  try {
    write_checkpoint_file(path, 0, {tensor_of(name, scalar_type::f32, {2, 2}, v)});
  } catch (const std::invalid_argument& e) {
    msg = e.what();
  }
  CHECK(contains(msg, "tensor '" + std::string(64, 'n') +
                          "...' (100000 bytes) has 12 bytes, a float32 tensor of shape [2, 2] has 16"));
  CHECK(msg.size() < 300);
}

}  // namespace TROUPE_TEST_FILE
