#pragma once
// What every fuzz target checks besides "no crash, no sanitizer report": an error that reaches the
// user is bounded, whatever the input, so echoed input can never flood a log.

#include <cstdio>
#include <cstdlib>
#include <string>

namespace troupe::fuzz {

/// Longest message a refused input may produce.
constexpr std::size_t max_message_bytes = 4096;

/// Aborts (a finding) when `message` is longer than max_message_bytes.
inline void check_message(const std::string& message) {
  if (message.size() > max_message_bytes) {
    std::fprintf(stderr, "message of %zu bytes (at most %zu): %.300s...\n", message.size(), max_message_bytes,
                 message.c_str());
    std::abort();
  }
}

}  // namespace troupe::fuzz
