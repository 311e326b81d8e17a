#pragma once

// TensorBoard's event file: a sequence of records, each
//   uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)
// (little-endian), where data is a serialised Event protocol buffer (format/proto). The first
// record is Event{file_version: "brain.Event:2"}; each scalar is an Event with a Summary of one
// simple_value, each text one of a string tensor with the text plugin's metadata. The masked CRC is ((crc >> 15) | (crc << 17)) + 0xa282ead8 of the Castagnoli CRC.

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace troupe::format {

/// The CRC-32C (Castagnoli) of `bytes`.
std::uint32_t crc32c(std::string_view bytes);
/// The masked CRC-32C that TFRecord framing stores.
std::uint32_t masked_crc32c(std::string_view bytes);

/// Appends scalars to one event file. Not thread-safe; write errors throw std::runtime_error
/// naming the file.
class EventFileWriter {
 public:
  /// Creates `directory` if needed and opens a new file in it named like TensorFlow's,
  /// "events.out.tfevents.<seconds>.<host>.<pid>.v2" (with a counter when a file of that name
  /// exists), and writes the file_version record.
  explicit EventFileWriter(const std::string& directory);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  /// One scalar at `step`, with the current wall time.
  void add_scalar(const std::string& tag, std::int64_t step, double value);
  /// One text at `step` (tf.summary.text: a scalar string tensor for TensorBoard's text plugin,
  /// which renders it as Markdown), with the current wall time.
  void add_text(const std::string& tag, std::int64_t step, const std::string& text);
  /// Hands what was written to the operating system.
  void flush();
  /// The file written.
  const std::string& path() const noexcept { return path_; }

 private:
  void write_record(const std::string& data);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace troupe::format
