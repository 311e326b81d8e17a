#pragma once

// The one way troupe reads a number from text (a command line, an environment variable, a peer's
// address): decimal only, the whole text or nothing. "0x10", "12abc", " 3", "" and a value beyond
// the type's range are all refused (std::nullopt), never cut short or wrapped, so the caller can
// name the text in its own error.

#include <optional>
#include <string_view>

namespace troupe::base {

/// A decimal integer (an optional leading '-'), the whole of `text`.
std::optional<long long> parse_int(std::string_view text) noexcept;

/// A decimal integer without a sign, the whole of `text`.
std::optional<unsigned long long> parse_uint(std::string_view text) noexcept;

/// A decimal floating-point number ("1", "-0.5", "3e-4"; also "inf" and "nan", which the caller
/// may refuse), the whole of `text`. Hexadecimal floats are refused.
std::optional<double> parse_double(std::string_view text) noexcept;

/// A TCP port: 1..65535 (0 too when `allow_zero`, "any free port").
std::optional<unsigned short> parse_port(std::string_view text, bool allow_zero = false) noexcept;

}  // namespace troupe::base
