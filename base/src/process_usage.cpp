#include "troupe/base/process_usage.hpp"

#include <unistd.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "troupe/base/parse_number.hpp"

namespace troupe::base {
namespace {

std::string read_file(const char* path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The whitespace-separated fields of `text`.
std::vector<std::string> fields(const std::string& text) {
  std::istringstream in(text);
  return {std::istream_iterator<std::string>(in), std::istream_iterator<std::string>()};
}

}  // namespace

usage_sample process_usage::sample() {
  usage_sample out;
  // statm: size resident shared ... (in pages).
  const std::vector<std::string> statm = fields(read_file("/proc/self/statm"));
  if (statm.size() >= 2) {
    if (const auto pages = base::parse_uint(statm[1])) {
      out.rss_bytes = static_cast<std::int64_t>(*pages) * static_cast<std::int64_t>(sysconf(_SC_PAGESIZE));
    }
  }
  // stat: "pid (comm) state ..."; after the comm's closing parenthesis, utime and stime are the
  // 12th and 13th fields (the 14th and 15th of the line).
  const std::string stat = read_file("/proc/self/stat");
  const std::size_t close = stat.rfind(')');
  if (close == std::string::npos) return out;
  const std::vector<std::string> rest = fields(stat.substr(close + 1));
  if (rest.size() < 13) return out;
  const auto utime = base::parse_uint(rest[11]);
  const auto stime = base::parse_uint(rest[12]);
  if (!utime || !stime) return out;
  const auto ticks = static_cast<std::int64_t>(*utime + *stime);
  const auto now = std::chrono::steady_clock::now();
  const double wall_s = std::chrono::duration<double>(now - last_at_).count();
  // A sample within 200 ms of the last one repeats it: too few clock ticks to tell.
  if (last_ticks_ >= 0 && wall_s < 0.2) {
    out.cpu_percent = last_percent_;
    return out;
  }
  if (last_ticks_ >= 0) {
    last_percent_ = 100.0 * static_cast<double>(ticks - last_ticks_) / static_cast<double>(sysconf(_SC_CLK_TCK)) / wall_s;
  }
  last_ticks_ = ticks;
  last_at_ = now;
  out.cpu_percent = last_percent_;
  return out;
}

}  // namespace troupe::base
