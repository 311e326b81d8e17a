// Starting a worker: the environment it shares with the others, the command line that runs it
// (here, or through --rsh on its host), and the fork and exec that supervisor.hpp describes.
#include "launch/supervisor_impl.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <array>
#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "launch/cluster.hpp"

extern char** environ;

namespace troupe::launch {

std::vector<std::string> supervisor::command_for(const worker& w, const std::vector<std::string>& env) const {
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

std::string supervisor::shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string supervisor::random_token() {
  std::random_device random;  // /dev/urandom on Linux
  static const char* hex = "0123456789abcdef";
  std::string token;
  for (int i = 0; i < 16; ++i) {
    const auto v = random();
    for (int k = 0; k < 4; ++k) token += hex[(v >> (4 * k)) & 15];
  }
  return token;
}

std::vector<std::string> supervisor::base_environment() const {
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

void supervisor::start_workers() {
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

bool supervisor::start_worker(worker& w, const std::vector<std::string>& env, const std::vector<std::string>& command) {
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
  ++started_this_run_;
  w.streams[0].fd = out[0];
  w.streams[1].fd = err[0];
  for (auto& s : w.streams) set_flags(s.fd, 0, O_NONBLOCK);
  return true;
}

}  // namespace troupe::launch
