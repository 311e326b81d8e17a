#include "launch/line_prefixer.hpp"

#include <cstring>
#include <utility>

namespace troupe::launch {

line_prefixer::line_prefixer(std::string prefix, std::size_t max_line_bytes)
    : prefix_(std::move(prefix)), max_line_bytes_(max_line_bytes > 0 ? max_line_bytes : 1) {}

std::string line_prefixer::feed(const char* data, std::size_t size) {
  std::string ready;
  std::size_t start = 0;
  while (start < size) {
    const char* newline = static_cast<const char*>(std::memchr(data + start, '\n', size - start));
    std::size_t end = newline ? static_cast<std::size_t>(newline - data) : size;
    // Cut a line that would outgrow the bound; the rest continues as the next line.
    std::size_t room = max_line_bytes_ - partial_.size();
    bool cut = end - start > room || (!newline && end - start == room);
    if (cut) end = start + room;
    partial_.append(data + start, end - start);
    if (newline || cut) {
      ready += prefix_;
      ready += partial_;
      ready += '\n';
      partial_.clear();
      start = (cut ? end : end + 1);
    } else {
      start = end;
    }
  }
  return ready;
}

std::string line_prefixer::finish() {
  if (partial_.empty()) return {};
  std::string line = prefix_ + partial_ + '\n';
  partial_.clear();
  return line;
}

}  // namespace troupe::launch
