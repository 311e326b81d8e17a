// troupe-launch, run for real: workers are `/bin/sh -c '...'`, signals are real, every wait is
// bounded, and every test checks afterwards that no worker process is left.
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

namespace {

using clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using troupe::launch::line_prefixer;

double seconds_since(clock::time_point start) {
  return std::chrono::duration<double>(clock::now() - start).count();
}

// Sourced by every worker script: $i is the worker's index (read from TF_CONFIG), $D the scratch
// directory; `record PIDS` writes "$$ PIDS" to $D/pid.$i, `await RANKS` waits (bounded) until
// those ranks have recorded theirs.
const std::string prelude = R"(i=${TF_CONFIG##*'"index": '}; i=${i%%\}*}; D=$1
record() { echo "$$ $*" > "$D/tmp.$i" && mv "$D/tmp.$i" "$D/pid.$i"; }
await() { n=0; for r in "$@"; do while [ ! -e "$D/pid.$r" ]; do n=$((n+1)); [ $n -gt 400 ] && exit 99; sleep 0.025; done; done; }
)";

// Alive and not a zombie: an orphaned zombie waits for a reaper that may never come here (PID 1
// of a container), but it runs nothing and holds nothing.
bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return ::kill(pid, 0) == 0;
  auto paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}

// The pids still alive after waiting up to `limit`.
std::vector<pid_t> still_alive(const std::vector<pid_t>& pids, std::chrono::milliseconds limit) {
  auto until = clock::now() + limit;
  for (;;) {
    std::vector<pid_t> left;
    for (pid_t p : pids)
      if (alive(p)) left.push_back(p);
    if (left.empty() || clock::now() >= until) return left;
    std::this_thread::sleep_for(20ms);
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The lines that start with `prefix`, without it, in order.
std::vector<std::string> lines_of_rank(const std::string& text, int rank) {
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

outcome run(const std::vector<std::string>& args, const scratch& dir,
            const std::vector<std::string>& env = {}, std::chrono::milliseconds limit = 20s) {
  launcher l(args, dir, env);
  return l.wait(limit);
}

// Arguments for N workers running `script` (after the prelude) with the scratch dir as $1.
std::vector<std::string> workers(int n, const std::string& script, const scratch& dir,
                                 std::vector<std::string> options = {}) {
  std::vector<std::string> args{"-n", std::to_string(n)};
  args.insert(args.end(), options.begin(), options.end());
  for (const char* a : {"--", "/bin/sh", "-c"}) args.emplace_back(a);
  args.push_back(prelude + script);
  args.emplace_back("worker");
  args.push_back(dir.path());
  return args;
}

void check_no_worker_left(const scratch& dir, std::size_t expected_pids) {
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
std::vector<int> cluster_ports(const std::string& out, int n) {
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

}  // namespace

TEST_CASE("troupe-launch gives 3 workers distinct indices and one cluster of 3 distinct ports") {
  scratch dir;
  auto r = run(workers(3, R"(echo "TF_CONFIG=$TF_CONFIG"; echo "DEVICES=${TROUPE_DEVICES_PER_WORKER-unset}")", dir),
               dir, {"TF_CONFIG=stale", "TROUPE_DEVICES_PER_WORKER"});
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(r.err == "");
  CHECK(lines_of(r.out).size() == 6);
  auto ports = cluster_ports(r.out, 3);
  REQUIRE(ports.size() == 3);
  CHECK(std::set<int>(ports.begin(), ports.end()).size() == 3);
  for (int port : ports) CHECK((port > 0 && port < 65536));
  for (int rank = 0; rank < 3; ++rank) CHECK(lines_of_rank(r.out, rank).at(1) == "DEVICES=unset");
}

TEST_CASE("troupe-launch passes --devices-per-worker as TROUPE_DEVICES_PER_WORKER") {
  scratch dir;
  auto r = run(workers(2, R"(echo "DEVICES=${TROUPE_DEVICES_PER_WORKER-unset}")", dir,
                       {"--devices-per-worker", "2"}),
               dir, {"TROUPE_DEVICES_PER_WORKER=7"});
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  for (int rank = 0; rank < 2; ++rank)
    CHECK(lines_of_rank(r.out, rank) == std::vector<std::string>{"DEVICES=2"});
}

TEST_CASE("troupe-launch gives its workers one fresh TROUPE_CLUSTER_TOKEN per launch unless the caller set one") {
  scratch dir;
  // The token every worker of one launch saw (empty when they differ).
  auto token_of = [&](const std::vector<std::string>& env) {
    auto r = run(workers(2, R"(echo "TOKEN=${TROUPE_CLUSTER_TOKEN-unset}")", dir), dir, env);
    REQUIRE(r.finished);
    CHECK(r.exit_code == 0);
    const std::string t = lines_of_rank(r.out, 0).at(0);
    return t == lines_of_rank(r.out, 1).at(0) ? t : std::string();
  };
  const std::string first = token_of({"TROUPE_CLUSTER_TOKEN"});
  CHECK(first.size() == std::string("TOKEN=").size() + 64);
  CHECK(token_of({"TROUPE_CLUSTER_TOKEN"}) != first);  // another launch, another token
  const std::string from_empty = token_of({"TROUPE_CLUSTER_TOKEN="});  // empty counts as unset
  CHECK(from_empty.size() == first.size());
  CHECK(token_of({"TROUPE_CLUSTER_TOKEN=mine"}) == "TOKEN=mine");
}

TEST_CASE("troupe-launch prefixes every stdout and stderr line with the worker's rank") {
  scratch dir;
  auto r = run(workers(3, R"(echo "out $i"; echo "err $i" >&2; printf 'two\nlines\n'
printf 'hel'; sleep 0.2; echo lo; printf 'tail'; printf 'err tail' >&2)",
                       dir),
               dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  for (int rank = 0; rank < 3; ++rank) {
    CAPTURE(rank);
    std::string n = std::to_string(rank);
    CHECK(lines_of_rank(r.out, rank) ==
          std::vector<std::string>{"out " + n, "two", "lines", "hello", "tail"});
    CHECK(lines_of_rank(r.err, rank) == std::vector<std::string>{"err " + n, "err tail"});
  }
  // Nothing unprefixed, nothing on the wrong stream.
  CHECK(lines_of(r.out).size() == 15);
  CHECK(lines_of(r.err).size() == 6);
}

TEST_CASE("troupe-launch keeps lines whole when 4 workers write 20000 lines each at once") {
  scratch dir;
  auto r = run(workers(4, R"(seq 0 19999 | sed "s/^/rank $i line /")", dir), dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  std::vector<int> next(4, 0);
  int bad = 0;
  for (const auto& line : lines_of(r.out)) {
    int rank = -1, rank_again = -1, number = -1;
    char tail = 0;
    if (std::sscanf(line.c_str(), "[rank %d] rank %d line %d%c", &rank, &rank_again, &number, &tail) != 3 ||
        rank != rank_again || rank < 0 || rank > 3 || number != next[rank]) {
      if (++bad <= 3) MESSAGE("bad line: " << line);
      continue;
    }
    ++next[rank];
  }
  CHECK(bad == 0);
  CHECK(next == std::vector<int>{20000, 20000, 20000, 20000});
}

TEST_CASE("troupe-launch exits with a failing worker's status and stops the others quickly") {
  scratch dir;
  auto r = run(workers(3, R"(if [ "$i" = 1 ]; then await 0 2; echo "giving up" >&2; exit 3; fi
sleep 60 & record $!; wait)",
                       dir),
               dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 3);
  CHECK(r.seconds < 4);
  CHECK(lines_of_rank(r.err, 1) == std::vector<std::string>{"giving up"});
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 1 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) )"
                                            R"(exited with status 3; stopping the others\n)")));
  check_no_worker_left(dir, 4);
}

TEST_CASE("troupe-launch exits 128+signal when a worker is killed by a signal") {
  scratch dir;
  auto r = run(workers(3, R"(if [ "$i" = 2 ]; then await 0 1; kill -9 $$; fi
sleep 60 & record $!; wait)",
                       dir),
               dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 137);
  CHECK(r.seconds < 4);
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 2 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) )"
                                            R"(was killed by signal 9 \(SIGKILL\); stopping the others\n)")));
  check_no_worker_left(dir, 4);
}

TEST_CASE("troupe-launch forwards SIGTERM to every worker and leaves none behind") {
  scratch dir;
  launcher l(workers(3, R"(trap 'echo "rank $i got TERM"; exit 0' TERM; sleep 60 & record $!; wait)", dir), dir);
  REQUIRE(dir.await_recorded(3));
  auto signalled = clock::now();
  REQUIRE(::kill(l.pid(), SIGTERM) == 0);
  auto r = l.wait(10s);
  REQUIRE(r.finished);
  CHECK(seconds_since(signalled) < 4);
  CHECK(r.exit_code == 128 + SIGTERM);
  CHECK(r.err.find("troupe-launch: received SIGTERM; forwarding it to 3 running workers\n") != std::string::npos);
  for (int rank = 0; rank < 3; ++rank)
    CHECK(lines_of_rank(r.out, rank) == std::vector<std::string>{"rank " + std::to_string(rank) + " got TERM"});
  check_no_worker_left(dir, 6);
}

TEST_CASE("troupe-launch forwards SIGINT and kills what a worker leaves behind in its group") {
  // The shell's background sleep ignores SIGINT (POSIX, without job control): it outlives the
  // worker's shell and goes only because the launcher kills the worker's whole process group.
  scratch dir;
  launcher l(workers(2, R"(trap 'echo "rank $i got INT"; exit 0' INT; sleep 60 & record $!; wait)", dir), dir);
  REQUIRE(dir.await_recorded(2));
  auto signalled = clock::now();
  REQUIRE(::kill(l.pid(), SIGINT) == 0);
  auto r = l.wait(10s);
  REQUIRE(r.finished);
  CHECK(seconds_since(signalled) < 4);
  CHECK(r.exit_code == 128 + SIGINT);
  CHECK(r.err.find("troupe-launch: received SIGINT; forwarding it to 2 running workers\n") != std::string::npos);
  for (int rank = 0; rank < 2; ++rank)
    CHECK(lines_of_rank(r.out, rank) == std::vector<std::string>{"rank " + std::to_string(rank) + " got INT"});
  check_no_worker_left(dir, 4);
}

TEST_CASE("troupe-launch stops everything after --timeout and exits 124") {
  scratch dir;
  auto r = run(workers(2, "sleep 60 & record $!; wait", dir, {"--timeout", "1"}), dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 124);
  CHECK(r.seconds >= 0.9);
  CHECK(r.seconds < 5);
  CHECK(r.err.find("troupe-launch: timed out after 1 s; stopping 2 running workers\n") != std::string::npos);
  check_no_worker_left(dir, 4);
}

TEST_CASE("troupe-launch sends SIGKILL after the grace period to a worker that ignores SIGTERM") {
  scratch dir;
  auto r = run(workers(2, R"(if [ "$i" = 1 ]; then await 0; exit 5; fi
trap '' TERM; sleep 60 & record $!; wait)",
                       dir, {"--grace", "0.5"}),
               dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 5);
  CHECK(r.seconds >= 0.5);
  CHECK(r.seconds < 4);
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 0 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) )"
                                            R"(did not stop within 0\.5 s of SIGTERM; sending SIGKILL\n)")));
  check_no_worker_left(dir, 2);
}

TEST_CASE("troupe-launch leaves no process behind when every worker succeeds") {
  scratch dir;
  auto r = run(workers(2, "sleep 60 & record $!; exit 0", dir), dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(r.seconds < 4);
  CHECK(r.err == "");
  check_no_worker_left(dir, 4);
}

TEST_CASE("troupe-launch waits for every worker when one finishes early") {
  scratch dir;
  auto r = run(workers(2, R"(if [ "$i" = 0 ]; then exit 0; fi; sleep 0.5; echo done)", dir), dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(r.seconds >= 0.5);
  CHECK(lines_of_rank(r.out, 1) == std::vector<std::string>{"done"});
  CHECK(r.err == "");
}

TEST_CASE("troupe-launch --max-restarts restarts every worker after a failure and a preemption, saying why") {
  scratch dir;
  // Each worker counts its starts in $D/starts.$i. Rank 1 is killed by SIGKILL in the first run;
  // rank 0 exits 75 (preempted) in the second; the third run succeeds.
  auto r = run(workers(2, R"(echo x >> "$D/starts.$i"; n=$((TROUPE_RESTART_COUNT + 1))
echo "run $n"
if [ "$n" = 1 ]; then record; fi
if [ "$n" = 1 ] && [ "$i" = 1 ]; then await 0; kill -9 $$; fi
if [ "$n" = 2 ] && [ "$i" = 0 ]; then exit 75; fi
if [ "$n" -lt 3 ]; then sleep 60 & wait; fi
exit 0)",
                       dir, {"--max-restarts", "2", "--restart-backoff", "0.1"}),
               dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(read_file(dir.path() + "/starts.0") == "x\nx\nx\n");
  CHECK(lines_of_rank(r.out, 1).back() == "run 3");  // rank 1 may be stopped before it says "run 2"
  CHECK(lines_of_rank(r.out, 0) == std::vector<std::string>{"run 1", "run 2", "run 3"});
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: restarting all 2 workers \(restart 1 of 2\) in 0\.1 s: )"
                                            R"(worker 1 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) was killed by signal 9 \(SIGKILL\)\n)")));
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: restarting all 2 workers \(restart 2 of 2\) in 0\.2 s: )"
                                            R"(worker 0 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) exited with status 75 )"
                                            R"(\(preempted: it saved a checkpoint to restart from\)\n)")));
}

TEST_CASE("troupe-launch --elastic leaves the others running when a worker but the chief dies while --min of them run") {
  scratch dir;
  // Rank 1 kills itself once all have started; the others see the elastic settings and finish.
  const std::string script = R"(record
if [ "$i" = 1 ]; then await 0 2; kill -9 $$; fi
await 1; sleep 0.3
echo "elastic=$TROUPE_ELASTIC min=$TROUPE_MIN_WORKERS max=$TROUPE_MAX_WORKERS"
exit 0)";
  auto r = run(workers(3, script, dir, {"--elastic", "--min", "2", "--max", "4"}), dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(lines_of_rank(r.out, 0) == std::vector<std::string>{"elastic=1 min=2 max=4"});
  CHECK(lines_of_rank(r.out, 2) == std::vector<std::string>{"elastic=1 min=2 max=4"});
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 1 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) was killed )"
                                            R"(by signal 9 \(SIGKILL\); --elastic: the 2 others go on without it\n)")));
  CHECK(r.err.find("stopping the others") == std::string::npos);
  // Below --min the others are stopped, as without --elastic.
  scratch below;
  auto b = run(workers(3, R"(record
if [ "$i" = 1 ]; then await 0 2; kill -9 $$; fi
sleep 60 & wait)", below, {"--elastic", "--min", "3"}), below);
  REQUIRE(b.finished);
  CHECK(b.exit_code == 137);
  CHECK(std::regex_search(b.err, std::regex(R"(troupe-launch: worker 1 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) was killed )"
                                            R"(by signal 9 \(SIGKILL\); stopping the others\n)")));
  // Rank 0 holds the cluster's membership: its death stops the others whatever --min says.
  scratch chief;
  auto c = run(workers(3, R"(record
if [ "$i" = 0 ]; then await 1 2; kill -9 $$; fi
sleep 60 & wait)", chief, {"--elastic", "--min", "1"}), chief);
  REQUIRE(c.finished);
  CHECK(c.exit_code == 137);
  CHECK(std::regex_search(c.err, std::regex(R"(troupe-launch: worker 0 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) was killed )"
                                            R"(by signal 9 \(SIGKILL\); stopping the others\n)")));
}

TEST_CASE("troupe-launch --elastic --max-restarts starts a joiner in a lost worker's place, with the run's token") {
  scratch dir;
  // Rank 1 kills itself on its first start; its replacement (TROUPE_JOIN=1) says what it got.
  const std::string script = R"(if [ -z "$TROUPE_JOIN" ]; then record; fi
echo "$TROUPE_CLUSTER_TOKEN" > "$D/token.$i.${TROUPE_JOIN:-0}"
if [ "$i" = 1 ] && [ -z "$TROUPE_JOIN" ]; then await 0 2; kill -9 $$; fi
if [ "$i" = 1 ]; then echo "joined=$TROUPE_JOIN elastic=$TROUPE_ELASTIC"; exit 0; fi
n=0; while [ ! -e "$D/token.1.1" ]; do n=$((n+1)); [ $n -gt 400 ] && exit 98; sleep 0.025; done
exit 0)";
  auto r = run(workers(3, script, dir, {"--elastic", "--min", "2", "--max-restarts", "1"}), dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(lines_of_rank(r.out, 1) == std::vector<std::string>{"joined=1 elastic=1"});
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 1 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) was killed )"
                                            R"(by signal 9 \(SIGKILL\); --elastic: the 2 others go on without it\n)"
                                            R"(troupe-launch: starting a replacement for worker 1 \(1 of 1\); it joins the )"
                                            R"(running cluster\n)")));
  // The joiner holds the token the others were started with.
  CHECK(read_file(dir.path() + "/token.1.1") == read_file(dir.path() + "/token.0.0"));
  CHECK(read_file(dir.path() + "/token.1.0") == read_file(dir.path() + "/token.0.0"));
  CHECK(r.err.find("restarting") == std::string::npos);
}

TEST_CASE("troupe-launch --elastic --max-restarts: a replacement refused as the chief finishes came too late, no failure") {
  // Rank 1 kills itself; its replacement fails at once (as a joiner the chief refuses when its
  // fit ends does), while the chief still runs for a moment and then finishes: the replacement's
  // verdict waits for the chief's exit, and the run succeeds. With a chief that does not finish
  // within --grace, the same failure stops the run.
  for (const bool chief_finishes : {true, false}) {
    CAPTURE(chief_finishes);
    scratch dir;
    const std::string chief = chief_finishes ? "sleep 0.3; exit 0" : "sleep 60 & wait";
    const std::string script = R"(if [ -z "$TROUPE_JOIN" ]; then record; fi
if [ "$i" = 1 ] && [ -z "$TROUPE_JOIN" ]; then await 0; kill -9 $$; fi
if [ "$i" = 1 ]; then echo "refused" > "$D/refused"; exit 1; fi
n=0; while [ ! -e "$D/refused" ]; do n=$((n+1)); [ $n -gt 400 ] && exit 98; sleep 0.025; done
)" + chief;
    auto r = run(workers(2, script, dir, {"--elastic", "--min", "1", "--max-restarts", "1", "--grace", "0.5"}), dir);
    REQUIRE(r.finished);
    CHECK(r.exit_code == (chief_finishes ? 0 : 1));
    CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: starting a replacement for worker 1 \(1 of 1\))")));
    CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 1 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\), a replacement, )"
                                              R"(exited with status 1 after the chief finished the training)")) ==
          chief_finishes);
    CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 1 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) exited with )"
                                              R"(status 1; stopping the others)")) == !chief_finishes);
  }
}

TEST_CASE("troupe-launch --elastic kills a worker stopped past the heartbeat limit as lost, not waiting for --timeout") {
  scratch dir;
  // Rank 2 stops itself; with a 50 ms heartbeat and 2 missed beats the limit is 150 ms.
  const std::string script = R"(record
if [ "$i" = 2 ]; then await 0 1; kill -STOP $$; fi
sleep 1.5; exit 0)";
  auto r = run(workers(3, script, dir, {"--elastic", "--min", "2", "--timeout", "20"}), dir,
               {"TROUPE_HEARTBEAT_MS=50", "TROUPE_MISSED_HEARTBEATS=2"});
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(r.seconds < 10);
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 2 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) has been )"
                                            R"(stopped for [0-9.]+ s, past the heartbeat limit)")));
  CHECK(std::regex_search(r.err, std::regex(R"(worker 2 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) was killed by signal 9 )"
                                            R"(\(SIGKILL\); --elastic: the 2 others go on without it)")));
  CHECK(r.err.find("timed out") == std::string::npos);
}

TEST_CASE("troupe-launch --host-discovery-script adds a joining worker and removes it, neither a failure") {
  // Worker 2 is started by discovery: it says what it got and waits to be removed. Asked to leave
  // (SIGUSR2), it leaves (exit 0); one that ignores the request is killed after --leave-timeout.
  for (const bool leaves : {true, false}) {
    CAPTURE(leaves);
    scratch dir;
    const std::string hosts = dir.path() + "/hosts";
    const std::string discover = dir.path() + "/discover.sh";
    std::ofstream(hosts) << "localhost:3\n";
    std::ofstream(discover) << "#!/bin/sh\ncat '" << hosts << "'\n";
    ::chmod(discover.c_str(), 0755);
    // The others shrink the list once it runs, and wait (bounded) until it is gone.
    const std::string on_leave = leaves ? "trap 'exit 0' USR2" : "trap '' USR2";
    const std::string script = R"(record
if [ "$i" = 2 ]; then echo "join=$TROUPE_JOIN config=$TF_CONFIG"; )" + on_leave + R"(; sleep 60 & wait; exit 3; fi
await 2
[ "$i" = 0 ] && echo "127.0.0.1:2" > "$D/hosts.new" && mv "$D/hosts.new" "$D/hosts"
p=$(cut -d' ' -f1 "$D/pid.2"); n=0
while kill -0 "$p" 2>/dev/null; do n=$((n+1)); [ $n -gt 400 ] && exit 97; sleep 0.025; done
exit 0)";
    auto r = run(workers(2, script, dir,
                         {"--elastic", "--min", "2", "--max", "3", "--host-discovery-script", discover,
                          "--discovery-interval", "0.1", "--leave-timeout", "0.5"}),
                 dir);
    REQUIRE(r.finished);
    CHECK(r.exit_code == 0);
    const std::vector<std::string> two = lines_of_rank(r.out, 2);
    REQUIRE(two.size() == 1);
    // It joins as the third task of a cluster of three, and its port is its own.
    const std::smatch m = [&] {
      std::smatch found;
      std::regex_match(two[0], found, std::regex(R"(join=1 config=(.*))"));
      return found;
    }();
    REQUIRE(m.size() == 2);
    const auto config = nlohmann::json::parse(m[1].str());
    CHECK(config["task"]["index"] == 2);
    REQUIRE(config["cluster"]["worker"].size() == 3);
    const std::set<std::string> ports(config["cluster"]["worker"].begin(), config["cluster"]["worker"].end());
    CHECK(ports.size() == 3);
    CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: host discovery: the hosts are now 127\.0\.0\.1:3 \(3 slots\): )"
                                              R"(removing 0, adding 1 worker\n)"
                                              R"(troupe-launch: host discovery: starting worker 2 on 127\.0\.0\.1 )"
                                              R"(\(127\.0\.0\.1:[0-9]+\); it joins the running cluster\n)")));
    CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: removing worker 2 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) from )"
                                              R"(127\.0\.0\.1: asking it to leave \(SIGUSR2; SIGKILL after 0\.5 s\); the )"
                                              R"(others go on without it from its next step boundary\n)")));
    const std::string timed_out = R"(worker 2 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) did not leave within 0\.5 s of SIGUSR2 )"
                                  R"(\(--leave-timeout\); killing it \(SIGKILL\); the others drop it as a lost worker and go on\n)";
    CHECK(std::regex_search(r.err, std::regex(timed_out)) == !leaves);
    CHECK(std::regex_search(r.err, std::regex(std::string(R"(worker 2 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) left \()") +
                                              (leaves ? "exited with status 0" : "killed by SIGKILL") +
                                              R"(\), removed by host discovery; not a failure\n)")));
    CHECK(r.err.find("stopping the others") == std::string::npos);
    CHECK(r.err.find("replacement") == std::string::npos);
    check_no_worker_left(dir, 3);
  }
}

TEST_CASE("troupe-launch host discovery: a worker added that fails after the chief finished came too late, no failure") {
  scratch dir;
  const std::string discover = dir.path() + "/discover.sh";
  std::ofstream(discover) << "#!/bin/sh\necho localhost:3\n";
  ::chmod(discover.c_str(), 0755);
  // Worker 2 (added) waits for the chief to end and then fails, as a joiner whose chief is gone
  // does; before the chief ends, the same failure stops the run (second launch).
  const std::string late = R"(record
if [ "$i" = 2 ]; then p=$(cut -d' ' -f1 "$D/pid.0"); n=0
  while kill -0 "$p" 2>/dev/null; do n=$((n+1)); [ $n -gt 400 ] && exit 97; sleep 0.025; done; exit 1; fi
await 2; exit 0)";
  auto r = run(workers(2, late, dir, {"--elastic", "--max", "3", "--host-discovery-script", discover}), dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 2 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\), added by host )"
                                            R"(discovery, exited with status 1 after the chief finished the training)")));
  scratch early;
  auto e = run(workers(2, R"(record
if [ "$i" = 2 ]; then exit 1; fi
sleep 60 & wait)", early, {"--elastic", "--max", "3", "--host-discovery-script", discover}), early);
  REQUIRE(e.finished);
  CHECK(e.exit_code == 1);
  CHECK(std::regex_search(e.err, std::regex(R"(troupe-launch: worker 2 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) exited with )"
                                            R"(status 1; stopping the others)")));
}

TEST_CASE("troupe-launch host discovery names a failing, a hanging and a malformed script while the workers run") {
  scratch dir;
  const std::string discover = dir.path() + "/discover.sh";
  // Each run of the script does the next thing in $D/mode: exit 3, hang, print a bad line.
  std::ofstream(discover) << "#!/bin/sh\nmode=$(cat '" << dir.path() << "/mode')\n"
                          << "[ \"$mode\" = fail ] && exit 3\n"
                          << "[ \"$mode\" = hang ] && { sleep 60 & echo $! > '" << dir.path() << "/sleep'; wait; }\n"
                          << "printf 'localhost:2\\nlocalhost:x\\n'\n";
  ::chmod(discover.c_str(), 0755);
  std::ofstream(dir.path() + "/mode") << "fail\n";
  // The launcher's stderr is read after the run: worker 0 switches the mode on a timer, giving
  // the script time to do each thing.
  const std::string timed = R"(record
[ "$i" = 1 ] && { sleep 4; exit 0; }
sleep 1; echo hang > "$D/mode"; sleep 1.5; echo bad > "$D/mode"; sleep 1; exit 0)";
  auto r = run(workers(2, timed, dir,
                       {"--elastic", "--host-discovery-script", discover, "--discovery-interval", "0.1",
                        "--discovery-timeout", "0.5"}),
               dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  const std::string head = "troupe-launch: host discovery: '" + discover + "' ";
  CHECK(r.err.find(head + "exited with status 3; the workers stay as they are\n") != std::string::npos);
  CHECK(r.err.find(head + "did not finish within 0.5 s (--discovery-timeout); killed it (SIGKILL); the workers stay "
                          "as they are\n") != std::string::npos);
  CHECK(r.err.find(head + "printed a bad list, line 2 ('localhost:x'): expected host:slots with slots 1..256; the "
                          "workers stay as they are\n") != std::string::npos);
  // Each trouble is said once while it lasts.
  CHECK(r.err.find(head + "exited with status 3") == r.err.rfind(head + "exited with status 3"));
  // The hanging script's sleep was killed with it.
  const pid_t sleeper = static_cast<pid_t>(std::stol(read_file(dir.path() + "/sleep")));
  CHECK(still_alive({sleeper}, 2000ms).empty());
  CHECK(r.err.find("host discovery: starting") == std::string::npos);
  check_no_worker_left(dir, 2);
}

TEST_CASE("troupe-launch host discovery reads host:slots lines and names a bad one by its number") {
  using troupe::launch::discovery_error;
  using troupe::launch::host_slots;
  using troupe::launch::parse_discovery_output;
  auto a = parse_discovery_output("# the hosts\nlocalhost:2\n\n", 8);
  CHECK(a.hosts == std::vector<host_slots>{{"127.0.0.1", 2}});
  CHECK(a.total == 2);
  CHECK(a.note.empty());
  CHECK(parse_discovery_output("127.0.0.1", 8).hosts == std::vector<host_slots>{{"127.0.0.1", 1}});
  // Over --max: cut down, said.
  auto capped = parse_discovery_output("localhost:6\n", 4);
  CHECK(capped.hosts == std::vector<host_slots>{{"127.0.0.1", 4}});
  CHECK(capped.note == "the hosts list 6 slots; capped at --max 4");

  auto message = [](const std::string& text) {
    try {
      parse_discovery_output(text, 8);
    } catch (const discovery_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message("localhost:2\nlocalhost:0\n") == "line 2 ('localhost:0'): expected host:slots with slots 1..256");
  CHECK(message("localhost:257") == "line 1 ('localhost:257'): expected host:slots with slots 1..256");
  CHECK(message("localhost:2x") == "line 1 ('localhost:2x'): expected host:slots with slots 1..256");
  CHECK(message("\n\nlocal host:2") == "line 3 ('local host:2'): expected host or host:slots (a host name or IPv4 address)");
  CHECK(message("localhost:1\n127.0.0.1:2") ==
        "line 2 ('127.0.0.1:2'): '127.0.0.1' is 127.0.0.1 again, named on line 1 (give each host once)");
  CHECK(message("gpu-node-7:4") ==
        "line 1 ('gpu-node-7:4'): 'gpu-node-7' is not this machine; discovered workers start on 127.0.0.1 only (a host "
        "elsewhere would need --rsh, which host discovery does not support)");
  CHECK(message("# nothing\n\n") == "the output names no host (expected host or host:slots lines)");
  CHECK(message(std::string("localhost:1\n\x01\x02:1")) ==
        "line 2 ('??:1'): expected host or host:slots (a host name or IPv4 address)");
}

TEST_CASE("troupe-launch host discovery adds up to --max and removes the newest, never the chief nor below --min") {
  using troupe::launch::host_membership;
  using troupe::launch::host_slots;
  using troupe::launch::worker;
  troupe::launch::launch_options options;
  options.num_workers = 3;
  options.min_workers = 2;
  options.max_workers = 5;
  auto running = [](int n) {
    std::vector<worker> w;
    for (int r = 0; r < n; ++r) {
      w.emplace_back(r, "127.0.0.1:" + std::to_string(4000 + r));
      w.back().running = true;
    }
    return w;
  };
  const std::vector<host_slots> local = {{"127.0.0.1", 3}};
  {
    host_membership m(options, local, 3);
    auto w = running(3);
    CHECK(m.plan({{"127.0.0.1", 3}}, w).add.empty());
    auto grow = m.plan({{"127.0.0.1", 9}}, w);  // at most --max 5 slots taken
    CHECK(grow.add == std::vector<std::string>{"127.0.0.1", "127.0.0.1"});
    CHECK(grow.notes == std::vector<std::string>{"not adding a worker on 127.0.0.1: 5 slots are taken, --max 5"});
    auto shrink = m.plan({{"127.0.0.1", 2}}, w);
    CHECK(shrink.remove == std::vector<int>{2});
    CHECK(shrink.add.empty());
  }
  {
    // Never below --min 2, and never the chief.
    host_membership m(options, local, 3);
    auto w = running(3);
    auto one = m.plan({{"127.0.0.1", 1}}, w);
    CHECK(one.remove == std::vector<int>{2});
    CHECK(one.notes == std::vector<std::string>{"keeping 2 workers running: removing more would leave fewer than --min 2"});
    options.min_workers = 1;
    host_membership chief(options, local, 3);
    auto c = chief.plan({{"127.0.0.1", 1}}, running(3));
    CHECK(c.remove == std::vector<int>{2, 1});
    auto two = running(2);
    auto keep = chief.plan({}, two);  // the script lists no slot at all: only the chief would be left
    CHECK(keep.remove == std::vector<int>{1});
    CHECK(keep.notes == std::vector<std::string>{
                            "keeping worker 0 on 127.0.0.1: it is the chief, which holds the cluster's membership"});
    options.min_workers = 2;
  }
  {
    // A removed worker is no longer counted; a lost one keeps its slot until the list shrinks.
    host_membership m(options, local, 3);
    auto w = running(3);
    m.removing(2);
    CHECK(m.removed(2));
    w[2].running = false;
    CHECK(m.plan({{"127.0.0.1", 3}}, w).add == std::vector<std::string>{"127.0.0.1"});
    host_membership lost(options, local, 3);
    auto l = running(3);
    l[1].running = false;  // lost on its own
    CHECK(lost.plan({{"127.0.0.1", 3}}, l).add.empty());
    auto fewer = lost.plan({{"127.0.0.1", 2}}, l);  // its slot goes first: nothing to stop
    CHECK(fewer.remove.empty());
    CHECK(lost.plan({{"127.0.0.1", 3}}, l).add == std::vector<std::string>{"127.0.0.1"});
  }
}

TEST_CASE("troupe-launch --max-restarts gives up with the last failure's status") {
  scratch dir;
  auto r = run(workers(2, R"(echo x >> "$D/starts.$i"; n=$((TROUPE_RESTART_COUNT + 1))
if [ "$i" = 1 ]; then exit $((4 + n)); fi
sleep 60 & wait)",
                       dir, {"--max-restarts", "1", "--restart-backoff", "0"}),
               dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 6);  // the second run's failure, not the first's 5
  CHECK(read_file(dir.path() + "/starts.1") == "x\nx\n");
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: giving up after 1 restart; the last failure: worker 1 )"
                                            R"(\(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) exited with status 6 \(exit status 6\)\n)")));
  // Without --max-restarts nothing is restarted.
  scratch once;
  auto r0 = run(workers(1, R"(echo x >> "$D/starts.$i"; exit 5)", once), once);
  CHECK(r0.exit_code == 5);
  CHECK(read_file(once.path() + "/starts.0") == "x\n");
  CHECK(r0.err.find("restarting") == std::string::npos);
}

TEST_CASE("troupe-launch --ps with --max-restarts restarts a lost ps task alone on its address, within the budget") {
  // The task's type from TF_CONFIG; every start appends its pid to starts.<type>.
  const std::string typed = R"(t=${TF_CONFIG##*'"type": "'}; t=${t%%\"*}; echo $$ >> "$D/starts.$t"
)";
  scratch dir;
  auto r = run(workers(1, typed + R"(case $t in
ps) if [ ! -e "$D/config.ps" ]; then echo "$TF_CONFIG" > "$D/config.ps"; echo "$TROUPE_PS_RESTART_WAIT_S" > "$D/wait.ps"; exit 3; fi
    echo "$TF_CONFIG" > "$D/config2.ps"; n=0; while [ ! -e "$D/done" ]; do n=$((n+1)); [ $n -gt 400 ] && exit 99; sleep 0.025; done ;;
chief) n=0; while [ ! -e "$D/config2.ps" ]; do n=$((n+1)); [ $n -gt 400 ] && exit 98; sleep 0.025; done; touch "$D/done" ;;
*) n=0; while [ ! -e "$D/done" ]; do n=$((n+1)); [ $n -gt 400 ] && exit 97; sleep 0.025; done ;;
esac)",
                       dir, {"--chief", "--ps", "1", "--max-restarts", "1", "--restart-backoff", "0"}),
               dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  auto lines = [](const std::string& text) { return std::count(text.begin(), text.end(), '\n'); };
  CHECK(lines(read_file(dir.path() + "/starts.chief")) == 1);  // the chief and the worker kept running
  CHECK(lines(read_file(dir.path() + "/starts.worker")) == 1);
  CHECK(lines(read_file(dir.path() + "/starts.ps")) == 2);
  CHECK(read_file(dir.path() + "/config2.ps") == read_file(dir.path() + "/config.ps"));  // its same address
  CHECK(read_file(dir.path() + "/wait.ps") == "30\n");  // the chief's wait: 30 s plus the backoff
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 2 \(pid [0-9]+, (127\.0\.0\.1:[0-9]+)\) exited with )"
                                            R"(status 3; restarting it alone on \1 \(restart 1 of 1\) in 0 s; the other tasks )"
                                            R"(keep running\n)")));
  CHECK(r.err.find("restarting all") == std::string::npos);

  // A ps task that fails again, past --max-restarts: the launch gives up with its status.
  scratch again;
  auto r2 = run(workers(1, typed + R"(if [ $t = ps ]; then exit 3; fi; sleep 60 & wait)", again,
                        {"--chief", "--ps", "1", "--max-restarts", "1", "--restart-backoff", "0"}),
                again);
  REQUIRE(r2.finished);
  CHECK(r2.exit_code == 3);
  CHECK(lines(read_file(again.path() + "/starts.ps")) == 2);
  CHECK(lines(read_file(again.path() + "/starts.chief")) == 1);
  CHECK(std::regex_search(r2.err, std::regex(R"(troupe-launch: giving up after 1 restart; the last failure: worker 2 )"
                                             R"(\(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) exited with status 3 \(exit status 3\)\n)")));
}

TEST_CASE("troupe-launch rejects bad usage with exit status 2 and says what is wrong") {
  struct bad_usage {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<bad_usage> cases = {
      {{}, "missing -n N (the number of workers)"},
      {{"-n", "2"}, "no program to run (expected: -- program args...)"},
      {{"-n", "2", "--"}, "no program to run (expected: -- program args...)"},
      {{"-n"}, "--num-workers: 1 required N missing"},
      {{"-n", "0", "--", "/bin/true"}, "-n: expected a positive number of workers (1..256), got '0'"},
      {{"-n", "-3", "--", "/bin/true"}, "-n: expected a positive number of workers (1..256), got '-3'"},
      {{"-n", "abc", "--", "/bin/true"}, "-n: expected a positive number of workers (1..256), got 'abc'"},
      {{"-n", "2x", "--", "/bin/true"}, "-n: expected a positive number of workers (1..256), got '2x'"},
      {{"-n", "100000000000000000000", "--", "/bin/true"},
       "-n: expected a positive number of workers (1..256), got '100000000000000000000'"},
      {{"-n", "2", "--frobnicate", "--", "/bin/true"}, "unknown option '--frobnicate'"},
      {{"-n", "2", "--timeout", "0", "--", "/bin/true"}, "--timeout: expected a number of seconds > 0, got '0'"},
      {{"-n", "2", "--timeout", "soon", "--", "/bin/true"}, "--timeout: expected a number of seconds > 0, got 'soon'"},
      {{"-n", "2", "--devices-per-worker", "none", "--", "/bin/true"},
       "--devices-per-worker: expected a positive number of devices (1..1024), got 'none'"},
      {{"-n", "2", "--max-restarts", "-1", "--", "/bin/true"},
       "--max-restarts: expected a number of restarts (0..1000), got '-1'"},
      {{"-n", "2", "--restart-backoff", "later", "--", "/bin/true"},
       "--restart-backoff: expected a number of seconds >= 0, got 'later'"},
      {{"-n", "2", "--port-base", "65535", "--", "/bin/true"},
       "--port-base 65535: ports up to 65536 for 2 workers (expected at most 65535)"},
      {{"-n", "3", "--min", "2", "--", "/bin/true"}, "--min needs --elastic"},
      {{"-n", "3", "--elastic", "--min", "4", "--", "/bin/true"},
       "--min: expected a number of workers (1..3), got '4'"},
      {{"-n", "3", "--elastic", "--max", "2", "--", "/bin/true"},
       "--max: expected a number of workers (3..65536, at least -n), got '2'"},
      {{"-n", "2", "--host-discovery-script", "/bin/true", "--", "/bin/true"}, "--host-discovery-script needs --elastic"},
      {{"-n", "2", "--elastic", "--host-discovery-script", "/nonexistent/discover", "--", "/bin/true"},
       "--host-discovery-script: '/nonexistent/discover' is not an executable file"},
      {{"--hosts", "127.0.0.1:1,node7:2", "--elastic", "--host-discovery-script", "/bin/true", "--", "/bin/true"},
       "--host-discovery-script starts workers on this machine only (127.0.0.1, localhost): host 'node7' would need "
       "--rsh, which host discovery does not support"},
      {{"-n", "2", "--chief", "--elastic", "--host-discovery-script", "/bin/true", "--", "/bin/true"},
       "--host-discovery-script adds and removes MultiWorkerMirroredStrategy workers; not with --ps or --chief"},
      {{"-n", "2", "--elastic", "--host-discovery-script", "/bin/true", "--discovery-interval", "0", "--", "/bin/true"},
       "--discovery-interval: expected a number of seconds > 0, got '0'"},
      {{"-n", "2", "--elastic", "--host-discovery-script", "/bin/true", "--discovery-timeout", "never", "--", "/bin/true"},
       "--discovery-timeout: expected a number of seconds > 0, got 'never'"},
      {{"-n", "2", "--discovery-interval", "2", "--", "/bin/true"}, "--discovery-interval needs --host-discovery-script"},
      {{"-n", "2", "--elastic", "--host-discovery-script", "/bin/true", "--leave-timeout", "-1", "--", "/bin/true"},
       "--leave-timeout: expected a number of seconds > 0, got '-1'"},
      {{"-n", "2", "--leave-timeout", "5", "--", "/bin/true"}, "--leave-timeout needs --host-discovery-script"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.message);
    scratch dir;
    auto r = run(c.args, dir, {}, 5s);
    REQUIRE(r.finished);
    CHECK(r.exit_code == 2);
    CHECK(r.err.rfind("troupe-launch: " + c.message + "\n", 0) == 0);
    CHECK(r.err.find("Run with --help for more information.") != std::string::npos);
    CHECK(r.out == "");
  }
}

TEST_CASE("troupe-launch prints its usage for --help and exits 0") {
  scratch dir;
  auto r = run({"--help"}, dir, {}, 5s);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(r.out.rfind("troupe-launch -n N [options] [--] program [args...]\n", 0) == 0);
  CHECK(r.out.find("Usage: troupe-launch [OPTIONS]") != std::string::npos);
  CHECK(r.out.find("--grace SECONDS=5") != std::string::npos);  // the defaults shown
  CHECK(r.err == "");
}

TEST_CASE("troupe-launch exits 127 when the program cannot be executed") {
  scratch dir;
  std::string not_executable = dir.path() + "/not-executable";
  std::ofstream(not_executable) << "#!/bin/sh\nexit 0\n";
  ::chmod(not_executable.c_str(), 0644);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/nonexistent/troupe-no-such-program",
       "cannot execute '/nonexistent/troupe-no-such-program': No such file or directory"},
      {"troupe-no-such-program-4f2a", "cannot execute 'troupe-no-such-program-4f2a': command not found in PATH"},
      {not_executable, "cannot execute '" + not_executable + "': Permission denied"},
  };
  for (const auto& [program, message] : cases) {
    CAPTURE(program);
    auto r = run({"-n", "2", "--", program, "arg"}, dir, {}, 5s);
    REQUIRE(r.finished);
    CHECK(r.exit_code == 127);
    CHECK(r.err == "troupe-launch: " + message + "\n");
    CHECK(r.out == "");
  }
}

TEST_CASE("troupe-launch --port-base uses consecutive ports and refuses a busy one") {
  scratch dir;
  {
    bound_socket busy(0, true);
    REQUIRE(busy.ok());
    auto r = run({"-n", "2", "--port-base", std::to_string(busy.port()), "--", "/bin/true"}, dir, {}, 5s);
    REQUIRE(r.finished);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("troupe-launch: port " + std::to_string(busy.port()) + " on 127.0.0.1 is in use") !=
          std::string::npos);
  }
  // Three consecutive free ports, as far as one can tell before the launcher looks again.
  int base = 0;
  for (int attempt = 0; attempt < 50 && base == 0; ++attempt) {
    int candidate = bound_socket(0, false).port();
    if (candidate == 0 || candidate > 65533) continue;
    bound_socket second(candidate + 1, false), third(candidate + 2, false);
    if (second.ok() && third.ok()) base = candidate;
  }
  REQUIRE(base != 0);
  auto r = run(workers(3, R"(echo "TF_CONFIG=$TF_CONFIG")", dir, {"--port-base", std::to_string(base)}), dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(cluster_ports(r.out, 3) == std::vector<int>{base, base + 1, base + 2});
}

TEST_CASE("troupe-launch line_prefixer holds a partial line until its newline or finish") {
  line_prefixer lines("[rank 2] ");
  CHECK(lines.feed("a\nb", 3) == "[rank 2] a\n");
  CHECK(lines.held_bytes() == 1);
  CHECK(lines.feed("c", 1) == "");
  CHECK(lines.feed("\n\nd\n", 4) == "[rank 2] bc\n[rank 2] \n[rank 2] d\n");
  CHECK(lines.finish() == "");
  CHECK(lines.feed("tail", 4) == "");
  CHECK(lines.finish() == "[rank 2] tail\n");
  CHECK(lines.held_bytes() == 0);
}

TEST_CASE("troupe-launch line_prefixer cuts a line longer than its bound into lines") {
  line_prefixer lines("> ", 4);
  CHECK(lines.feed("ab", 2) == "");
  CHECK(lines.feed("cdefghij\n", 9) == "> abcd\n> efgh\n> ij\n");
  CHECK(lines.feed("wxyz\n", 5) == "> wxyz\n");
  CHECK(lines.feed("1234", 4) == "> 1234\n");
  CHECK(lines.feed("\n", 1) == "> \n");
  CHECK(lines.finish() == "");
}

TEST_CASE("troupe-launch builds TF_CONFIG with the cluster and the task index") {
  auto addresses = troupe::launch::worker_addresses({40000, 40001});
  CHECK(addresses == std::vector<std::string>{"127.0.0.1:40000", "127.0.0.1:40001"});
  auto config = nlohmann::json::parse(troupe::launch::tf_config_json(addresses, 1));
  CHECK(config == nlohmann::json::parse(
                      R"({"cluster": {"worker": ["127.0.0.1:40000", "127.0.0.1:40001"]}, "task": {"type": "worker", "index": 1}})"));
}

TEST_CASE("troupe-launch builds TF_CONFIG with roles: a chief, the workers and the ps tasks") {
  const std::vector<std::string> a{"h:1", "h:2", "h:3", "h:4"};
  const auto cluster = nlohmann::json::parse(R"({"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]})");
  const char* types[] = {"chief", "worker", "worker", "ps"};
  const int indices[] = {0, 0, 1, 0};
  for (int rank = 0; rank < 4; ++rank) {
    auto config = nlohmann::json::parse(troupe::launch::tf_config_json(a, rank, true, 1));
    CHECK(config["cluster"] == cluster);
    CHECK(config["task"]["type"] == types[rank]);
    CHECK(config["task"]["index"] == indices[rank]);
  }
  auto options = troupe::launch::parse_launch_options({"--ps", "1", "-n", "2", "--chief", "--", "prog"});
  CHECK(options.num_workers == 4);  // processes: the chief, 2 workers and the ps task
  CHECK(options.ps == 1);
  CHECK(options.chief);
  CHECK_THROWS_AS(troupe::launch::parse_launch_options({"--ps", "0", "-n", "2", "prog"}),
                  troupe::launch::usage_error);
  CHECK_THROWS_AS(troupe::launch::parse_launch_options({"--hosts", "a:2", "--ps", "1", "--chief", "prog"}),
                  troupe::launch::usage_error);
}

TEST_CASE("troupe-launch picks distinct free ports from the kernel") {
  auto ports = troupe::launch::pick_free_ports(8, std::nullopt);
  REQUIRE(ports.size() == 8);
  CHECK(std::set<int>(ports.begin(), ports.end()).size() == 8);
  for (int port : ports) CHECK(bound_socket(port, true).ok());
}

TEST_CASE("troupe-launch parses options with or without -- and with attached values") {
  using troupe::launch::parse_launch_options;
  auto a = parse_launch_options({"-n4", "--devices-per-worker=2", "--timeout", "1.5", "prog", "-n", "x"});
  CHECK(a.num_workers == 4);
  CHECK(a.devices_per_worker == 2);
  CHECK(a.timeout_s == 1.5);
  CHECK(a.grace_s == troupe::launch::default_grace_s);
  CHECK(a.program == std::vector<std::string>{"prog", "-n", "x"});
  auto b = parse_launch_options({"--num-workers=3", "--grace", "0", "--port-base", "5000", "--", "--prog"});
  CHECK(b.num_workers == 3);
  CHECK(b.grace_s == 0);
  CHECK(b.port_base == 5000);
  CHECK(b.program == std::vector<std::string>{"--prog"});
  CHECK_THROWS_WITH_AS(parse_launch_options({"-n", "300", "--", "p"}),
                       "-n: expected a positive number of workers (1..256), got '300'",
                       troupe::launch::usage_error);
}

TEST_CASE("troupe-launch parses --hosts, a hostfile, --rsh and --ranks, and refuses what does not add up") {
  using troupe::launch::host_slots;
  using troupe::launch::parse_launch_options;
  auto a = parse_launch_options({"--hosts", "h1:2,h2", "--rsh", "ssh -o BatchMode=yes", "--ranks=0,2", "--", "p"});
  CHECK(a.num_workers == 3);
  CHECK(a.hosts == std::vector<host_slots>{{"h1", 2}, {"h2", 1}});
  CHECK(a.rsh == std::vector<std::string>{"ssh", "-o", "BatchMode=yes"});
  CHECK(a.ranks == std::vector<int>{0, 2});
  CHECK(troupe::launch::host_addresses(a.hosts, 23456) ==
        std::vector<std::string>{"h1:23456", "h1:23457", "h2:23456"});
  CHECK(parse_launch_options({"-n", "3", "--hosts", "h1:2,h2", "p"}).num_workers == 3);

  scratch dir;
  const std::string hostfile = dir.path() + "/hosts";
  std::ofstream(hostfile) << "# the cluster\nnode1 slots=4\n\nnode2:2  # two\nnode3\n";
  auto b = parse_launch_options({"--hostfile", hostfile, "p"});
  CHECK(b.hosts == std::vector<host_slots>{{"node1", 4}, {"node2", 2}, {"node3", 1}});
  CHECK(b.num_workers == 7);
  CHECK(b.rsh == std::vector<std::string>{"ssh"});

  auto message = [](std::vector<std::string> args) {
    try {
      parse_launch_options(args);
    } catch (const troupe::launch::usage_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message({"-n", "2", "--hosts", "h1:2,h2", "p"}) ==
        "-n 2 but the hosts have 3 slots (give one of them, or make them agree)");
  CHECK(message({"--hosts", "h1:0", "p"}) == "--hosts: expected a number of workers per host (1..256), got '0'");
  CHECK(message({"--hosts", "h1,,h2", "p"}) == "--hosts: an empty entry in 'h1,,h2'");
  CHECK(message({"--hosts", "h1", "--hostfile", hostfile, "p"}) == "give --hosts or --hostfile, not both");
  CHECK(message({"-n", "2", "--ranks", "2", "p"}) == "--ranks: expected a rank 0..1, got '2'");
  // Under host discovery the ranks up to --max may be shown.
  CHECK(parse_launch_options({"-n", "2", "--elastic", "--max", "4", "--host-discovery-script", "/bin/true", "--ranks",
                              "3", "p"})
            .ranks == std::vector<int>{3});
  CHECK(message({"-n", "2", "--elastic", "--max", "4", "--host-discovery-script", "/bin/true", "--ranks", "4", "p"}) ==
        "--ranks: expected a rank 0..3, got '4'");
  std::ofstream(dir.path() + "/bad") << "node1 cpus=4\n";
  CHECK(message({"--hostfile", dir.path() + "/bad", "p"}) ==
        "--hostfile: " + dir.path() + "/bad:1: expected \"host slots=N\", got 'node1 cpus=4'");
  CHECK(message({"--hostfile", dir.path() + "/none", "p"}) == "--hostfile: cannot read '" + dir.path() + "/none'");
}
