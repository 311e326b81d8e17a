#pragma once

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "../common/gpu_nodes.hpp"
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

/// Sets an environment variable (nullopt: unsets it) for the life of the object, then puts back
/// what was there.
class scoped_env {
 public:
  scoped_env(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~scoped_env() {
    if (old_) {
      setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

/// The GPUs the runtime should report on this machine, known without asking CUDA: 0 under
/// TROUPE_FORCE_CPU=1, in a build without CUDA, or without a /dev/nvidia<N> node; otherwise one
/// per /dev/nvidia<N> node. nullopt where CUDA_VISIBLE_DEVICES narrows them (the nodes cannot
/// tell how many it leaves).
inline std::optional<int> expected_gpu_count() {
  const char* force_cpu = std::getenv("TROUPE_FORCE_CPU");
  if (force_cpu != nullptr && std::string(force_cpu) == "1") return 0;
#if defined(TROUPE_TESTS_BUILT_WITH_CUDA) && !TROUPE_TESTS_BUILT_WITH_CUDA
  return 0;
#else
  const int nodes = nvidia_gpu_node_count();
  if (nodes == 0) return 0;
  if (std::getenv("CUDA_VISIBLE_DEVICES") != nullptr) return std::nullopt;
  return nodes;
#endif
}

}  // namespace troupe::testing
