#include "launch/supervisor.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>

#include "doctor/doctor.hpp"
#include "launch/cluster.hpp"
#include "launch/elastic_watch.hpp"
#include "launch/host_discovery.hpp"
#include "launch/ps_restart.hpp"
#include "launch/worker_process.hpp"

extern char** environ;

namespace troupe::launch {
namespace {

// How long the pipes of exited workers may stay open (held by a process that left its group).
constexpr auto drain_bound = std::chrono::seconds(2);
// Reads of one pipe per drain when a worker exits, so that a writer that escaped cannot stall us.
constexpr int max_drain_reads = 64;
constexpr std::array<int, 4> handled_signals = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};

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

class supervisor {
 public:
  supervisor(const launch_options& options, const std::vector<std::string>& addresses)
      : options_(options), addresses_(addresses), elastic_(options), ps_restart_(options) {
    workers_.reserve(max_workers);  // discovery adds workers: no reallocation under a reference
    for (std::size_t i = 0; i < addresses.size(); ++i)
      workers_.emplace_back(static_cast<int>(i), addresses[i]);
    if (options.discovery_script) {
      discovery_.emplace(options, static_cast<int>(addresses.size()),
                         [this](const std::string& host) { return add_worker(host); }, say_fn());
    }
  }

  supervisor(const supervisor&) = delete;
  supervisor& operator=(const supervisor&) = delete;

  ~supervisor() {
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

  int run() {
    if (!setup()) return 1;
    if (options_.timeout_s)
      timeout_at_ = clock::now() + std::chrono::duration_cast<clock::duration>(
                                       std::chrono::duration<double>(*options_.timeout_s));
    // --elastic: --max-restarts counts replacements that join the running cluster (replace).
    if (options_.elastic) {
      restart_count_ = 0;
      const int status = run_once();
      if (status != 0) print_verdict();
      return status;
    }
    for (;;) {
      restart_count_ = restarts_used_;
      const int status = run_once();
      if (status == 0) return 0;
      print_verdict();
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
      if (options_.hosts.empty() && !options_.port_base) {  // fresh ports: the old ones may linger
        try {
          addresses_ = worker_addresses(pick_free_ports(static_cast<int>(workers_.size()), std::nullopt));
        } catch (const std::exception& e) {
          say(std::string("cannot restart: ") + e.what());
          return status;
        }
      }
      for (std::size_t i = 0; i < workers_.size(); ++i) workers_[i].address = addresses_[i];
      ++restarts_used_;
    }
  }

 private:
  // One start of every worker, until every one has exited; the status as described in
  // supervisor.hpp.
  int run_once() {
    run_started_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
    exit_code_.reset();
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

  // Waits `seconds` before a restart, still answering signals and the timeout: their exit
  // status when one ends the launch, nullopt when the restart may go ahead.
  std::optional<int> wait_before_restart(double seconds) {
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

  bool setup() {
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

  // --log-dir: DIR/rank-<i>.log for every worker; --ranks: who is shown on the terminal.
  bool open_logs() {
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

  // What runs worker w: the program itself, or with --hosts the remote shell with the host and
  // one command line that sets TF_CONFIG and the launcher's TROUPE_* variables there.
  std::vector<std::string> command_for(const worker& w, const std::vector<std::string>& env) const {
    if (options_.hosts.empty()) return options_.program;
    std::string line = "exec env";
    for (const std::string& e : env) {
      if (e.rfind("TROUPE_", 0) == 0 || e.rfind("TF_CONFIG=", 0) == 0) line += " " + shell_quote(e);
    }
    for (const std::string& a : options_.program) line += " " + shell_quote(a);
    std::vector<std::string> command = options_.rsh;
    command.push_back(w.address.substr(0, w.address.rfind(':')));
    command.push_back(line);
    return command;
  }

  static std::string shell_quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  }

  // A fresh secret for this launch: 32 bytes from the kernel, hex.
  static std::string random_token() {
    std::random_device random;  // /dev/urandom on Linux
    static const char* hex = "0123456789abcdef";
    std::string token;
    for (int i = 0; i < 16; ++i) {
      const auto v = random();
      for (int k = 0; k < 4; ++k) token += hex[(v >> (4 * k)) & 15];
    }
    return token;
  }

  // The environment every worker shares; TF_CONFIG is added per worker. Unless the caller set a
  // TROUPE_CLUSTER_TOKEN, the workers share one made for this launch.
  std::vector<std::string> base_environment() const {
    std::vector<std::string> env;
    bool token = false;
    for (char** e = environ; e && *e; ++e) {
      std::string entry(*e);
      if (entry.rfind("TF_CONFIG=", 0) == 0 || entry.rfind("TROUPE_RESTART_COUNT=", 0) == 0) continue;
      if (entry.rfind("TROUPE_CLUSTER_TOKEN=", 0) == 0) {
        if (entry.size() == std::strlen("TROUPE_CLUSTER_TOKEN=")) continue;  // empty: as if unset
        token = true;
      }
      if (options_.devices_per_worker && entry.rfind("TROUPE_DEVICES_PER_WORKER=", 0) == 0) continue;
      env.push_back(std::move(entry));
    }
    if (options_.devices_per_worker)
      env.push_back("TROUPE_DEVICES_PER_WORKER=" + std::to_string(*options_.devices_per_worker));
    if (!token) env.push_back("TROUPE_CLUSTER_TOKEN=" + launch_token_);
    // With --log-dir, every worker's flight recorder dump goes beside its log, unless the caller
    // chose a directory; either way the verdict after a failed run reads it.
    if (const char* dir = std::getenv("TROUPE_FLIGHT_RECORDER_DIR"); dir != nullptr && *dir != '\0') {
      // the caller's, passed on above
    } else if (options_.log_dir) {
      env.push_back("TROUPE_FLIGHT_RECORDER_DIR=" + *options_.log_dir);
    }
    env.push_back("TROUPE_RESTART_COUNT=" + std::to_string(restart_count_));
    ps_restart_.environment(env);
    if (options_.elastic) {
      env.push_back("TROUPE_ELASTIC=1");
      if (options_.min_workers) env.push_back("TROUPE_MIN_WORKERS=" + std::to_string(*options_.min_workers));
      if (options_.max_workers) env.push_back("TROUPE_MAX_WORKERS=" + std::to_string(*options_.max_workers));
    }
    return env;
  }

  void start_workers() {
    launch_token_ = random_token();  // this run's; a replacement (--elastic) gets the same
    std::vector<std::string> env = base_environment();
    for (auto& w : workers_) {
      env.push_back("TF_CONFIG=" + tf_config_json(addresses_, w.rank, options_.chief, options_.ps));
      bool started = start_worker(w, env, command_for(w, env));
      env.pop_back();
      if (!started) {
        begin_stop(SIGTERM);
        return;
      }
    }
  }

  // Forks and execs one worker; false (with exit_code_ set and a message) when it did not start.
  bool start_worker(worker& w, const std::vector<std::string>& env, const std::vector<std::string>& command) {
    std::array<int, 2> out{-1, -1}, err{-1, -1}, status{-1, -1};
    auto fail = [&](const std::string& what) {
      say("cannot start worker " + std::to_string(w.rank) + ": " + what + ": " + std::strerror(errno));
      for (int* fd : {&out[0], &out[1], &err[0], &err[1], &status[0], &status[1]}) close_fd(*fd);
      exit_code_ = exit_code_.value_or(1);
      start_failed_ = true;
      return false;
    };
    if (!make_pipe(out) || !make_pipe(err) || !make_pipe(status)) return fail("pipe");

    // Everything the child needs is built before fork.
    std::vector<char*> argv;
    for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);

    // Blocked across fork so that the child never runs the launcher's handlers.
    sigset_t block, old_mask;
    sigemptyset(&block);
    for (int s : handled_signals) sigaddset(&block, s);
    ::sigprocmask(SIG_BLOCK, &block, &old_mask);
    pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      for (int s : handled_signals) ::sigaction(s, &dfl, nullptr);
      ::sigaction(SIGPIPE, &dfl, nullptr);
#ifdef __linux__
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl
#endif
      ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
      ::dup2(devnull_, STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      environ = envp.data();
      ::execvp(argv[0], argv.data());
      int exec_errno = errno;
      ssize_t ignored = ::write(status[1], &exec_errno, sizeof exec_errno);
      (void)ignored;
      ::_exit(127);
    }
    int fork_errno = errno;
    if (pid > 0) ::setpgid(pid, pid);  // also here: a kill may come before the child runs
    ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    if (pid < 0) {
      errno = fork_errno;
      return fail("fork");
    }
    close_fd(out[1]);
    close_fd(err[1]);
    close_fd(status[1]);

    // EOF: exec worked and closed the pipe. Four bytes: exec's errno.
    int exec_errno = 0;
    ssize_t n;
    while ((n = ::read(status[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
    }
    close_fd(status[0]);
    if (n == static_cast<ssize_t>(sizeof exec_errno)) {
      int ignored;
      while (::waitpid(pid, &ignored, 0) < 0 && errno == EINTR) {
      }
      close_fd(out[0]);
      close_fd(err[0]);
      const std::string& program = command[0];
      std::string why = std::strerror(exec_errno);
      if (exec_errno == ENOENT && program.find('/') == std::string::npos) why = "command not found in PATH";
      say("cannot execute '" + program + "': " + why);
      exit_code_ = exit_code_.value_or(127);
      start_failed_ = true;
      return false;
    }

    w.pid = pid;
    w.running = true;
    w.streams[0].fd = out[0];
    w.streams[1].fd = err[0];
    for (auto& s : w.streams) set_flags(s.fd, 0, O_NONBLOCK);
    return true;
  }

  void wait_for_events(clock::time_point now) {
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

  void handle_signals() {
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

  void reap() {
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
      // A joiner (added by discovery, or a replacement) that fails while the chief still runs
      // may have been refused because the chief's fit just ended, its exit on the way: its
      // verdict waits for the chief's, at most --grace seconds.
      if (!succeeded && !stopping_ && joiner(w.rank) && !chief_finished_ && chief_running()) {
        held_.push_back({w.rank, status, now_plus(options_.grace_s)});
        continue;
      }
      judge(w, status);
    }
    settle_held();
  }

  // An exit that is not a removal, as the run takes it.
  void judge(worker& w, int status) {
    if (discovery_ && discovery_->late(w, status, chief_finished_)) return;
    if (elastic_.late(w, status, chief_finished_, say_fn())) return;
    training_over_ = training_over_ || (WIFEXITED(status) && WEXITSTATUS(status) == 0);
    chief_finished_ = chief_finished_ || (w.rank == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (on_exit(w, status)) replace(w);
  }

  // The joiners' failures held for the chief's exit: late once it finished the training; a
  // failure as any once it failed, or when --grace ran out while it still runs.
  void settle_held() {
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

  bool joiner(int rank) const { return (discovery_ && discovery_->added(rank)) || elastic_.replacement(rank); }
  bool chief_running() const { return !workers_.empty() && workers_[0].running; }
  static clock::time_point now_plus(double seconds) {
    return clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
  }

  // --elastic with --max-restarts: a lost worker's place is taken by a new process that joins the
  // running cluster, while replacements are left (elastic_watch). Not once training is over (a
  // worker finished): there is no step boundary left to join at.
  void replace(worker& w) {
    if (stopping_) return;
    if (training_over_) {
      say("not starting a replacement for worker " + std::to_string(w.rank) +
          ": a worker finished the training already");
      return;
    }
    auto env = elastic_.replacement_env(w, base_environment(), addresses_, say_fn());
    if (!env) return;
    for (auto& s : w.streams) close_stream(s);
    if (!start_worker(w, *env, command_for(w, *env))) begin_stop(SIGTERM);
  }

  // --host-discovery-script: its thread starts once the first workers run.
  void start_discovery() {
    try {
      discovery_->start();
    } catch (const std::exception& e) {
      say(e.what());
      exit_code_ = exit_code_.value_or(1);
      begin_stop(SIGTERM);
    }
  }

  // --host-discovery-script: a new worker on `host` (this machine), the next rank on a fresh port
  // (--port-base: the rank's port), which joins the running cluster (TROUPE_JOIN=1). Its rank, or
  // nullopt when it could not start (said).
  std::optional<int> add_worker(const std::string& host) {
    const int rank = static_cast<int>(workers_.size());
    if (rank >= max_workers) {
      say("host discovery: cannot add a worker on " + host + ": the launcher starts at most " + std::to_string(max_workers));
      return std::nullopt;
    }
    std::vector<std::string> address;
    try {
      address = worker_addresses(pick_free_ports(1, options_.port_base ? std::optional<int>(*options_.port_base + rank) : std::nullopt));
    } catch (const std::exception& e) {
      say("host discovery: cannot add a worker on " + host + ": " + e.what());
      return std::nullopt;
    }
    addresses_.push_back(address[0]);
    worker& w = workers_.emplace_back(rank, address[0]);
    const bool show = options_.ranks.empty() || std::find(options_.ranks.begin(), options_.ranks.end(), rank) != options_.ranks.end();
    for (auto& s : w.streams) s.show = show;
    if (options_.log_dir) {
      const std::string path = *options_.log_dir + "/rank-" + std::to_string(rank) + ".log";
      w.log_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (w.log_fd < 0) say("--log-dir: cannot write " + path + ": " + std::strerror(errno) + "; its output is not logged");
      for (auto& s : w.streams) s.log_fd = w.log_fd;
    }
    std::vector<std::string> env = base_environment();
    env.push_back("TROUPE_JOIN=1");
    env.push_back("TF_CONFIG=" + tf_config_json(addresses_, rank, options_.chief, options_.ps));
    say("host discovery: starting worker " + std::to_string(rank) + " on " + host + " (" + address[0] +
        "); it joins the running cluster");
    const std::optional<int> code = exit_code_;
    const bool start_failed = start_failed_;
    if (!start_worker(w, env, command_for(w, env))) {
      exit_code_ = code;  // a worker that did not start is no failure of the run
      start_failed_ = start_failed;
      close_fd(w.log_fd);
      workers_.pop_back();  // nothing refers to it: its slot stays free
      addresses_.pop_back();
      return std::nullopt;
    }
    return rank;
  }

  // --max-restarts with --ps: a lost ps task, once its backoff is over, starts again alone on its
  // same address, with the same environment (ps_restart).
  void restart_ps(int rank) {
    worker& w = workers_[static_cast<std::size_t>(rank)];
    if (stopping_ || w.running) return;
    for (auto& s : w.streams) close_stream(s);
    std::vector<std::string> env = base_environment();
    env.push_back("TF_CONFIG=" + tf_config_json(addresses_, w.rank, options_.chief, options_.ps));
    if (!start_worker(w, env, command_for(w, env))) {
      begin_stop(SIGTERM);
      return;
    }
    say(w.describe() + " started again");
  }

  // Whether the worker was dropped by an elastic cluster that goes on (its place may be taken).
  bool on_exit(const worker& w, int status) {
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

  void check_timers(clock::time_point now) {
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

  // Sends `sig` to every running worker's group and arms the grace period before SIGKILL.
  void begin_stop(int sig) {
    if (!stopping_) stop_signal_ = sig;
    stopping_ = true;
    signal_all(sig);
    if (!kill_at_)
      kill_at_ = clock::now() + std::chrono::duration_cast<clock::duration>(
                                    std::chrono::duration<double>(options_.grace_s));
  }

  void signal_all(int sig) {
    for (auto& w : workers_)
      if (w.running) ::kill(-w.pid, sig);
  }

  // Reads up to `max_reads` chunks (stopping early when the pipe is empty) and passes on the
  // complete lines; closes the stream at EOF.
  void read_stream(output_stream& s, int max_reads) {
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

  void close_stream(output_stream& s) {
    if (s.fd < 0) return;
    const std::string rest = s.lines.finish();
    if (s.show) emit(s.target, rest);
    close_fd(s.fd);
  }

  void emit(int target, const std::string& bytes) {
    if (bytes.empty() || broken_[target]) return;
    if (!write_all(target, bytes.data(), bytes.size())) broken_[target] = true;
  }

  // After a failed run: troupe-doctor's verdict on the dumps this run's workers wrote (into
  // TROUPE_FLIGHT_RECORDER_DIR, or --log-dir), when there are some.
  void print_verdict() {
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

  void say(const std::string& message) {
    emit(STDERR_FILENO, "troupe-launch: " + message + "\n");
  }

  elastic_watch::say_fn say_fn() {
    return [this](const std::string& message) { say(message); };
  }

  int running_count() const {
    return static_cast<int>(std::count_if(workers_.begin(), workers_.end(),
                                          [](const worker& w) { return w.running; }));
  }

  int open_stream_count() const {
    int open = 0;
    for (const auto& w : workers_)
      for (const auto& s : w.streams) open += s.fd >= 0;
    return open;
  }

  const launch_options& options_;
  std::vector<std::string> addresses_;  // changed by a restart (fresh ports)
  std::vector<worker> workers_;
  elastic_watch elastic_;
  std::optional<host_discovery> discovery_;  // --host-discovery-script
  bool training_over_ = false;  // a worker finished (exit 0): discovery adds and removes no more
  bool chief_finished_ = false;  // rank 0 exited 0: a joiner that fails after it came too late
  // A joiner's failure waiting for the chief's exit (reap): its rank, wait status and bound.
  struct held_exit {
    int rank;
    int status;
    clock::time_point until;
  };
  std::vector<held_exit> held_;
  ps_restart ps_restart_;
  int restarts_used_ = 0;  // of --max-restarts: the whole cluster's, and ps tasks' alone

  std::array<int, 2> signal_fds_{-1, -1};
  int devnull_ = -1;
  std::array<struct sigaction, handled_signals.size()> previous_{};
  std::array<bool, handled_signals.size()> installed_{};
  struct sigaction previous_sigpipe_ {};
  bool sigpipe_installed_ = false;
  std::array<bool, 3> broken_{};  // by fd: stdout or stderr of the launcher can no longer be written

  std::optional<int> exit_code_;  // decided by the first failure, signal or timeout
  bool stopping_ = false;
  int stop_signal_ = SIGTERM;
  bool signal_received_ = false;
  bool timed_out_ = false;
  bool start_failed_ = false;
  std::string last_failure_;  // the worker that failed first in the last run, and how
  std::int64_t run_started_ns_ = 0;  // when the current run began (wall clock): its dumps are newer
  int restart_count_ = 0;     // restarts so far: TROUPE_RESTART_COUNT of the workers
  std::string launch_token_;  // the run's TROUPE_CLUSTER_TOKEN when the caller set none
  std::optional<clock::time_point> timeout_at_;
  std::optional<clock::time_point> kill_at_;
  std::optional<clock::time_point> drain_until_;
};

}  // namespace

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
