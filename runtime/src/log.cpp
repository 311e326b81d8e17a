#include "troupe/log.hpp"

#include <cstdlib>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "env.hpp"

namespace troupe {
namespace {

// One sink and one level for the process (see log.hpp for why), behind one mutex: messages are
// rare, so a lock per message costs nothing that matters.
struct log_state {
  std::mutex mutex;
  LogSink sink;
  bool level_set = false;
  LogLevel level = LogLevel::warning;
};

log_state& state() {
  static log_state s;
  return s;
}

LogLevel current_level(log_state& s) {
  if (!s.level_set) {
    s.level = detail::log_level_from_environment();
    s.level_set = true;
  }
  return s.level;
}

}  // namespace

std::string_view log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warning: return "warning";
    case LogLevel::error: return "error";
    case LogLevel::off: return "off";
  }
  return "off";
}

LogLevel parse_log_level(std::string_view name) {
  for (LogLevel l : {LogLevel::debug, LogLevel::info, LogLevel::warning, LogLevel::error, LogLevel::off}) {
    if (name == log_level_name(l)) return l;
  }
  throw std::invalid_argument("log level \"" + std::string(name) +
                              "\" is not one of debug, info, warning, error, off");
}

void set_log_sink(LogSink sink) {
  log_state& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.sink = std::move(sink);
}

void set_log_level(LogLevel level) {
  log_state& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.level = level;
  s.level_set = true;
}

LogLevel log_level() {
  log_state& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return current_level(s);
}

void log(LogLevel level, std::string_view message) {
  if (level == LogLevel::off) return;
  log_state& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (level < current_level(s)) return;
  if (!s.sink) {
    std::cerr << "troupe: " << log_level_name(level) << ": " << message << "\n" << std::flush;
    return;
  }
  try {
    s.sink(level, message);
  } catch (...) {
    // A sink that throws loses its message; troupe's own work goes on.
  }
}

}  // namespace troupe
