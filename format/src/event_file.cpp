#include "troupe/format/event_file.hpp"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include "tensorboard_event.pb.h"

namespace troupe::format {

namespace {

// The reflected Castagnoli polynomial, one table of 256 entries.
constexpr std::uint32_t crc32c_polynomial = 0x82f63b78u;

constexpr std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ crc32c_polynomial : c >> 1;
    table[i] = c;
  }
  return table;
}

constexpr std::array<std::uint32_t, 256> crc_table = make_table();

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

}  // namespace

std::uint32_t crc32c(std::string_view bytes) {
  std::uint32_t c = 0xffffffffu;
  for (unsigned char b : bytes) c = crc_table[(c ^ b) & 0xffu] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

std::uint32_t masked_crc32c(std::string_view bytes) {
  const std::uint32_t c = crc32c(bytes);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventFileWriter::EventFileWriter(const std::string& directory) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) throw std::runtime_error("TensorBoard: cannot create the directory " + directory + ": " + ec.message());
  const auto seconds = static_cast<long long>(now_seconds());
  const std::string base = directory + "/events.out.tfevents." + std::to_string(seconds) + "." + host_name() + "." +
                           std::to_string(static_cast<long long>(getpid()));
  // Two writers of one process in one second (a second fit) get distinct files: "x" opens only
  // a file that does not exist yet.
  for (int n = 0; n < 1000 && file_ == nullptr; ++n) {
    path_ = base + (n == 0 ? "" : "." + std::to_string(n)) + ".v2";
    file_ = std::fopen(path_.c_str(), "wbx");
    if (file_ == nullptr && errno != EEXIST) break;
  }
  if (file_ == nullptr) {
    throw std::runtime_error("TensorBoard: cannot create " + path_ + ": " + std::strerror(errno));
  }
  tensorboard::Event event;
  event.set_wall_time(now_seconds());
  event.set_file_version("brain.Event:2");
  write_record(event.SerializeAsString());
  flush();
}

EventFileWriter::~EventFileWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void EventFileWriter::add_scalar(const std::string& tag, std::int64_t step, double value) {
  tensorboard::Event event;
  event.set_wall_time(now_seconds());
  event.set_step(step);
  tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  write_record(event.SerializeAsString());
}

void EventFileWriter::add_text(const std::string& tag, std::int64_t step, const std::string& text) {
  tensorboard::Event event;
  event.set_wall_time(now_seconds());
  event.set_step(step);
  tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  // What tf.summary.text writes: the text plugin's name (its content, TextPluginData version 0,
  // serialises to nothing) and a scalar DT_STRING tensor.
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  v->mutable_metadata()->set_data_class(tensorboard::SummaryMetadata::DATA_CLASS_TENSOR);
  tensorboard::TensorProto* t = v->mutable_tensor();
  t->set_dtype(tensorboard::DT_STRING);
  t->mutable_tensor_shape();
  t->add_string_val(text);
  write_record(event.SerializeAsString());
}

void EventFileWriter::flush() {
  if (std::fflush(file_) != 0) throw std::runtime_error("TensorBoard: cannot write " + path_ + ": " + std::strerror(errno));
}

void EventFileWriter::write_record(const std::string& data) {
  char header[12];
  const std::uint64_t length = data.size();
  for (int i = 0; i < 8; ++i) header[i] = static_cast<char>((length >> (8 * i)) & 0xffu);
  const std::uint32_t length_crc = masked_crc32c(std::string_view(header, 8));
  for (int i = 0; i < 4; ++i) header[8 + i] = static_cast<char>((length_crc >> (8 * i)) & 0xffu);
  const std::uint32_t data_crc = masked_crc32c(data);
  char footer[4];
  for (int i = 0; i < 4; ++i) footer[i] = static_cast<char>((data_crc >> (8 * i)) & 0xffu);
  if (std::fwrite(header, 1, sizeof header, file_) != sizeof header ||
      std::fwrite(data.data(), 1, data.size(), file_) != data.size() ||
      std::fwrite(footer, 1, sizeof footer, file_) != sizeof footer) {
    throw std::runtime_error("TensorBoard: cannot write " + path_ + ": " + std::strerror(errno));
  }
}

}  // namespace troupe::format
