#include "troupe/base/quote.hpp"

#include <algorithm>

#include <boost/locale/utf.hpp>

namespace troupe::base {
namespace {

using utf8 = boost::locale::utf::utf_traits<char>;
using boost::locale::utf::code_point;

constexpr std::string_view replacement = "\xEF\xBF\xBD";  // U+FFFD
constexpr std::string_view ellipsis = "...";

bool is_control(code_point c) noexcept { return c < 0x20 || (c >= 0x7f && c <= 0x9f); }

// The next character of [p, end): its code point, or illegal/incomplete (p then past one byte).
code_point next(const char*& p, const char* end) noexcept {
  const char* start = p;
  const code_point c = utf8::decode(p, end);
  if (c == boost::locale::utf::illegal || c == boost::locale::utf::incomplete) p = start + 1;
  return c;
}

bool valid(code_point c) noexcept { return c != boost::locale::utf::illegal && c != boost::locale::utf::incomplete; }

}  // namespace

std::string printable_line(std::string_view s, std::size_t max_bytes) {
  max_bytes = std::max(max_bytes, ellipsis.size());
  std::string out;
  out.reserve(std::min(s.size(), max_bytes) + replacement.size());
  const char* p = s.data();
  const char* const end = p + s.size();
  // Sanitized until it is known to be too long (a byte over the bound is enough to tell).
  while (p < end && out.size() <= max_bytes) {
    const char* const start = p;
    const code_point c = next(p, end);
    if (c == '\t') {
      out += ' ';
    } else if (!valid(c) || is_control(c)) {
      out += replacement;
    } else {
      out.append(start, static_cast<std::size_t>(p - start));
    }
  }
  if (out.size() <= max_bytes && p == end) return out;
  // Too long: cut on a character boundary (out is valid UTF-8 now) with room for the ellipsis.
  std::size_t keep = max_bytes - ellipsis.size();
  while (keep > 0 && (static_cast<unsigned char>(out[keep]) & 0xC0) == 0x80) --keep;
  out.resize(keep);
  out += ellipsis;
  return out;
}

bool is_printable_line(std::string_view s) noexcept {
  const char* p = s.data();
  const char* const end = p + s.size();
  while (p < end) {
    const code_point c = next(p, end);
    if (!valid(c) || is_control(c)) return false;
  }
  return true;
}

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
