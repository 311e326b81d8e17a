#pragma once

// Text that came from a user or a peer, made safe to put in a message: quoted, its control bytes
// escaped (a NUL shows as \0), and cut short, so a 120 KB host name cannot turn one error into a
// 240 KB one.

#include <cstddef>
#include <string>
#include <string_view>

namespace troupe::base {

/// Bytes of the input kept by quoted() unless told otherwise.
constexpr std::size_t quoted_max_bytes = 64;

/// `s` between single quotes, control bytes escaped (\0, \n, \t, \xNN); past `max_bytes` bytes of
/// input it stops and says how long the whole was: 'aaaa...' (120000 bytes).
std::string quoted(std::string_view s, std::size_t max_bytes = quoted_max_bytes);

/// `s` as one line of text for a page or a peer: valid UTF-8 in which every byte that is not part
/// of a valid sequence, and every control character (C0, DEL, C1), is U+FFFD, a tab a space; past
/// `max_bytes` bytes it is cut on a character boundary and ends "...", the whole at most
/// `max_bytes` (at least 3).
std::string printable_line(std::string_view s, std::size_t max_bytes);

/// Whether `s` is such a line: valid UTF-8 (no overlong form, no surrogate) without a control
/// character. (Its length is the caller's to check.)
bool is_printable_line(std::string_view s) noexcept;

/// True when `s` holds a NUL byte (which C APIs would silently cut at).
constexpr bool has_nul(std::string_view s) noexcept { return s.find('\0') != std::string_view::npos; }

}  // namespace troupe::base
