#include "launch/supervisor.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>

#include "doctor/doctor.hpp"
#include "launch/cluster.hpp"
#include "launch/supervisor_impl.hpp"

namespace troupe::launch {
namespace {

// How long the pipes of exited workers may stay open (held by a process that left its group).
constexpr auto drain_bound = std::chrono::seconds(2);
// Reads of one pipe per drain when a worker exits, so that a writer that escaped cannot stall us.
constexpr int max_drain_reads = 64;

// A signal handler can reach nothing but globals: this is the write end of the self-pipe.
int signal_write_fd = -1;

extern "C" void on_signal(int signal_number) {
  int saved_errno = errno;
  auto byte = static_cast<unsigned char>(signal_number);
  // A full pipe already holds a wake-up; the byte can be lost without losing the event for
  // SIGCHLD (every worker is polled). A lost SIGINT/SIGTERM would need 64 KiB of them in a row.
  ssize_t ignored = ::write(signal_write_fd, &byte, 1);
  (void)ignored;
  errno = saved_errno;
}

// Writes everything, waiting while a non-blocking target is full. False on an error (EPIPE:
// the reader went away), after which the caller stops writing there.
bool write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n > 0) {
      data += n;
      size -= static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

bool set_flags(int fd, int fd_flags, int status_flags) {
  return ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | fd_flags) == 0 &&
         ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | status_flags) == 0;
}

// A pipe whose both ends are closed on exec; false with errno set when it cannot be made. Made so
// at once (pipe2): the host discovery thread may fork its script at any moment.
bool make_pipe(std::array<int, 2>& fds) {
  int raw[2];
  if (::pipe2(raw, O_CLOEXEC) != 0) return false;
  fds = {raw[0], raw[1]};
  if (!set_flags(raw[0], FD_CLOEXEC, 0) || !set_flags(raw[1], FD_CLOEXEC, 0)) {
    int err = errno;
    ::close(raw[0]);
    ::close(raw[1]);
    errno = err;
    return false;
  }
  return true;
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

supervisor::supervisor(const launch_options& options, const std::vector<std::string>& addresses)
    : options_(options), addresses_(addresses), elastic_(options), ps_restart_(options) {
  workers_.reserve(max_workers);  // discovery adds workers: no reallocation under a reference
  for (std::size_t i = 0; i < addresses.size(); ++i)
    workers_.emplace_back(static_cast<int>(i), addresses[i]);
  initial_workers_ = workers_.size();
  make_discovery();
}

void supervisor::make_discovery() {
  if (!options_.discovery_script) return;
  discovery_.emplace(options_, static_cast<int>(initial_workers_),
                     [this](const std::string& host) { return add_worker(host); }, say_fn());
}

supervisor::~supervisor() {
  for (std::size_t i = 0; i < handled_signals.size(); ++i)
    if (installed_[i]) ::sigaction(handled_signals[i], &previous_[i], nullptr);
  if (sigpipe_installed_) ::sigaction(SIGPIPE, &previous_sigpipe_, nullptr);
  signal_write_fd = -1;
  close_fd(signal_fds_[0]);
  close_fd(signal_fds_[1]);
  close_fd(devnull_);
  for (auto& w : workers_) {
    for (auto& s : w.streams) close_fd(s.fd);
    close_fd(w.log_fd);
  }
}

int supervisor::run() {
  if (!setup()) return 1;
  if (options_.timeout_s)
    timeout_at_ = clock::now() + std::chrono::duration_cast<clock::duration>(
                                     std::chrono::duration<double>(*options_.timeout_s));
  for (;;) {
    // --elastic: --max-restarts counts replacements that join the running cluster (replace).
    restart_count_ = options_.elastic ? 0 : restarts_used_;
    const int status = run_once();
    if (status == 0) return 0;
    // A worker could not listen on a port picked free (retry_on_fresh_ports said so): the same
    // start again, on fresh ports; no restart of --max-restarts, no wait.
    if (port_taken_ && !signal_received_ && !timed_out_ && !start_failed_) {
      port_taken_ = false;
      if (!pick_fresh_ports()) return status;
      make_discovery();  // no worker was added: its plan starts over with the workers
      continue;
    }
    print_verdict();
    // --elastic: the whole cluster is never started again.
    if (options_.elastic) return status;
    // A signal to the launcher, the timeout, or a program that does not start: restarting
    // would not help, or was not wanted.
    if (signal_received_ || timed_out_ || start_failed_ || options_.max_restarts == 0) return status;
    // Restarts of a ps task alone (ps_restart) count here too.
    const int restarts = restarts_used_;
    if (restarts >= options_.max_restarts) {
      say("giving up after " + std::to_string(restarts) + " restart" + (restarts == 1 ? "" : "s") +
          "; the last failure: " + last_failure_ + " (exit status " + std::to_string(status) + ")");
      return status;
    }
    const double backoff =
        std::min(options_.restart_backoff_s * static_cast<double>(1LL << std::min(restarts, 20)), max_restart_backoff_s);
    say("restarting all " + std::to_string(workers_.size()) + " worker" + (workers_.size() == 1 ? "" : "s") +
        " (restart " + std::to_string(restarts + 1) + " of " + std::to_string(options_.max_restarts) + ") in " +
        seconds_text(backoff) + " s: " + last_failure_);
    if (auto stopped = wait_before_restart(backoff)) return *stopped;
    if (ports_picked() && !pick_fresh_ports()) return status;  // fresh ports: the old ones may linger
    ++restarts_used_;
  }
}

bool supervisor::pick_fresh_ports() {
  if (!ports_picked()) return true;
  try {
    addresses_ = worker_addresses(pick_free_ports(static_cast<int>(workers_.size()), std::nullopt));
  } catch (const std::exception& e) {
    say(std::string("cannot restart: ") + e.what());
    return false;
  }
  for (std::size_t i = 0; i < workers_.size(); ++i) workers_[i].address = addresses_[i];
  return true;
}

bool supervisor::retry_on_fresh_ports(const worker& w) {
  if (!ports_picked() || started_this_run_ != initial_workers_ || workers_.size() != initial_workers_ ||
      port_retries_ >= max_port_retries)
    return false;
  ++port_retries_;
  port_taken_ = true;
  say(w.describe() + " cannot listen on " + w.address + ": another process took the port (exit status " +
      std::to_string(port_in_use_exit_code) + "); starting all " + std::to_string(workers_.size()) + " worker" +
      (workers_.size() == 1 ? "" : "s") + " again on fresh ports (retry " + std::to_string(port_retries_) + " of " +
      std::to_string(max_port_retries) + ")");
  return true;
}

int supervisor::run_once() {
  run_started_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  exit_code_.reset();
  started_this_run_ = 0;
  stopping_ = false;
  kill_at_.reset();
  drain_until_.reset();
  last_failure_.clear();
  ps_restart_.clear();
  held_.clear();
  start_workers();
  if (discovery_ && !stopping_) start_discovery();
  for (;;) {
    reap();
    if (discovery_) discovery_->apply(workers_, !stopping_ && !training_over_ && running_count() > 0);
    auto now = clock::now();
    if (discovery_) discovery_->expire_leaves(workers_, now);
    check_timers(now);
    if (running_count() == 0) {
      if (!drain_until_) drain_until_ = now + drain_bound;
      if (open_stream_count() == 0 || now >= *drain_until_) break;
    }
    wait_for_events(now);
  }
  for (auto& w : workers_)
    for (auto& s : w.streams) close_stream(s);
  return exit_code_.value_or(0);
}

std::optional<int> supervisor::wait_before_restart(double seconds) {
  const auto until = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
  for (;;) {
    auto now = clock::now();
    if (timeout_at_ && now >= *timeout_at_) {
      say("timed out after " + seconds_text(*options_.timeout_s) + " s, before a restart");
      return 124;
    }
    if (now >= until) return std::nullopt;
    auto next = until;
    if (timeout_at_ && *timeout_at_ < next) next = *timeout_at_;
    pollfd p{signal_fds_[0], POLLIN, 0};
    const int timeout_ms = static_cast<int>(
        std::clamp<long long>(std::chrono::ceil<std::chrono::milliseconds>(next - now).count(), 0, 60 * 60 * 1000));
    if (::poll(&p, 1, timeout_ms) <= 0) continue;
    unsigned char buffer[64];
    ssize_t n;
    while ((n = ::read(signal_fds_[0], buffer, sizeof buffer)) > 0 || (n < 0 && errno == EINTR)) {
      for (ssize_t i = 0; i < n; ++i) {
        if (buffer[i] == SIGCHLD) continue;
        say("received " + signal_name(buffer[i]) + " while waiting to restart; not restarting");
        return 128 + buffer[i];
      }
    }
  }
}

bool supervisor::setup() {
  std::array<int, 2> fds;
  if (!make_pipe(fds) || !set_flags(fds[0], 0, O_NONBLOCK) || !set_flags(fds[1], 0, O_NONBLOCK)) {
    say(std::string("cannot create the signal pipe: ") + std::strerror(errno));
    return false;
  }
  signal_fds_ = fds;
  devnull_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull_ < 0) {
    say(std::string("cannot open /dev/null: ") + std::strerror(errno));
    return false;
  }
  if (!open_logs()) return false;
  signal_write_fd = signal_fds_[1];
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (std::size_t i = 0; i < handled_signals.size(); ++i) {
    // --elastic hears of a worker stopped (SIGSTOP) too: one stopped past the heartbeat limit is
    // lost (check_stalls).
    action.sa_flags = handled_signals[i] == SIGCHLD && !options_.elastic ? SA_RESTART | SA_NOCLDSTOP : SA_RESTART;
    installed_[i] = ::sigaction(handled_signals[i], &action, &previous_[i]) == 0;
  }
  // A reader of our output that goes away must not kill the launcher and orphan the workers.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigpipe_installed_ = ::sigaction(SIGPIPE, &ignore, &previous_sigpipe_) == 0;
  return true;
}

bool supervisor::open_logs() {
  for (auto& w : workers_) {
    const bool show = options_.ranks.empty() ||
                      std::find(options_.ranks.begin(), options_.ranks.end(), w.rank) != options_.ranks.end();
    for (auto& s : w.streams) s.show = show;
  }
  if (!options_.log_dir) return true;
  std::error_code ec;
  std::filesystem::create_directories(*options_.log_dir, ec);
  for (auto& w : workers_) {
    const std::string path = *options_.log_dir + "/rank-" + std::to_string(w.rank) + ".log";
    w.log_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w.log_fd < 0) {
      say("--log-dir: cannot write " + path + ": " + std::strerror(errno));
      return false;
    }
    for (auto& s : w.streams) s.log_fd = w.log_fd;
  }
  return true;
}

void supervisor::wait_for_events(clock::time_point now) {
  std::vector<pollfd> fds;
  std::vector<output_stream*> streams;
  fds.push_back({signal_fds_[0], POLLIN, 0});
  // A result of host discovery wakes the loop, which applies it (run_once).
  if (discovery_ && discovery_->wake_fd() >= 0) fds.push_back({discovery_->wake_fd(), POLLIN, 0});
  const std::size_t first_stream = fds.size();
  for (auto& w : workers_)
    for (auto& s : w.streams)
      if (s.fd >= 0) {
        fds.push_back({s.fd, POLLIN, 0});
        streams.push_back(&s);
      }

  std::optional<clock::time_point> next;
  auto consider = [&](const std::optional<clock::time_point>& t) {
    if (t && (!next || *t < *next)) next = t;
  };
  if (!stopping_) consider(timeout_at_);
  consider(kill_at_);
  consider(drain_until_);
  if (!stopping_) consider(elastic_.next_stall_check(workers_));
  if (!stopping_) consider(ps_restart_.next());
  if (discovery_) consider(discovery_->next_leave_deadline(workers_));
  for (const held_exit& h : held_) consider(h.until);
  int timeout_ms = -1;
  if (next)
    timeout_ms = static_cast<int>(std::clamp<long long>(
        std::chrono::ceil<std::chrono::milliseconds>(*next - now).count(), 0, 60 * 60 * 1000));

  int ready = ::poll(fds.data(), static_cast<nfds_t>(fds.size()), timeout_ms);
  if (ready <= 0) return;  // timeout, or EINTR: the loop looks again
  if (fds[0].revents != 0) handle_signals();
  for (std::size_t i = first_stream; i < fds.size(); ++i)
    if (fds[i].revents != 0) read_stream(*streams[i - first_stream], 1);
}

void supervisor::handle_signals() {
  unsigned char buffer[64];
  ssize_t n;
  while ((n = ::read(signal_fds_[0], buffer, sizeof buffer)) > 0 || (n < 0 && errno == EINTR)) {
    for (ssize_t i = 0; i < n; ++i) {
      int sig = buffer[i];
      if (sig == SIGCHLD) continue;  // reap() looks at every worker
      int running = running_count();
      if (!signal_received_) {
        signal_received_ = true;
        say("received " + signal_name(sig) + "; forwarding it to " + std::to_string(running) +
            " running worker" + (running == 1 ? "" : "s"));
        exit_code_ = exit_code_.value_or(128 + sig);
        begin_stop(sig);
      } else {
        say("received " + signal_name(sig) + " again; killing " + std::to_string(running) +
            " running worker" + (running == 1 ? "" : "s"));
        signal_all(SIGKILL);
        kill_at_.reset();
      }
    }
  }
}

void supervisor::reap() {
  for (auto& w : workers_) {
    if (!w.running) continue;
    siginfo_t info{};
    info.si_pid = 0;
    // WNOWAIT: the exited leader stays a zombie, so its pid cannot name another group yet.
    if (::waitid(P_PID, static_cast<id_t>(w.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      if (errno == ECHILD) w.running = false;  // reaped elsewhere; nothing left to wait for
      continue;
    }
    if (info.si_pid == 0) {
      if (options_.elastic) elastic_watch::note_stop(w);
      continue;
    }
    ::kill(-w.pid, SIGKILL);  // whatever the worker left behind in its group
    int status = 0;
    while (::waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
    }
    w.running = false;
    w.stopped_since.reset();
    // Its last words come before the launcher's verdict on it.
    for (auto& s : w.streams) read_stream(s, max_drain_reads);
    if (discovery_ && discovery_->removed(w.rank)) {
      discovery_->left(w, status);
      continue;
    }
    const bool succeeded = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    // A joiner (added by discovery, or a replacement) that fails while the chief still runs may
    // have been refused because the chief's fit just ended, its exit on the way: its verdict
    // waits for the chief's, at most --grace seconds.
    if (!succeeded && !stopping_ && joiner(w.rank) && !chief_finished_ && chief_running()) {
      held_.push_back({w.rank, status, clock::now() + std::chrono::duration_cast<clock::duration>(
                                                          std::chrono::duration<double>(options_.grace_s))});
      continue;
    }
    judge(w, status);
  }
  settle_held();
}

void supervisor::judge(worker& w, int status) {
  if (discovery_ && discovery_->late(w, status, chief_finished_)) return;
  if (elastic_.late(w, status, chief_finished_, say_fn())) return;
  training_over_ = training_over_ || (WIFEXITED(status) && WEXITSTATUS(status) == 0);
  chief_finished_ = chief_finished_ || (w.rank == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (on_exit(w, status)) replace(w);
}

void supervisor::settle_held() {
  const auto now = clock::now();
  std::vector<held_exit> waiting;
  for (const held_exit& h : held_) {
    if (!chief_finished_ && chief_running() && !stopping_ && now < h.until) {
      waiting.push_back(h);
      continue;
    }
    judge(workers_[static_cast<std::size_t>(h.rank)], h.status);
  }
  held_ = std::move(waiting);
}

bool supervisor::joiner(int rank) const {
  return (discovery_ && discovery_->added(rank)) || elastic_.replacement(rank);
}

bool supervisor::chief_running() const { return !workers_.empty() && workers_[0].running; }

// Not once training is over (a worker finished): there is no step boundary left to join at.
void supervisor::replace(worker& w) {
  if (stopping_) return;
  if (training_over_) {
    say("not starting a replacement for worker " + std::to_string(w.rank) + ": a worker finished the training already");
    return;
  }
  auto env = elastic_.replacement_env(w, base_environment(), addresses_, say_fn());
  if (!env) return;
  for (auto& s : w.streams) close_stream(s);
  if (!start_worker(w, *env, command_for(w, *env))) begin_stop(SIGTERM);
}

bool supervisor::on_exit(const worker& w, int status) {
  bool succeeded = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (succeeded) return false;
  if (stopping_) {  // once stopping, exits are what was asked for; a preempted one is told
    if (WIFEXITED(status) && WEXITSTATUS(status) == preemption_exit_code)
      say(w.describe() + " exited with status " + std::to_string(preemption_exit_code) + " (preempted) too");
    return false;
  }
  std::string how;
  int code = 0;
  if (WIFEXITED(status)) {
    code = WEXITSTATUS(status);
    how = "exited with status " + std::to_string(WEXITSTATUS(status));
    if (WEXITSTATUS(status) == preemption_exit_code) how += " (preempted: it saved a checkpoint to restart from)";
    if (WEXITSTATUS(status) == port_in_use_exit_code) {
      if (retry_on_fresh_ports(w)) {
        exit_code_ = code;
        begin_stop(SIGTERM);
        return false;
      }
      how += ": it cannot listen on " + w.address + ", which another process holds";
      if (!ports_picked()) {
        how += " (choose another --port-base than " +
               std::to_string(options_.port_base.value_or(default_hosts_port_base)) + ")";
      } else if (port_retries_ >= max_port_retries) {
        how += " (as on each of " + std::to_string(max_port_retries) + " starts again on fresh ports)";
      }
    }
  } else {
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    code = 128 + sig;
    how = "was killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")";
  }
  bool others = running_count() > 0;
  if (others && code != preemption_exit_code && ps_restart_.takes(w, how, restarts_used_, say_fn())) {
    ++restarts_used_;
    return false;  // started again by check_timers, after the backoff
  }
  if (elastic_.goes_on(w, status, how, running_count(), say_fn())) return true;
  exit_code_ = code;
  last_failure_ = w.describe() + " " + how;
  say(last_failure_ + (others ? "; stopping the others" : ""));
  begin_stop(SIGTERM);
  return false;
}

void supervisor::check_timers(clock::time_point now) {
  if (!stopping_) elastic_.check_stalls(workers_, now, say_fn());
  if (stopping_) ps_restart_.clear();
  for (int rank : ps_restart_.due(now)) restart_ps(rank);
  if (!stopping_ && timeout_at_ && now >= *timeout_at_) {
    int running = running_count();
    say("timed out after " + seconds_text(*options_.timeout_s) + " s; stopping " +
        std::to_string(running) + " running worker" + (running == 1 ? "" : "s"));
    exit_code_ = 124;
    timed_out_ = true;
    begin_stop(SIGTERM);
  }
  if (kill_at_ && now >= *kill_at_) {
    kill_at_.reset();
    for (auto& w : workers_)
      if (w.running) {
        say(w.describe() + " did not stop within " + seconds_text(options_.grace_s) + " s of " +
            signal_name(stop_signal_) + "; sending SIGKILL");
        ::kill(-w.pid, SIGKILL);
      }
  }
}

void supervisor::begin_stop(int sig) {
  if (!stopping_) stop_signal_ = sig;
  stopping_ = true;
  signal_all(sig);
  if (!kill_at_)
    kill_at_ = clock::now() + std::chrono::duration_cast<clock::duration>(
                                  std::chrono::duration<double>(options_.grace_s));
}

void supervisor::signal_all(int sig) {
  for (auto& w : workers_)
    if (w.running) ::kill(-w.pid, sig);
}

void supervisor::read_stream(output_stream& s, int max_reads) {
  char buffer[64 * 1024];
  for (int reads = 0; s.fd >= 0 && reads < max_reads;) {
    ssize_t n = ::read(s.fd, buffer, sizeof buffer);
    if (n > 0) {
      if (s.log_fd >= 0) write_all(s.log_fd, buffer, static_cast<std::size_t>(n));
      const std::string lines = s.lines.feed(buffer, static_cast<std::size_t>(n));
      if (s.show) emit(s.target, lines);
      ++reads;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else {
      close_stream(s);  // EOF, or an error that will not go away
    }
  }
}

void supervisor::close_stream(output_stream& s) {
  if (s.fd < 0) return;
  const std::string rest = s.lines.finish();
  if (s.show) emit(s.target, rest);
  close_fd(s.fd);
}

void supervisor::emit(int target, const std::string& bytes) {
  if (bytes.empty() || broken_[target]) return;
  if (!write_all(target, bytes.data(), bytes.size())) broken_[target] = true;
}

void supervisor::print_verdict() {
  std::string dir;
  if (const char* d = std::getenv("TROUPE_FLIGHT_RECORDER_DIR"); d != nullptr && *d != '\0') {
    dir = d;
  } else if (options_.log_dir) {
    dir = *options_.log_dir;
  } else {
    return;
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return;
  try {
    std::vector<doctor::dump> dumps;
    bool any = false;
    for (const auto& item : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = item.path().filename().string();
      any = any || (name.rfind("flight_recorder.", 0) == 0 && name.size() > 5 && name.substr(name.size() - 5) == ".json");
    }
    if (!any) return;
    for (auto& d : doctor::read_dumps(dir)) {
      if (d.dumped_at_ns >= run_started_ns_) dumps.push_back(std::move(d));  // this run's only
    }
    if (dumps.empty()) return;
    const doctor::diagnosis found = doctor::diagnose(dumps);
    say("the flight recorders' verdict (troupe-doctor " + dir + "):");
    std::istringstream lines(found.text);
    for (std::string line; std::getline(lines, line);) emit(STDERR_FILENO, "troupe-launch:   " + line + "\n");
  } catch (const doctor::dump_error& e) {
    say(std::string("troupe-doctor: ") + e.what());
  }
}

void supervisor::say(const std::string& message) {
  emit(STDERR_FILENO, "troupe-launch: " + message + "\n");
}

elastic_watch::say_fn supervisor::say_fn() {
  return [this](const std::string& message) { say(message); };
}

int supervisor::running_count() const {
  return static_cast<int>(std::count_if(workers_.begin(), workers_.end(),
                                        [](const worker& w) { return w.running; }));
}

int supervisor::open_stream_count() const {
  int open = 0;
  for (const auto& w : workers_)
    for (const auto& s : w.streams) open += s.fd >= 0;
  return open;
}

std::string seconds_text(double seconds) {
  std::ostringstream text;
  text << seconds;
  return text.str();
}

std::string signal_name(int signal_number) {
  switch (signal_number) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGCHLD: return "SIGCHLD";
    case SIGCONT: return "SIGCONT";
    case SIGSTOP: return "SIGSTOP";
    case SIGTSTP: return "SIGTSTP";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
    default: return "signal " + std::to_string(signal_number);
  }
}

int supervise(const launch_options& options, const std::vector<std::string>& addresses) {
  supervisor s(options, addresses);
  return s.run();
}

}  // namespace troupe::launch
