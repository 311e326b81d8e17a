#pragma once
// Turns the bytes of one output stream into whole lines, each with a prefix.

#include <cstddef>
#include <string>

namespace troupe::launch {

/// Splits one stream's bytes into lines and prefixes each. A partial line is held until its
/// newline arrives or finish() is called, so lines from several workers never mix. A line longer
/// than `max_line_bytes` is passed on in pieces of that size, each as its own line, so memory
/// stays bounded whatever a worker writes.
class line_prefixer {
 public:
  /// Default bound on a held partial line.
  static constexpr std::size_t default_max_line_bytes = 64 * 1024;

  /// `prefix` goes before every line, e.g. "[rank 3] ".
  explicit line_prefixer(std::string prefix, std::size_t max_line_bytes = default_max_line_bytes);

  /// Takes `size` more bytes; returns the lines they complete, each prefixed and newline-ended.
  std::string feed(const char* data, std::size_t size);

  /// The held partial line, prefixed and given a newline; empty when nothing is held.
  std::string finish();

  /// Bytes held for a line not yet complete.
  std::size_t held_bytes() const { return partial_.size(); }

 private:
  std::string prefix_;
  std::size_t max_line_bytes_;
  std::string partial_;
};

}  // namespace troupe::launch
