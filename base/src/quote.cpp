#include "troupe/base/quote.hpp"

namespace troupe::base {

std::string quoted(std::string_view s, std::size_t max_bytes) {
  const bool cut = s.size() > max_bytes;
  const std::string_view shown = cut ? s.substr(0, max_bytes) : s;
  std::string out;
  out.reserve(shown.size() + 32);
  out += '\'';
  for (const char c : shown) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '\0': out += "\\0"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (u < 0x20 || u == 0x7f) {
          static constexpr char hex[] = "0123456789abcdef";
          out += "\\x";
          out += hex[u >> 4];
          out += hex[u & 0xf];
        } else {
          out += c;
        }
    }
  }
  if (cut) {
    out += "...' (" + std::to_string(s.size()) + " bytes)";
  } else {
    out += '\'';
  }
  return out;
}

}  // namespace troupe::base
