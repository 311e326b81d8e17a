// What an application shows and steers through the dashboard beyond fit's own: its controls
// (numbers the page sets, read by the application at its step boundary) and its text summaries.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <string_view>

#include "monitor/monitor_impl.hpp"
#include "troupe/base/quote.hpp"

namespace troupe {
namespace {

bool is_name(const std::string& s, std::size_t max_bytes, std::string_view also) {
  if (s.empty() || s.size() > max_bytes) return false;
  return std::all_of(s.begin(), s.end(), [also](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           also.find(c) != std::string_view::npos;
  });
}

std::string readable(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// A text of several lines for the page: each line as base::printable_line makes it (a "\r\n" ends
// a line as "\n" does), the whole at most max_bytes, ending "..." when cut.
std::string printable_text(std::string_view text, std::size_t max_bytes) {
  static constexpr std::string_view cut = "...";
  std::string out;
  while (true) {
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const std::size_t room = max_bytes - out.size();
    out += base::printable_line(line, room);  // ends "..." when the line did not fit
    if (nl == std::string_view::npos || out.size() + 1 + cut.size() > max_bytes) {
      if (nl != std::string_view::npos && out.size() + cut.size() <= max_bytes) out += cut;
      return out;
    }
    out += '\n';
    text.remove_prefix(nl + 1);
  }
}

}  // namespace

void Monitor::add_control(const MonitorControl& control) {
  if (!is_name(control.name, 32, "")) {
    throw std::invalid_argument("Monitor::add_control: name " + base::quoted(control.name) +
                                " is not 1 to 32 of A-Z a-z 0-9 _");
  }
  if (!std::isfinite(control.min) || !std::isfinite(control.max) || !std::isfinite(control.value) ||
      !(control.min <= control.value && control.value <= control.max)) {
    throw std::invalid_argument("Monitor::add_control: " + control.name + " has value " + readable(control.value) +
                                " and range " + readable(control.min) + ".." + readable(control.max) +
                                " (expected finite numbers with min <= value <= max)");
  }
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mutex);
  for (const Impl::AppControl& c : m.app_controls) {
    if (c.spec.name == control.name) {
      throw std::invalid_argument("Monitor::add_control: a control named " + control.name + " was already added");
    }
  }
  if (m.app_controls.size() >= max_controls) {
    throw std::invalid_argument("Monitor::add_control: " + control.name + " would be control " +
                                std::to_string(max_controls + 1) + " (at most " + std::to_string(max_controls) + ")");
  }
  Impl::AppControl c;
  c.spec = control;
  c.spec.help = base::printable_line(control.help, 256);
  c.value = control.value;
  m.app_controls.push_back(std::move(c));
}

double Monitor::control(const std::string& name) const {
  const Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::string known;
  for (const Impl::AppControl& c : m.app_controls) {
    if (c.spec.name == name) return c.value;
    known += (known.empty() ? "" : ", ") + c.spec.name;
  }
  throw std::out_of_range("Monitor::control: no control named " + base::quoted(name) + " (added: " +
                          (known.empty() ? "none" : known) + ")");
}

void Monitor::publish_text(const std::string& tag, std::int64_t step, const std::string& text) {
  if (!is_name(tag, 64, "./-")) {
    throw std::invalid_argument("Monitor::publish_text: tag " + base::quoted(tag) +
                                " is not 1 to 64 of A-Z a-z 0-9 _ . / -");
  }
  Impl& m = *impl_;
  std::string shown = printable_text(text, max_text_bytes);
  const double time_s = m.seconds_since_start();
  std::lock_guard<std::mutex> lock(m.mutex);
  if (std::find(m.text_tags.begin(), m.text_tags.end(), tag) == m.text_tags.end()) {
    if (m.text_tags.size() >= max_text_tags) {
      throw std::invalid_argument("Monitor::publish_text: tag " + tag + " would be tag " +
                                  std::to_string(max_text_tags + 1) + " (at most " + std::to_string(max_text_tags) +
                                  ")");
    }
    m.text_tags.push_back(tag);
  }
  // The oldest of this tag goes once it has max_texts_per_tag.
  const auto same = std::count_if(m.texts.begin(), m.texts.end(), [&](const Impl::TextRecord& t) { return t.tag == tag; });
  if (static_cast<std::size_t>(same) >= Impl::max_texts_per_tag) {
    m.texts.erase(std::find_if(m.texts.begin(), m.texts.end(), [&](const Impl::TextRecord& t) { return t.tag == tag; }));
  }
  m.texts.push_back({++m.texts_total, tag, step, time_s, std::move(shown)});
}

void Monitor::Impl::apply_controls(std::int64_t step) {
  if (!controls_pending.exchange(false)) return;
  std::vector<std::string> lines;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (AppControl& c : app_controls) {
      if (!c.pending) continue;
      c.value = *c.pending;
      c.pending.reset();
      lines.push_back(c.spec.name + " " + readable(c.value) + " from step " + std::to_string(step + 1));
    }
  }
  for (const std::string& line : lines) {
    say(line);
    mark(step, "control", line);
  }
}

}  // namespace troupe
