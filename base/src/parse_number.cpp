#include "troupe/base/parse_number.hpp"

#include <charconv>
#include <system_error>

namespace troupe::base {

namespace {

template <class T>
std::optional<T> whole(std::string_view text) noexcept {
  if (text.empty()) return std::nullopt;
  T value{};
  const char* first = text.data();
  const char* last = text.data() + text.size();
  auto [end, ec] = std::from_chars(first, last, value);
  if (ec != std::errc{} || end != last) return std::nullopt;
  return value;
}

}  // namespace

std::optional<long long> parse_int(std::string_view text) noexcept { return whole<long long>(text); }

std::optional<unsigned long long> parse_uint(std::string_view text) noexcept {
  return whole<unsigned long long>(text);
}

std::optional<double> parse_double(std::string_view text) noexcept {
  // from_chars' general format takes no "0x" prefix, but "0x10" would read as 0 with "x10" left
  // over and so be refused already; a leading '+' is refused by from_chars as well.
  return whole<double>(text);
}

std::optional<unsigned short> parse_port(std::string_view text, bool allow_zero) noexcept {
  auto value = parse_uint(text);
  if (!value || *value > 65535 || (*value == 0 && !allow_zero)) return std::nullopt;
  return static_cast<unsigned short>(*value);
}

}  // namespace troupe::base
