#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../common/temp_dir.hpp"
#include "troupe/format/event_file.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using troupe::format::crc32c;
using troupe::format::EventFileWriter;
using troupe::format::masked_crc32c;

namespace {

std::uint64_t le(const std::string& bytes, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[at + static_cast<std::size_t>(i)]);
  return v;
}

}  // namespace

TEST_CASE("crc32c is the Castagnoli CRC, and the mask is TFRecord's") {
  CHECK(crc32c("") == 0u);
  CHECK(crc32c("123456789") == 0xe3069283u);  // the catalogued check value of CRC-32C
  CHECK(crc32c(std::string(32, '\0')) == 0x8a9136aau);  // RFC 3720 B.4: 32 bytes of zeros
  const std::uint32_t c = crc32c("123456789");
  CHECK(masked_crc32c("123456789") == ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST_CASE("an event file is framed records, the first holding brain.Event:2, one per scalar after it") {
  troupe::testing::temp_dir dir("events");
  std::string path;
  {
    EventFileWriter writer(dir.file("run/train"));
    path = writer.path();
    writer.add_scalar("loss", 1, 0.5);
    writer.add_scalar("loss", 2, 0.0);
    writer.flush();
  }
  CHECK(std::filesystem::path(path).parent_path() == dir.file("run/train"));
  CHECK(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0) == 0);
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  std::size_t at = 0;
  while (at < bytes.size()) {
    REQUIRE(at + 12 <= bytes.size());
    const std::uint64_t length = le(bytes, at, 8);
    CHECK(le(bytes, at + 8, 4) == masked_crc32c(bytes.substr(at, 8)));
    REQUIRE(at + 12 + length + 4 <= bytes.size());
    const std::string data = bytes.substr(at + 12, length);
    CHECK(le(bytes, at + 12 + length, 4) == masked_crc32c(data));
    records.push_back(data);
    at += 12 + length + 4;
  }
  REQUIRE(records.size() == 3);
  CHECK(records[0].find("brain.Event:2") != std::string::npos);
  CHECK(records[1].find("loss") != std::string::npos);
  // The scalar 0.0 is written (a oneof member), not dropped as a proto3 default: field 2 of the
  // value, a fixed32 (tag 0x15), followed by four zero bytes.
  CHECK(records[2].find(std::string("\x15\0\0\0\0", 5)) != std::string::npos);

  // A second writer in the same second gets a file of its own.
  EventFileWriter again(dir.file("run/train"));
  CHECK(again.path() != path);
  CHECK(std::filesystem::exists(path));
}

TEST_CASE("a text is an event with the text plugin's metadata and a scalar string tensor, as tf.summary.text writes it") {
  troupe::testing::temp_dir dir("events-text");
  std::string path;
  const std::string text = std::string("line one\nline two \xc3\xa9", 21);
  {
    EventFileWriter writer(dir.file("run"));
    path = writer.path();
    writer.add_text("sample", 7, text);
    writer.flush();
  }
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  for (std::size_t at = 0; at + 12 <= bytes.size();) {
    const std::uint64_t length = le(bytes, at, 8);
    REQUIRE(at + 12 + length + 4 <= bytes.size());
    records.push_back(bytes.substr(at + 12, length));
    CHECK(le(bytes, at + 12 + length, 4) == masked_crc32c(records.back()));
    at += 12 + length + 4;
  }
  REQUIRE(records.size() == 2);
  const std::string& r = records[1];
  CHECK(r.find(std::string("\x10\x07", 2)) != std::string::npos);  // Event.step = 7 (field 2, varint)
  CHECK(r.find(std::string("\x0a\x06sample", 8)) != std::string::npos);  // Value.tag
  // Value.metadata (field 9) { plugin_data (1) { plugin_name (1): "text" }, data_class (4): 2 }.
  CHECK(r.find(std::string("\x4a\x0a\x0a\x06\x0a\x04text\x20\x02", 12)) != std::string::npos);
  // Value.tensor (field 8) { dtype (1): DT_STRING = 7, tensor_shape (2): {} (a scalar), string_val (8): the text }.
  CHECK(r.find(std::string("\x42\x1b\x08\x07\x12\x00\x42\x15", 8) + text) != std::string::npos);
}

}  // namespace TROUPE_TEST_FILE
