#include "launch/host_discovery.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "launch/cluster.hpp"
#include "launch/supervisor.hpp"
#include "launch/supervisor_impl.hpp"
#include "troupe/base/parse_number.hpp"

extern char** environ;

namespace troupe::launch {
namespace {

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// A line as a message quotes it: printable ASCII, cut at 64 bytes.
std::string shown(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, 64)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return "'" + out + (s.size() > 64 ? "...'" : "'");
}

bool host_name_ok(const std::string& h) {
  if (h.empty() || h.size() > 253) return false;
  return std::all_of(h.begin(), h.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
           c == '_';
  });
}

std::string this_host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "";
  return name;
}

bool set_cloexec_nonblock(int fd) {
  return ::fcntl(fd, F_SETFD, FD_CLOEXEC) == 0 && ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK) == 0;
}

}  // namespace

bool is_local_host(const std::string& host) {
  if (host == "127.0.0.1" || host == "localhost") return true;
  const std::string me = this_host_name();
  return !me.empty() && host == me;
}

std::string canonical_host(const std::string& host) { return is_local_host(host) ? local_host : host; }

discovered_hosts parse_discovery_output(const std::string& text, int max_total) {
  discovered_hosts found;
  std::map<std::string, int> line_of;  // canonical host -> the line that named it
  std::istringstream in(text);
  int number = 0;
  for (std::string raw; std::getline(in, raw);) {
    ++number;
    std::string line = raw;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    line = trimmed(line);
    if (line.empty()) continue;
    const std::string where = "line " + std::to_string(number) + " (" + shown(raw) + ")";
    std::string host = line;
    int slots = 1;
    if (auto colon = line.find(':'); colon != std::string::npos) {
      host = line.substr(0, colon);
      const std::optional<long long> n = base::parse_int(line.substr(colon + 1));
      if (!n || *n < 1 || *n > max_workers) {
        throw discovery_error(where + ": expected host:slots with slots 1.." + std::to_string(max_workers));
      }
      slots = static_cast<int>(*n);
    }
    if (!host_name_ok(host)) throw discovery_error(where + ": expected host or host:slots (a host name or IPv4 address)");
    if (!is_local_host(host)) {
      throw discovery_error(where + ": '" + host +
                            "' is not this machine; discovered workers start on 127.0.0.1 only (a host elsewhere "
                            "would need --rsh, which host discovery does not support)");
    }
    const std::string name = canonical_host(host);
    if (auto seen = line_of.find(name); seen != line_of.end()) {
      throw discovery_error(where + ": '" + host + "' is " + name + " again, named on line " +
                            std::to_string(seen->second) + " (give each host once)");
    }
    line_of[name] = number;
    found.hosts.push_back({name, slots});
    found.total += slots;
  }
  if (found.hosts.empty()) throw discovery_error("the output names no host (expected host or host:slots lines)");
  if (found.total > max_total) {
    found.note = "the hosts list " + std::to_string(found.total) + " slots; capped at --max " +
                 std::to_string(max_total);
    int over = found.total - max_total;
    for (auto h = found.hosts.rbegin(); h != found.hosts.rend() && over > 0; ++h) {
      const int cut = std::min(over, h->slots);
      h->slots -= cut;
      over -= cut;
    }
    found.hosts.erase(std::remove_if(found.hosts.begin(), found.hosts.end(), [](const host_slots& h) { return h.slots == 0; }),
                      found.hosts.end());
    found.total = max_total;
  }
  return found;
}

// ---- discovery_runner -------------------------------------------------------------------------

struct discovery_runner::state {
  std::string script;
  std::chrono::duration<double> interval, timeout;
  int wake[2] = {-1, -1};  // results wait: the thread writes a byte
  int stop[2] = {-1, -1};  // the destructor writes a byte: the thread ends
  std::mutex mutex;
  std::vector<result> results;
  std::thread thread;

  // Waits until `deadline` or a stop; true when stopped.
  bool wait_until(std::chrono::steady_clock::time_point deadline) const {
    for (;;) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) return false;
      pollfd p{stop[0], POLLIN, 0};
      const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 60 * 60 * 1000)));
      if (n > 0) return true;
      if (n < 0 && errno != EINTR) return false;
    }
  }

  void post(result r) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      results.push_back(std::move(r));
    }
    const char byte = 1;
    ssize_t ignored = ::write(wake[1], &byte, 1);
    (void)ignored;
  }

  // One run of the script: its output, or why there is none. nullopt when stopped meanwhile.
  std::optional<result> run_once() {
    result r;
    int out[2];
    // Close-on-exec from the start: a worker forked meanwhile must not hold the script's output.
    if (::pipe2(out, O_CLOEXEC) != 0) {
      r.error = std::string("cannot make a pipe: ") + std::strerror(errno);
      return r;
    }
    set_cloexec_nonblock(out[0]);
    int null_in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    std::vector<char*> argv{const_cast<char*>(script.c_str()), nullptr};
    sigset_t all, old;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);  // its own group: a timeout kills whatever it started
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(s, &dfl, nullptr);
#ifdef __linux__
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
#endif
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      if (null_in >= 0) ::dup2(null_in, STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(126);
    }
    const int fork_errno = errno;
    if (pid > 0) ::setpgid(pid, pid);
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    ::close(out[1]);
    if (null_in >= 0) ::close(null_in);
    if (pid < 0) {
      ::close(out[0]);
      r.error = std::string("cannot fork: ") + std::strerror(fork_errno);
      return r;
    }

    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout);
    bool stopped = false, timed_out = false, too_long = false;
    char buffer[4096];
    for (bool open = true; open;) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) {
        timed_out = true;
        break;
      }
      pollfd p[2] = {{out[0], POLLIN, 0}, {stop[0], POLLIN, 0}};
      const int n = ::poll(p, 2, static_cast<int>(left));
      if (n < 0 && errno == EINTR) continue;
      if (p[1].revents != 0) {
        stopped = true;
        break;
      }
      if (p[0].revents == 0) continue;
      for (;;) {
        const ssize_t got = ::read(out[0], buffer, sizeof buffer);
        if (got > 0) {
          r.output.append(buffer, static_cast<std::size_t>(got));
          if (r.output.size() > max_discovery_output) {
            too_long = true;
            open = false;
            break;
          }
        } else if (got < 0 && errno == EINTR) {
          continue;
        } else if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
          break;
        } else {
          open = false;  // EOF: the script (and all it started) closed its output
          break;
        }
      }
    }
    ::close(out[0]);
    int status = 0;
    if (stopped || timed_out || too_long) {
      ::kill(-pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    } else {
      // Its output is closed; it exits now, or is ended at the deadline. WNOWAIT: the exited
      // script stays a zombie while whatever it left in its group is killed, so that its pid
      // cannot name another group yet.
      for (;;) {
        siginfo_t info{};
        info.si_pid = 0;
        const int done = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
        if (done != 0 && errno == EINTR) continue;
        if (done != 0 || info.si_pid != 0) break;
        if (std::chrono::steady_clock::now() >= deadline) {
          timed_out = true;
          break;
        }
        if (wait_until(std::chrono::steady_clock::now() + std::chrono::milliseconds(10))) {
          stopped = true;
          break;
        }
      }
      ::kill(-pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
    if (stopped) return std::nullopt;
    if (timed_out) {
      r.error = "did not finish within " + seconds_text(timeout.count()) + " s (--discovery-timeout); killed it (SIGKILL)";
    } else if (too_long) {
      r.error = "printed more than " + std::to_string(max_discovery_output) + " bytes; killed it (SIGKILL)";
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 126 && r.output.empty()) {
      r.error = "could not be executed (exit status 126: is it an executable file?)";
    } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
      r.error = "exited with status " + std::to_string(WEXITSTATUS(status));
    } else if (WIFSIGNALED(status)) {
      r.error = "was killed by " + signal_name(WTERMSIG(status));
    } else {
      r.ok = true;
    }
    return r;
  }

  void loop() {
    for (;;) {
      const auto started = std::chrono::steady_clock::now();
      std::optional<result> r = run_once();
      if (!r) return;
      post(std::move(*r));
      if (wait_until(started + std::chrono::duration_cast<std::chrono::steady_clock::duration>(interval))) return;
    }
  }
};

discovery_runner::discovery_runner(std::string script, double interval_s, double timeout_s)
    : state_(std::make_unique<state>()) {
  state_->script = std::move(script);
  state_->interval = std::chrono::duration<double>(interval_s);
  state_->timeout = std::chrono::duration<double>(timeout_s);
  if (::pipe2(state_->wake, O_CLOEXEC) != 0 || ::pipe2(state_->stop, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("host discovery: cannot make a pipe: ") + std::strerror(errno));
  }
  for (int fd : {state_->wake[0], state_->wake[1], state_->stop[0], state_->stop[1]}) set_cloexec_nonblock(fd);
  // The thread blocks every signal: the launcher's handlers run on the supervisor's thread.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  state_->thread = std::thread([s = state_.get()] { s->loop(); });
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

discovery_runner::~discovery_runner() {
  const char byte = 1;
  ssize_t ignored = ::write(state_->stop[1], &byte, 1);
  (void)ignored;
  if (state_->thread.joinable()) state_->thread.join();
  for (int fd : {state_->wake[0], state_->wake[1], state_->stop[0], state_->stop[1]})
    if (fd >= 0) ::close(fd);
}

int discovery_runner::wake_fd() const { return state_->wake[0]; }

std::vector<discovery_runner::result> discovery_runner::take() {
  char buffer[256];
  while (::read(state_->wake[0], buffer, sizeof buffer) > 0) {
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  return std::exchange(state_->results, {});
}

// ---- host_membership --------------------------------------------------------------------------

host_membership::host_membership(const launch_options& options, const std::vector<host_slots>& hosts, int workers)
    : options_(options) {
  int rank = 0;
  for (const host_slots& h : hosts)
    for (int i = 0; i < h.slots; ++i) host_[rank++] = canonical_host(h.host);
  for (; rank < workers; ++rank) host_[rank] = local_host;
}

void host_membership::added(int rank, const std::string& host) { host_[rank] = host; }

bool host_membership::removed(int rank) const {
  auto it = removed_.find(rank);
  return it != removed_.end() && it->second;
}

std::string host_membership::host_of(int rank) const {
  auto it = host_.find(rank);
  return it == host_.end() ? std::string(local_host) : it->second;
}

host_membership::change host_membership::plan(const std::vector<host_slots>& wanted, const std::vector<worker>& workers) {
  change c;
  std::map<std::string, int> want;
  for (const host_slots& h : wanted) want[h.host] = h.slots;
  // The hosts in a stable order: the script's, then those it no longer lists.
  std::vector<std::string> order;
  for (const host_slots& h : wanted) order.push_back(h.host);
  for (const auto& [rank, host] : host_)
    if (std::find(order.begin(), order.end(), host) == order.end()) order.push_back(host);

  const int max_total = options_.max_workers.value_or(options_.num_workers);
  const int min_running = options_.min_workers.value_or(1);
  int running = 0, occupied = 0;
  for (const worker& w : workers) {
    if (removed(w.rank) || released_[w.rank]) continue;
    ++occupied;
    running += w.running;
  }
  for (const std::string& host : order) {
    const int target = want.count(host) ? want[host] : 0;
    std::vector<int> live, lost;  // ranks on this host, oldest first
    for (const worker& w : workers) {
      if (host_of(w.rank) != host || removed(w.rank) || released_[w.rank]) continue;
      (w.running ? live : lost).push_back(w.rank);
    }
    int excess = static_cast<int>(live.size() + lost.size()) - target;
    // Lost workers give up their slots first: nothing to stop.
    for (auto r = lost.rbegin(); r != lost.rend() && excess > 0; ++r, --excess) {
      released_[*r] = true;
      --occupied;
    }
    for (auto r = live.rbegin(); r != live.rend() && excess > 0; ++r) {
      if (*r == 0) {
        c.notes.push_back("keeping worker 0 on " + host + ": it is the chief, which holds the cluster's membership");
        break;
      }
      if (running - 1 < min_running) {
        c.notes.push_back("keeping " + std::to_string(running) + " worker" + (running == 1 ? "" : "s") +
                          " running: removing more would leave fewer than --min " + std::to_string(min_running));
        break;
      }
      c.remove.push_back(*r);
      --excess;
      --running;
      --occupied;
    }
  }
  for (const std::string& host : order) {
    const int target = want.count(host) ? want[host] : 0;
    int here = 0;
    for (const worker& w : workers)
      if (host_of(w.rank) == host && !removed(w.rank) && !released_[w.rank] &&
          std::find(c.remove.begin(), c.remove.end(), w.rank) == c.remove.end())
        ++here;
    for (; here < target; ++here) {
      if (occupied >= max_total) {
        c.notes.push_back("not adding a worker on " + host + ": " + std::to_string(occupied) + " slots are taken, --max " +
                          std::to_string(max_total));
        break;
      }
      c.add.push_back(host);
      ++occupied;
    }
  }
  return c;
}

}  // namespace troupe::launch

// ---- host_discovery ---------------------------------------------------------------------------

namespace troupe::launch {

host_discovery::host_discovery(const launch_options& options, int workers, add_fn add, say_fn say)
    : options_(options), members_(options, options.discovery_hosts, workers), add_(std::move(add)), say_(std::move(say)) {}

void host_discovery::start() {
  if (runner_ || !options_.discovery_script) return;
  runner_ = std::make_unique<discovery_runner>(*options_.discovery_script, options_.discovery_interval_s,
                                               options_.discovery_timeout_s);
}

void host_discovery::apply(std::vector<worker>& workers, bool may_change) {
  if (!runner_) return;
  std::vector<discovery_runner::result> results = runner_->take();
  if (results.empty()) return;
  const discovery_runner::result& r = results.back();  // the newest says what the hosts are now
  const std::string script = "host discovery: '" + *options_.discovery_script + "' ";
  auto trouble = [&](const std::string& message) {
    if (message != last_trouble_) say_(message);
    last_trouble_ = message;
  };
  if (!r.ok) {
    trouble(script + r.error + "; the workers stay as they are");
    failing_ = true;
    return;
  }
  discovered_hosts found;
  try {
    found = parse_discovery_output(r.output, std::min(options_.max_workers.value_or(options_.num_workers), max_workers));
  } catch (const discovery_error& e) {
    trouble(script + "printed a bad list, " + e.what() + "; the workers stay as they are");
    failing_ = true;
    return;
  }
  if (failing_) say_(script + "lists usable hosts again");
  failing_ = false;
  if (!may_change) return;
  host_membership::change c = members_.plan(found.hosts, workers);
  std::string notes = found.note;
  for (const std::string& n : c.notes) notes += (notes.empty() ? "" : "; ") + n;
  if (!notes.empty()) trouble("host discovery: " + notes);
  else last_trouble_.clear();
  if (c.add.empty() && c.remove.empty()) return;
  std::string list;
  for (const host_slots& h : found.hosts) list += (list.empty() ? "" : ", ") + h.host + ":" + std::to_string(h.slots);
  say_("host discovery: the hosts are now " + list + " (" + std::to_string(found.total) + " slot" +
       (found.total == 1 ? "" : "s") + "): removing " + std::to_string(c.remove.size()) + ", adding " +
       std::to_string(c.add.size()) + " worker" + (c.add.size() == 1 ? "" : "s"));
  for (int rank : c.remove) {
    for (worker& w : workers) {
      if (w.rank != rank || !w.running) continue;
      members_.removing(rank);
      say_("removing " + w.describe() + " from " + members_.host_of(rank) +
           " (SIGKILL); the others drop it as a lost worker and go on");
      ::kill(-w.pid, SIGKILL);
    }
  }
  for (const std::string& host : c.add) {
    if (std::optional<int> rank = add_(host)) {
      members_.added(*rank, host);
      added_[*rank] = true;
    }
  }
}

void host_discovery::left(const worker& w, int status) {
  std::string how = WIFSIGNALED(status) ? "killed by " + signal_name(WTERMSIG(status))
                                        : "exited with status " + std::to_string(WEXITSTATUS(status));
  say_(w.describe() + " left (" + how + "), removed by host discovery; not a failure");
}

bool host_discovery::late(const worker& w, int status, bool chief_finished) {
  if (!chief_finished || !added_[w.rank] || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) return false;
  std::string how = WIFSIGNALED(status) ? "was killed by " + signal_name(WTERMSIG(status))
                                        : "exited with status " + std::to_string(WEXITSTATUS(status));
  say_(w.describe() + ", added by host discovery, " + how +
       " after the chief finished the training (it came too late to join, or ended after it); not a failure");
  return true;
}

void supervisor::start_discovery() {
  try {
    discovery_->start();
  } catch (const std::exception& e) {
    say(e.what());
    exit_code_ = exit_code_.value_or(1);
    begin_stop(SIGTERM);
  }
}

std::optional<int> supervisor::add_worker(const std::string& host) {
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

}  // namespace troupe::launch
