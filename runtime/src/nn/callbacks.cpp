#include "troupe/nn/callbacks.hpp"

#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "troupe/base/parse_number.hpp"
#include "troupe/checkpoint.hpp"
#include "troupe/nn/model.hpp"

namespace troupe::nn {

namespace {

// Keras's "auto": the direction in which the monitored value improves.
bool maximize_for(const std::string& op, const std::string& monitor, const std::string& mode) {
  if (mode == "max") return true;
  if (mode == "min") return false;
  if (mode != "auto") {
    throw std::invalid_argument(op + ": mode \"" + mode + "\" (expected \"auto\", \"min\" or \"max\")");
  }
  return monitor.find("acc") != std::string::npos || monitor.rfind("fmeasure", 0) == 0 ||
         monitor.find("auc") != std::string::npos;
}

// "nan", "inf" or "-inf" (printf's "-nan" says nothing more).
std::string non_finite_name(double x) {
  if (std::isnan(x)) return "nan";
  return x > 0 ? "inf" : "-inf";
}

bool chief(const Callback& c) { return c.params().worker == 0; }

std::string keys_of(const Logs& logs) {
  std::string out;
  for (const auto& [name, value] : logs) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// Keras's filepath.format(epoch=..., **logs): "{key}" or "{key:spec}" with a printf spec such
// as "03d" or ".4f".
// With check_keys false only the pattern's form is checked (at construction, before any logs).
std::string format_path(const std::string& pattern, int epoch, std::int64_t step, std::int64_t batch,
                        const Logs& logs, bool check_keys = true) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size();) {
    if (pattern[i] != '{') {
      out += pattern[i++];
      continue;
    }
    const std::size_t close = pattern.find('}', i);
    if (close == std::string::npos) {
      throw std::invalid_argument("ModelCheckpoint: filepath \"" + pattern + "\" has a '{' without '}'");
    }
    const std::string field = pattern.substr(i + 1, close - i - 1);
    const std::size_t colon = field.find(':');
    const std::string key = field.substr(0, colon);
    const std::string spec = colon == std::string::npos ? "" : field.substr(colon + 1);
    if (spec.find_first_not_of("0123456789.+- #dfegi") != std::string::npos) {
      throw std::invalid_argument("ModelCheckpoint: format \"{" + field + "}\" in the filepath (expected a spec such as 03d or .4f)");
    }
    char buffer[128];
    if (key == "epoch" || key == "step" || key == "batch") {
      const long long v = key == "epoch" ? epoch + 1 : key == "step" ? step : batch;
      std::string s = spec.empty() ? "d" : spec;
      if (s.back() != 'd' && s.back() != 'i') s += "d";
      s.pop_back();
      std::snprintf(buffer, sizeof buffer, ("%" + s + "lld").c_str(), v);
    } else {
      const auto it = logs.find(key);
      if (it == logs.end() && !check_keys) {
        i = close + 1;
        continue;
      }
      if (it == logs.end()) {
        throw std::invalid_argument("ModelCheckpoint: the filepath names \"" + key + "\", which is not in the logs (" +
                                    keys_of(logs) + ", epoch, step, batch)");
      }
      std::string s = spec.empty() ? "g" : spec;
      if (s.back() == 'd' || s.back() == 'i') s.back() = 'f';
      if (s.back() != 'f' && s.back() != 'e' && s.back() != 'g') s += "f";
      std::snprintf(buffer, sizeof buffer, ("%" + s).c_str(), it->second);
    }
    out += buffer;
    i = close + 1;
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
EarlyStopping::EarlyStopping(std::string monitor, double min_delta, int patience, int verbose, std::string mode,
                             std::optional<double> baseline, bool restore_best_weights, int start_from_epoch)
    : monitor_(std::move(monitor)),
      min_delta_(min_delta),
      patience_(patience),
      verbose_(verbose),
      maximize_(maximize_for("EarlyStopping", monitor_, mode)),
      baseline_(baseline),
      restore_best_weights_(restore_best_weights),
      start_from_epoch_(start_from_epoch) {
  if (min_delta < 0 || !std::isfinite(min_delta)) {
    throw std::invalid_argument("EarlyStopping: min_delta " + std::to_string(min_delta) + " (expected >= 0)");
  }
  if (patience < 0) throw std::invalid_argument("EarlyStopping: patience " + std::to_string(patience) + " (expected >= 0)");
  if (start_from_epoch < 0) {
    throw std::invalid_argument("EarlyStopping: start_from_epoch " + std::to_string(start_from_epoch) + " (expected >= 0)");
  }
}

bool EarlyStopping::is_improvement(double value, double reference) const {
  return maximize_ ? value - min_delta_ > reference : value + min_delta_ < reference;
}

void EarlyStopping::on_train_begin(Logs&) {
  wait_ = 0;
  stopped_epoch_ = 0;
  best_epoch_ = 0;
  best_ = maximize_ ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  best_weights_.clear();
}

void EarlyStopping::on_epoch_end(int epoch, Logs& logs) {
  const auto it = logs.find(monitor_);
  if (it == logs.end()) {
    if (chief(*this)) {
      std::cerr << "EarlyStopping: the metric \"" << monitor_ << "\" is not in the logs (" << keys_of(logs)
                << "): early stopping is not conditioned on it\n";
    }
    return;
  }
  if (epoch < start_from_epoch_) return;
  const double current = it->second;
  // Keras's get_weights: the non-trainable variables too (BatchNormalization's moving statistics).
  std::vector<Variable> variables = model().trainable_variables();
  for (const Variable& v : model().layers().non_trainable_variables()) variables.push_back(v);
  if (restore_best_weights_ && best_weights_.empty()) {
    for (const Variable& v : variables) best_weights_.push_back(v.value());
  }
  ++wait_;
  if (is_improvement(current, best_)) {
    best_ = current;
    best_epoch_ = epoch;
    if (restore_best_weights_) {
      best_weights_.clear();
      for (const Variable& v : variables) best_weights_.push_back(v.value());
    }
    if (!baseline_ || is_improvement(current, *baseline_)) {
      wait_ = 0;
      return;
    }
  }
  if (wait_ >= patience_ && epoch > 0) {
    stopped_epoch_ = epoch;
    std::ostringstream reason;
    reason << "EarlyStopping: " << monitor_ << " did not improve for " << wait_ << " epoch(s) (best "
           << best_ << " at epoch " << best_epoch_ + 1 << ")";
    model().control().stop_training(reason.str());
    if (restore_best_weights_ && !best_weights_.empty()) {
      if (verbose_ > 0 && chief(*this)) {
        std::cerr << "Restoring model weights from the end of the best epoch: " << best_epoch_ + 1 << ".\n";
      }
      for (std::size_t i = 0; i < variables.size(); ++i) variables[i].assign(best_weights_[i]);
    }
  }
}

void EarlyStopping::on_train_end(Logs&) {
  if (stopped_epoch_ > 0 && verbose_ > 0 && chief(*this)) {
    std::cerr << "Epoch " << stopped_epoch_ + 1 << ": early stopping\n";
  }
}

// ---------------------------------------------------------------------------------------------
ModelCheckpoint::ModelCheckpoint(std::string filepath, std::string monitor, int verbose, bool save_best_only,
                                 bool save_weights_only, std::string mode, std::int64_t save_freq,
                                 std::optional<double> initial_value_threshold)
    : filepath_(std::move(filepath)),
      monitor_(std::move(monitor)),
      verbose_(verbose),
      save_best_only_(save_best_only),
      save_weights_only_(save_weights_only),
      maximize_(maximize_for("ModelCheckpoint", monitor_, mode)),
      save_freq_(save_freq),
      best_(initial_value_threshold) {
  if (filepath_.empty()) throw std::invalid_argument("ModelCheckpoint: the filepath is empty");
  if (save_freq < 0) {
    throw std::invalid_argument("ModelCheckpoint: save_freq " + std::to_string(save_freq) +
                                " (expected 0 for every epoch, or a number of steps)");
  }
  format_path(filepath_, 0, 0, 0, Logs{}, false);  // a malformed pattern is an error now, not at the first save
}

void ModelCheckpoint::on_epoch_end(int epoch, Logs& logs) {
  if (save_freq_ == 0) save(epoch, 0, logs, false);
}

void ModelCheckpoint::on_train_batch_end(std::int64_t batch, Logs& logs) {
  if (save_freq_ > 0 && model().control().step() % save_freq_ == 0) save(model().control().epoch(), batch, logs, false);
}

void ModelCheckpoint::on_checkpoint(std::int64_t, Logs& logs) {
  save(model().control().epoch(), 0, logs, true);
}

void ModelCheckpoint::save(int epoch, std::int64_t batch, const Logs& logs, bool requested) {
  const auto loss = logs.find("loss");
  if (loss != logs.end() && !std::isfinite(loss->second)) {
    if (chief(*this)) std::cerr << "ModelCheckpoint: the loss is " << non_finite_name(loss->second) << ": no checkpoint written\n";
    return;
  }
  if (save_best_only_ && !requested) {
    const auto it = logs.find(monitor_);
    if (it == logs.end()) {
      if (chief(*this)) {
        std::cerr << "ModelCheckpoint: can save the best model only with \"" << monitor_ << "\" in the logs ("
                  << keys_of(logs) << "), skipping\n";
      }
      return;
    }
    if (!std::isfinite(it->second)) return;
    const bool better = !best_ || (maximize_ ? it->second > *best_ : it->second < *best_);
    if (!better) {
      if (verbose_ > 0 && chief(*this)) {
        std::cerr << "Epoch " << epoch + 1 << ": " << monitor_ << " did not improve from " << *best_ << "\n";
      }
      return;
    }
    best_ = it->second;
  }
  const std::int64_t step = model().control().step();
  const std::string prefix = format_path(filepath_, epoch, step, batch, logs);
  // A requested checkpoint at a step just saved (save_freq, an epoch's end) is that file.
  if (!saved_.empty() && step == last_step_ && prefix == last_prefix_) return;
  const std::filesystem::path parent = std::filesystem::path(prefix).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  Checkpoint checkpoint(save_weights_only_ ? model().layers().variables() : model().variables());
  checkpoint.set_step(step);
  const std::string file = checkpoint.write(prefix);  // the formatted path itself, as Keras saves it
  saved_.push_back(file);
  last_step_ = step;
  last_prefix_ = prefix;
  if (verbose_ > 0 && chief(*this)) std::cerr << "Epoch " << epoch + 1 << ": saving model to " << file << "\n";
}

// ---------------------------------------------------------------------------------------------
void TerminateOnNaN::on_train_batch_end(std::int64_t batch, Logs& logs) {
  const auto it = logs.find("loss");
  if (it == logs.end() || std::isfinite(it->second)) return;
  const std::int64_t step = model().control().step();
  std::ostringstream reason;
  reason << "TerminateOnNaN: the loss is " << non_finite_name(it->second) << " at step " << step << " (epoch "
         << model().control().epoch() + 1 << ", batch " << batch + 1 << ")";
  if (chief(*this)) std::cerr << reason.str() << ": training stopped, no checkpoint is written after it\n";
  model().control().stop_training(reason.str());
}

// ---------------------------------------------------------------------------------------------
LearningRateScheduler::LearningRateScheduler(std::function<double(int, double)> schedule, int verbose)
    : schedule_(std::move(schedule)), verbose_(verbose) {
  if (!schedule_) throw std::invalid_argument("LearningRateScheduler: the schedule is empty");
}

void LearningRateScheduler::on_epoch_begin(int epoch, Logs&) {
  Optimizer& optimizer = *model().optimizer();
  const double rate = schedule_(epoch, optimizer.learning_rate());
  if (!(rate > 0) || !std::isfinite(rate)) {
    throw std::invalid_argument("LearningRateScheduler: the schedule returned " + std::to_string(rate) +
                                " for epoch " + std::to_string(epoch) + " (expected a finite number > 0)");
  }
  optimizer.set_learning_rate(static_cast<float>(rate));
  if (verbose_ > 0 && chief(*this)) {
    std::cerr << "Epoch " << epoch + 1 << ": LearningRateScheduler setting learning rate to " << rate << ".\n";
  }
}

void LearningRateScheduler::on_epoch_end(int, Logs& logs) {
  logs["learning_rate"] = model().optimizer()->learning_rate();
}

// ---------------------------------------------------------------------------------------------
namespace {
// The signal caught, for the handler to leave and the watcher thread to read: a signal handler
// has no context to reach an object through, so this one flag is the process's.
volatile std::sig_atomic_t caught_signal = 0;

extern "C" void troupe_stop_on_signal(int signal) { caught_signal = signal; }
}  // namespace

struct StopOnSignal::Saved {
  std::vector<struct sigaction> previous;
  bool installed = false;
  std::atomic<int> received{0};
  std::atomic<bool> watching{false};
  std::thread watcher;
};

StopOnSignal::StopOnSignal(std::vector<int> signals) : signals_(std::move(signals)), saved_(std::make_unique<Saved>()) {
  if (signals_.empty()) signals_ = {SIGINT, SIGTERM};
  for (int s : signals_) {
    if (s <= 0 || s >= NSIG || s == SIGKILL || s == SIGSTOP) {
      throw std::invalid_argument("StopOnSignal: signal " + std::to_string(s) + " cannot be caught");
    }
  }
}

StopOnSignal::~StopOnSignal() { restore(); }

int StopOnSignal::received() const noexcept { return saved_->received.load(); }

std::string StopOnSignal::signal_name(int signal) {
  if (signal == SIGINT) return "SIGINT";
  if (signal == SIGTERM) return "SIGTERM";
  if (signal == SIGHUP) return "SIGHUP";
  if (signal == SIGUSR1) return "SIGUSR1";
  if (signal == SIGUSR2) return "SIGUSR2";
  return "signal " + std::to_string(signal);
}

void StopOnSignal::on_train_begin(Logs&) {
  restore();
  caught_signal = 0;
  saved_->received = 0;
  saved_->previous.assign(signals_.size(), {});
  for (std::size_t i = 0; i < signals_.size(); ++i) {
    struct sigaction action {};
    action.sa_handler = troupe_stop_on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESETHAND;  // a second one ends the process as it would without us
    sigaction(signals_[i], &action, &saved_->previous[i]);
  }
  saved_->installed = true;
  // A handler may do next to nothing: this thread turns the flag into requests, which are agreed
  // by every worker (one worker may get the signal) and taken even while training is paused.
  saved_->watching = true;
  TrainingControl& control = model().control();
  const bool chief = params().worker == 0;
  saved_->watcher = std::thread([this, &control, chief] {
    while (saved_->watching.load()) {
      const int signal = caught_signal;
      if (signal != 0) {
        saved_->received = signal;
        if (chief) {
          std::cerr << signal_name(signal) << " after step " << control.step()
                    << ": stopping at the next step boundary (every worker at the same step), saving a checkpoint "
                       "where one is set up ("
                    << signal_name(signal) << " again ends at once)\n";
        }
        control.request_checkpoint();
        control.request_stop("interrupted by " + signal_name(signal));
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
}

void StopOnSignal::on_train_end(Logs&) { restore(); }

void StopOnSignal::restore() {
  if (!saved_) return;
  saved_->watching = false;
  if (saved_->watcher.joinable()) saved_->watcher.join();
  if (!saved_->installed) return;
  for (std::size_t i = 0; i < signals_.size(); ++i) sigaction(signals_[i], &saved_->previous[i], nullptr);
  saved_->installed = false;
}

namespace {

std::string format_ms(double ms) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(ms >= 10 ? 0 : ms >= 1 ? 1 : 3) << ms << "ms";
  return s.str();
}

std::string format_seconds(double seconds) {
  std::ostringstream s;
  if (seconds >= 3600) {
    s << static_cast<long long>(seconds) / 3600 << ":" << std::setw(2) << std::setfill('0')
      << (static_cast<long long>(seconds) / 60) % 60 << ":" << std::setw(2) << static_cast<long long>(seconds) % 60;
  } else if (seconds >= 60) {
    s << static_cast<long long>(seconds) / 60 << ":" << std::setw(2) << std::setfill('0')
      << static_cast<long long>(seconds) % 60;
  } else {
    s << static_cast<long long>(seconds + 0.5) << "s";
  }
  return s.str();
}

std::string format_mean(const std::string& name, double value) {
  std::ostringstream s;
  s << " - " << name << ": " << std::setprecision(4) << std::fixed << value;
  return s.str();
}

constexpr int default_columns = 80;
constexpr int widest_bar = 30;  // Keras's
constexpr int narrowest_bar = 10;

}  // namespace

int ProgbarLogger::terminal_columns(bool standard_output) {
  if (standard_output && isatty(STDOUT_FILENO) == 1) {
    winsize size{};
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  }
  if (const char* columns = std::getenv("COLUMNS")) {
    const std::optional<long long> n = base::parse_int(columns);
    if (n && *n > 0 && *n <= 100000) return static_cast<int>(*n);
  }
  return default_columns;
}

ProgbarLogger::ProgbarLogger(ProgbarOptions options)
    : out_(options.out != nullptr ? options.out : &std::cout),
      terminal_(options.verbose == 1 &&
                (options.terminal ? *options.terminal : options.out == nullptr && isatty(STDOUT_FILENO) == 1)),
      standard_output_(options.out == nullptr),
      fixed_width_(options.width) {
  if (options.width < 0) {
    throw std::invalid_argument("ProgbarLogger: width " + std::to_string(options.width) +
                                " (expected the terminal's columns, or 0 to ask the terminal)");
  }
}

void ProgbarLogger::on_epoch_begin(int epoch, Logs&) {
  epoch_ = epoch;
  steps_ = 0;
  position_ = 0;
  sums_.clear();
  start_ = last_draw_ = std::chrono::steady_clock::now();
  drawn_ = false;
  // Asked at every epoch: a terminal may have been resized.
  width_ = fixed_width_ > 0 ? fixed_width_ : terminal_columns(standard_output_);
  if (terminal_) *out_ << "Epoch " << epoch + 1 << "/" << params().epochs << "\n" << std::flush;
}

// On a terminal: the line redrawn in place, at most every 50 ms.
void ProgbarLogger::on_train_batch_end(std::int64_t batch, Logs& logs) {
  ++steps_;
  position_ = batch + 1;  // a resumed epoch starts inside
  for (const std::string& name : params().metrics) {
    auto it = logs.find(name);
    if (it != logs.end()) sums_[name] += it->second;
  }
  if (!terminal_) return;
  const auto now = std::chrono::steady_clock::now();
  const bool last = params().steps > 0 && position_ >= params().steps;
  if (!last && now - last_draw_ < std::chrono::milliseconds(50) && drawn_) return;
  last_draw_ = now;
  drawn_ = true;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double per_step = elapsed / static_cast<double>(steps_);
  std::vector<std::string> items;
  if (params().steps > 0) {
    items.push_back(" - ETA: " + format_seconds(per_step * static_cast<double>(std::max<std::int64_t>(0, params().steps - position_))));
  } else {
    items.push_back(" - " + format_seconds(elapsed));
  }
  items.push_back(" - " + format_ms(per_step * 1e3) + "/step");
  for (const std::string& name : params().metrics) {
    auto it = sums_.find(name);
    if (it != sums_.end()) items.push_back(format_mean(name, it->second / static_cast<double>(steps_)));
  }
  *out_ << "\r" << bar_line(position_, params().steps, std::move(items), false) << "\x1b[K" << std::flush;
}

void ProgbarLogger::on_epoch_end(int epoch, Logs& logs) {
  if (terminal_) {
    finish_bar(logs);
  } else {
    epoch_line(epoch, logs);
  }
}

void ProgbarLogger::on_train_end(Logs&) {
  if (terminal_ && drawn_) *out_ << "\n" << std::flush;
  drawn_ = false;
}

// "12/32 [=========>....................] - ETA: 3s - 12ms/step - loss: 0.1234", in at most
// width_ - 1 columns (a line that reaches the last column wraps on some terminals, and a wrapped
// line is not redrawn in place): the bar narrows from 30 columns to 10, then the last values go,
// then the bar; the end of an epoch (`keep_all`) keeps every value and may wrap.
std::string ProgbarLogger::bar_line(std::int64_t done, std::int64_t total, std::vector<std::string> items,
                                    bool keep_all) const {
  const std::size_t room = static_cast<std::size_t>(std::max(width_ - 1, 1));
  std::string head;
  if (total > 0) {
    const std::string count = std::to_string(total);
    std::string done_text = std::to_string(done);
    if (done_text.size() < count.size()) done_text.insert(0, count.size() - done_text.size(), ' ');
    head = done_text + "/" + count + " ";
  } else {
    head = std::to_string(done) + "/Unknown";
  }
  const auto length = [&] {
    std::size_t n = head.size();
    for (const std::string& item : items) n += item.size();
    return n;
  };
  int bar = 0;
  if (total > 0) {
    for (;;) {
      const std::size_t used = length() + 2;  // the brackets
      bar = used < room ? static_cast<int>(std::min<std::size_t>(widest_bar, room - used)) : 0;
      if (bar >= narrowest_bar || keep_all || items.size() <= 1) break;
      items.pop_back();
    }
  } else {
    while (!keep_all && items.size() > 1 && length() > room) items.pop_back();
  }
  std::string line = head;
  if (bar > 0) {
    const int filled = static_cast<int>(bar * std::min<std::int64_t>(done, total) / total);
    line += '[';
    for (int i = 0; i < bar; ++i) line += i < filled ? '=' : i == filled ? '>' : '.';
    line += ']';
  } else if (total > 0) {
    line.pop_back();  // no room for a bar: no space before the values either
  }
  for (const std::string& item : items) line += item;
  if (!keep_all && line.size() > room) line.resize(room);
  return line;
}

// The end of an epoch on a terminal: the bar, full (or where a stop left it), with the epoch's
// time, its time per step and every value of its logs, in the format it ran in.
void ProgbarLogger::finish_bar(const Logs& logs) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::vector<std::string> items;
  items.push_back(" - " + format_seconds(seconds) +
                  (steps_ > 0 ? " " + format_ms(seconds * 1e3 / static_cast<double>(steps_)) + "/step" : std::string()));
  // Keras's order: the loss and metrics, then the same with "val_".
  for (const char* prefix : {"", "val_"}) {
    for (const std::string& metric : params().metrics) {
      const auto it = logs.find(prefix + metric);
      if (it != logs.end()) items.push_back(format_mean(prefix + metric, it->second));
    }
  }
  const std::int64_t total = params().steps > 0 ? params().steps : position_;
  *out_ << "\r" << bar_line(position_, total, std::move(items), true) << "\x1b[K\n" << std::flush;
  drawn_ = false;
}

// The epoch's line where nothing is redrawn (verbose 2, or not a terminal).
void ProgbarLogger::epoch_line(int epoch, const Logs& logs) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::ostringstream line;
  line << "Epoch " << epoch + 1 << "/" << params().epochs << ": " << steps_ << (steps_ == 1 ? " step" : " steps");
  const auto loss = logs.find("loss");
  if (loss != logs.end()) line << ", loss " << std::setprecision(6) << loss->second;
  // Keras's order: the loss and metrics, then the same with "val_".
  for (const char* prefix : {"", "val_"}) {
    for (const std::string& metric : params().metrics) {
      const std::string name = prefix + metric;
      const auto it = logs.find(name);
      if (name == "loss" || it == logs.end()) continue;
      line << ", " << name << " " << std::setprecision(4) << std::fixed << it->second << std::defaultfloat;
    }
  }
  const auto rate = logs.find("samples_per_second");
  if (rate != logs.end()) line << ", " << std::fixed << std::setprecision(0) << rate->second << " samples/s";
  line << ", ";
  // Epochs of a small set take microseconds: three significant digits in ms, not "0.000 s".
  if (seconds >= 0.1) {
    line << std::fixed << std::setprecision(3) << seconds << " s";
  } else {
    line << std::defaultfloat << std::setprecision(3) << seconds * 1e3 << " ms";
  }
  if (steps_ > 0) line << ", " << format_ms(seconds * 1e3 / static_cast<double>(steps_)) << "/step";
  *out_ << line.str() << "\n" << std::flush;
}

}  // namespace troupe::nn
