#pragma once
// What the troupe-launch tests share: troupe-launch run for real, its workers `/bin/sh -c '...'`,
// real signals, every wait bounded, and a scratch directory that checks afterwards that no worker
// process is left.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "launch/cluster.hpp"
#include "launch/host_discovery.hpp"
#include "launch/launch_options.hpp"
#include "launch/line_prefixer.hpp"

namespace launch_test {

using clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using troupe::launch::line_prefixer;

inline double seconds_since(clock::time_point start) {
  return std::chrono::duration<double>(clock::now() - start).count();
}

// Sourced by every worker script: $i is the worker's index (read from TF_CONFIG), $D the scratch
// directory; `record PIDS` writes "$$ PIDS" to $D/pid.$i, `await RANKS` waits (bounded) until
// those ranks have recorded theirs.
inline const std::string prelude = R"(i=${TF_CONFIG##*'"index": '}; i=${i%%\}*}; D=$1
record() { echo "$$ $*" > "$D/tmp.$i" && mv "$D/tmp.$i" "$D/pid.$i"; }
await() { n=0; for r in "$@"; do while [ ! -e "$D/pid.$r" ]; do n=$((n+1)); [ $n -gt 400 ] && exit 99; sleep 0.025; done; done; }
)";

// Alive and not a zombie: an orphaned zombie waits for a reaper that may never come here (PID 1
// of a container), but it runs nothing and holds nothing.
inline bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return ::kill(pid, 0) == 0;
  auto paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}

// The pids still alive after waiting up to `limit`.
inline std::vector<pid_t> still_alive(const std::vector<pid_t>& pids, std::chrono::milliseconds limit) {
  auto until = clock::now() + limit;
  for (;;) {
    std::vector<pid_t> left;
    for (pid_t p : pids)
      if (alive(p)) left.push_back(p);
    if (left.empty() || clock::now() >= until) return left;
    std::this_thread::sleep_for(20ms);
  }
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The lines that start with `prefix`, without it, in order.
inline std::vector<std::string> lines_of_rank(const std::string& text, int rank) {
  std::string prefix = "[rank " + std::to_string(rank) + "] ";
  std::vector<std::string> lines;
  for (const auto& line : lines_of(text))
    if (line.rfind(prefix, 0) == 0) lines.push_back(line.substr(prefix.size()));
  return lines;
}

// A scratch directory; on the way out, any worker recorded there that is still alive is killed.
class scratch {
 public:
  scratch() {
    char name[] = "/tmp/troupe-launch-test-XXXXXX";
    REQUIRE(::mkdtemp(name) != nullptr);
    path_ = name;
  }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  ~scratch() {
    for (pid_t p : recorded_pids())
      if (alive(p)) ::kill(p, SIGKILL);
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }

  const std::string& path() const { return path_; }

  // Every pid the workers recorded with `record`.
  std::vector<pid_t> recorded_pids() const {
    std::vector<pid_t> pids;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(path_, ec)) {
      if (entry.path().filename().string().rfind("pid.", 0) != 0) continue;
      std::istringstream in(read_file(entry.path().string()));
      for (pid_t p; in >> p;) pids.push_back(p);
    }
    return pids;
  }

  // Waits up to 10 s for ranks 0..n-1 to record their pids.
  bool await_recorded(int n) const {
    auto until = clock::now() + 10s;
    for (int rank = 0; rank < n; ++rank)
      while (!fs::exists(path_ + "/pid." + std::to_string(rank))) {
        if (clock::now() >= until) return false;
        std::this_thread::sleep_for(10ms);
      }
    return true;
  }

 private:
  std::string path_;
};

struct outcome {
  bool finished = false;  // false: still running at the limit, and killed
  int exit_code = -1;     // -1 when a signal ended the launcher
  std::string out, err;
  double seconds = 0;
};

// troupe-launch started in its own process group with stdout and stderr in files; killed with its
// group if a test leaves before it exits.
class launcher {
 public:
  // `env`: "NAME=VALUE" sets, "NAME" unsets, in the launcher's environment.
  launcher(const std::vector<std::string>& args, const scratch& dir,
           const std::vector<std::string>& env = {})
      : out_path_(dir.path() + "/launcher.out"), err_path_(dir.path() + "/launcher.err") {
    std::vector<char*> argv{const_cast<char*>(TROUPE_LAUNCH_PATH)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    start_ = clock::now();
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::setpgid(0, 0);
      int in = ::open("/dev/null", O_RDONLY);
      int out = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(in, 0);
      ::dup2(out, 1);
      ::dup2(err, 2);
      for (const auto& e : env) {
        auto eq = e.find('=');
        if (eq == std::string::npos)
          ::unsetenv(e.c_str());
        else
          ::setenv(e.substr(0, eq).c_str(), e.substr(eq + 1).c_str(), 1);
      }
      ::execv(TROUPE_LAUNCH_PATH, argv.data());
      ::_exit(126);
    }
    ::setpgid(pid_, pid_);
  }
  launcher(const launcher&) = delete;
  launcher& operator=(const launcher&) = delete;
  ~launcher() {
    if (!reaped_) {
      ::kill(-pid_, SIGKILL);
      int status;
      ::waitpid(pid_, &status, 0);
    }
  }

  pid_t pid() const { return pid_; }

  // Waits up to `limit` for the launcher to exit; kills it if it does not.
  outcome wait(std::chrono::milliseconds limit) {
    outcome result;
    auto until = clock::now() + limit;
    int status = 0;
    for (;;) {
      pid_t done = ::waitpid(pid_, &status, WNOHANG);
      if (done == pid_) {
        reaped_ = true;
        result.finished = true;
        result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        break;
      }
      if (clock::now() >= until) break;
      std::this_thread::sleep_for(5ms);
    }
    result.seconds = seconds_since(start_);
    if (!reaped_) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      reaped_ = true;
    }
    result.out = read_file(out_path_);
    result.err = read_file(err_path_);
    return result;
  }

 private:
  std::string out_path_, err_path_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  clock::time_point start_;
};

inline outcome run(const std::vector<std::string>& args, const scratch& dir,
            const std::vector<std::string>& env = {}, std::chrono::milliseconds limit = 20s) {
  launcher l(args, dir, env);
  return l.wait(limit);
}

// Arguments for N workers running `script` (after the prelude) with the scratch dir as $1.
inline std::vector<std::string> workers(int n, const std::string& script, const scratch& dir,
                                 std::vector<std::string> options = {}) {
  std::vector<std::string> args{"-n", std::to_string(n)};
  args.insert(args.end(), options.begin(), options.end());
  for (const char* a : {"--", "/bin/sh", "-c"}) args.emplace_back(a);
  args.push_back(prelude + script);
  args.emplace_back("worker");
  args.push_back(dir.path());
  return args;
}

inline void check_no_worker_left(const scratch& dir, std::size_t expected_pids) {
  auto pids = dir.recorded_pids();
  CHECK(pids.size() == expected_pids);
  auto left = still_alive(pids, 3s);
  CHECK_MESSAGE(left.empty(), left.size() << " recorded worker processes are still alive");
}

// A TCP socket bound to 127.0.0.1:port (0: any), closed on destruction.
class bound_socket {
 public:
  explicit bound_socket(int port, bool listening) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
          (!listening || ::listen(fd_, 1) == 0);
    socklen_t len = sizeof addr;
    if (ok_ && ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) port_ = ntohs(addr.sin_port);
  }
  bound_socket(const bound_socket&) = delete;
  bound_socket& operator=(const bound_socket&) = delete;
  ~bound_socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return ok_; }
  int port() const { return port_; }

 private:
  int fd_;
  bool ok_ = false;
  int port_ = 0;
};

// The cluster's ports as every worker saw them, checked to be one list for all.
inline std::vector<int> cluster_ports(const std::string& out, int n) {
  std::optional<nlohmann::json> cluster;
  for (int rank = 0; rank < n; ++rank) {
    CAPTURE(rank);
    auto lines = lines_of_rank(out, rank);
    REQUIRE(!lines.empty());
    REQUIRE(lines[0].rfind("TF_CONFIG=", 0) == 0);
    auto config = nlohmann::json::parse(lines[0].substr(10));
    CHECK(config["task"]["type"] == "worker");
    CHECK(config["task"]["index"] == rank);
    CHECK(config["cluster"].size() == 1);
    if (!cluster) cluster = config["cluster"]["worker"];
    CHECK(config["cluster"]["worker"] == *cluster);
  }
  std::vector<int> ports;
  for (const auto& address : *cluster) {
    std::string text = address.get<std::string>();
    REQUIRE(text.rfind("127.0.0.1:", 0) == 0);
    ports.push_back(std::stoi(text.substr(10)));
  }
  return ports;
}

}  // namespace launch_test
