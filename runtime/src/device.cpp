#include "troupe/device.hpp"

#include <cctype>
#include <charconv>
#include <stdexcept>
#include <vector>

namespace troupe {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

[[noreturn]] void bad_spec(std::string_view spec, const std::string& why) {
  throw std::invalid_argument("Device::parse: \"" + std::string(spec) + "\": " + why +
                              " (expected \"CPU:0\", \"GPU:1\" or \"/job:worker/replica:0/task:1/device:CPU:0\")");
}

int parse_index(std::string_view spec, std::string_view digits, const char* what) {
  int v = 0;
  auto res = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (digits.empty() || res.ec != std::errc() || res.ptr != digits.data() + digits.size() || v < 0) {
    bad_spec(spec, std::string(what) + " \"" + std::string(digits) + "\" is not a non-negative number");
  }
  return v;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  for (;;) {
    std::size_t pos = s.find(sep, start);
    parts.push_back(s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return parts;
}

}  // namespace

Device Device::parse(std::string_view spec) {
  Device d;
  std::string_view rest = spec;
  bool have_device = false;
  if (!rest.empty() && rest.front() == '/') {
    auto parts = split(rest.substr(1), '/');
    for (std::string_view part : parts) {
      auto colon = part.find(':');
      if (colon == std::string_view::npos) bad_spec(spec, "component \"" + std::string(part) + "\" has no ':'");
      const std::string key = lower(part.substr(0, colon));
      std::string_view value = part.substr(colon + 1);
      if (key == "job") {
        if (value.empty()) bad_spec(spec, "empty job name");
        d.job_ = std::string(value);
      } else if (key == "replica") {
        d.replica_ = parse_index(spec, value, "replica");
      } else if (key == "task") {
        d.task_ = parse_index(spec, value, "task");
      } else if (key == "device") {
        if (have_device) bad_spec(spec, "two device components");
        rest = value;
        have_device = true;
      } else if (key == "cpu" || key == "gpu") {
        if (have_device) bad_spec(spec, "two device components");
        rest = part;
        have_device = true;
      } else {
        bad_spec(spec, "unknown component \"" + key + "\"");
      }
    }
    if (!have_device) bad_spec(spec, "no device component");
  }
  auto colon = rest.find(':');
  if (colon == std::string_view::npos) bad_spec(spec, "no ':' between device type and index");
  const std::string type = lower(rest.substr(0, colon));
  if (type == "cpu") {
    d.type_ = Type::cpu;
  } else if (type == "gpu") {
    d.type_ = Type::gpu;
  } else {
    bad_spec(spec, "unknown device type \"" + std::string(rest.substr(0, colon)) + "\"");
  }
  d.index_ = parse_index(spec, rest.substr(colon + 1), "device index");
  return d;
}

Device Device::with_job(std::string job, int replica, int task) const {
  Device d = *this;
  d.job_ = std::move(job);
  d.replica_ = replica;
  d.task_ = task;
  return d;
}

std::string Device::to_string() const {
  std::string local = std::string(type_ == Type::cpu ? "CPU:" : "GPU:") + std::to_string(index_);
  if (!job_ && !replica_ && !task_) return local;
  std::string out;
  if (job_) out += "/job:" + *job_;
  if (replica_) out += "/replica:" + std::to_string(*replica_);
  if (task_) out += "/task:" + std::to_string(*task_);
  return out + "/device:" + local;
}

}  // namespace troupe
