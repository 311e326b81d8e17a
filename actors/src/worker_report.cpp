#include "troupe/actors/worker_report.hpp"

#include <cmath>

#include "troupe/base/quote.hpp"

namespace troupe::actors {

std::optional<std::string> check_worker_report(const worker_report& r) {
  using limits = worker_report_limits;
  if (r.cpu_percent != -1 && !(std::isfinite(r.cpu_percent) && r.cpu_percent >= 0 && r.cpu_percent <= limits::max_cpu_percent)) {
    return "cpu_percent " + std::to_string(r.cpu_percent) + " (expected -1 for unknown, or 0.." +
           std::to_string(static_cast<long long>(limits::max_cpu_percent)) + ")";
  }
  if (r.rss_bytes != -1 && (r.rss_bytes < 0 || r.rss_bytes > limits::max_rss_bytes)) {
    return "rss_bytes " + std::to_string(r.rss_bytes) + " (expected -1 for unknown, or 0.." +
           std::to_string(limits::max_rss_bytes) + ")";
  }
  if (r.lines.size() > limits::max_lines || r.lines.size() > r.lines_total) {
    return std::to_string(r.lines.size()) + " lines of " + std::to_string(r.lines_total) + " (expected at most " +
           std::to_string(limits::max_lines) + ", and no more than the total)";
  }
  for (std::size_t i = 0; i < r.lines.size(); ++i) {
    const std::string& line = r.lines[i];
    if (line.size() > limits::max_line_bytes) {
      return "line " + std::to_string(i) + " of " + std::to_string(line.size()) + " bytes (expected at most " +
             std::to_string(limits::max_line_bytes) + ")";
    }
    if (!base::is_printable_line(line)) {
      return "line " + std::to_string(i) + " " + base::quoted(line) +
             " (expected valid UTF-8 without control characters)";
    }
  }
  return std::nullopt;
}

void log_tail::add(std::string_view line) {
  std::string kept = base::printable_line(line, worker_report_limits::max_line_bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (lines_.size() == worker_report_limits::max_lines) lines_.erase(lines_.begin());
  lines_.push_back(std::move(kept));
  ++total_;
}

std::uint64_t log_tail::total() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return total_;
}

std::vector<std::string> log_tail::lines() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lines_;
}

void log_tail::fill(worker_report& report, std::uint64_t sent) const {
  std::lock_guard<std::mutex> lock(mutex_);
  report.lines_total = total_;
  if (total_ != sent) {
    report.lines = lines_;
  } else {
    report.lines.clear();
  }
}

}  // namespace troupe::actors
