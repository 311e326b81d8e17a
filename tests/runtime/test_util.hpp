#pragma once

#include <functional>
#include <string>
#include <vector>

#include "troupe/troupe.hpp"

namespace troupe::testing {

/// "CPU:0".."CPU:n-1".
inline std::vector<std::string> cpus(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back("CPU:" + std::to_string(i));
  return out;
}

/// The message of what f throws, or "" when it returns.
inline std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace troupe::testing
