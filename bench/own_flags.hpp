#pragma once

// The benchmarks' own --troupe_NAME=VALUE flags, taken out of argv before Google Benchmark reads
// the rest.

#include <cstring>
#include <functional>
#include <string>

namespace troupe::bench {

/// Calls take(NAME, VALUE) for every --troupe_NAME=VALUE argument; those for which take returns
/// true are removed from argv, everything else stays in order.
inline void take_own_flags(int& argc, char** argv, const std::function<bool(const std::string&, const char*)>& take) {
  constexpr const char* prefix = "--troupe_";
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    const char* eq = std::strchr(arg, '=');
    const bool ours = std::strncmp(arg, prefix, std::strlen(prefix)) == 0 && eq != nullptr;
    if (ours && take(std::string(arg + std::strlen(prefix), eq), eq + 1)) continue;
    argv[out++] = argv[i];
  }
  argc = out;
}

}  // namespace troupe::bench
