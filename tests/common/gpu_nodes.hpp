#pragma once

// The NVIDIA device nodes of this machine: whether a GPU is physically there, known without
// asking CUDA, so that a broken CUDA setup (an outdated driver, a runtime newer than the driver)
// can never pass for "no GPU".

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace troupe::testing {

/// Every /dev/nvidia* entry (nvidia0, nvidiactl, nvidia-uvm...), sorted; empty on a machine
/// without the NVIDIA driver's devices.
inline std::vector<std::string> nvidia_device_nodes(const std::filesystem::path& dev = "/dev") {
  std::vector<std::string> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dev, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("nvidia", 0) == 0) out.push_back(it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// The per-GPU nodes only (/dev/nvidia0, /dev/nvidia1...): one per physical GPU.
inline int nvidia_gpu_node_count(const std::filesystem::path& dev = "/dev") {
  int n = 0;
  for (const std::string& node : nvidia_device_nodes(dev)) {
    const std::string name = std::filesystem::path(node).filename().string();
    const std::string suffix = name.substr(6);
    if (!suffix.empty() && std::all_of(suffix.begin(), suffix.end(), [](unsigned char c) { return std::isdigit(c); })) {
      ++n;
    }
  }
  return n;
}

}  // namespace troupe::testing
