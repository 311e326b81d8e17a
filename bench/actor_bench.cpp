// troupe's remote actor request on loopback, the numbers bench/actor_bench.sh sets beside Ray's
// actor calls. Two processes: this one forks a task (a Server hosting an "echo" actor type) and
// spawns the actor there through an ActorCluster, as an application does; then it measures
//   - the round trip of a small synchronous request (ActorHandle::request, one float32);
//   - asynchronous throughput: small requests with a window in flight (request_async), and one-way
//     sends (ActorHandle::send, closed by one request: messages from one thread arrive in order);
//   - the round trip of a 1 MiB tensor argument (echoed back), against the loopback floor: the
//     same 1 MiB echoed over a bare TCP socket between two processes.
// Usage: actor_bench [--token] [--iters N] [--messages N] [--window W]
// Prints one "troupe <what>: <value> <unit> ..." line per measurement.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "troupe/troupe.hpp"

namespace td = troupe::distribute;
using troupe::Tensor;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// echo(ts...) -> ts: the reply carries what the request did.
class Echo : public td::Actor {
 public:
  std::vector<Tensor> receive(const std::string&, const std::vector<Tensor>& tensors) override { return tensors; }
};

td::FunctionRegistry registry() {
  td::FunctionRegistry r;
  r.add_actor("echo", [](const std::vector<Tensor>&) -> std::unique_ptr<td::Actor> { return std::make_unique<Echo>(); });
  return r;
}

std::uint16_t free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("actor_bench: free port");
    std::exit(1);
  }
  close(fd);
  return ntohs(a.sin_port);
}

bool io_all(int fd, char* data, std::size_t n, bool write) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = write ? ::send(fd, data + done, n - done, MSG_NOSIGNAL) : ::recv(fd, data + done, n - done, 0);
    if (r <= 0) return false;
    done += static_cast<std::size_t>(r);
  }
  return true;
}

// The loopback floor: `bytes` sent to another process over TCP and echoed back; the median round
// trip in seconds.
double tcp_echo_floor(std::size_t bytes, int iters) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("actor_bench: floor listener");
    std::exit(1);
  }
  const pid_t child = fork();
  if (child == 0) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) _exit(1);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::vector<char> buf(bytes);
    while (io_all(fd, buf.data(), bytes, false) && io_all(fd, buf.data(), bytes, true)) {
    }
    _exit(0);
  }
  int fd = accept(listener, nullptr, nullptr);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<char> out(bytes, 1), in(bytes);
  std::vector<double> times;
  for (int i = 0; i < iters + 3; ++i) {
    const auto start = clock_type::now();
    if (!io_all(fd, out.data(), bytes, true) || !io_all(fd, in.data(), bytes, false)) {
      std::fprintf(stderr, "actor_bench: the floor's echo process failed\n");
      std::exit(1);
    }
    if (i >= 3) times.push_back(seconds_since(start));
  }
  close(fd);
  close(listener);
  waitpid(child, nullptr, 0);
  return median(times);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"troupe's remote actor request on loopback (bench/actor_bench.sh sets it beside Ray)."};
  bool with_token = false;
  bool control_plane = false;
  int iters = 5000, messages = 100000, window = 1000, big_iters = 50;
  app.add_flag("--token", with_token, "spawn and talk over mutual TLS from a cluster token (default: plain loopback)");
  app.add_flag("--control-plane", control_plane,
               "messages over the control plane (CAF's BASP) rather than the actor data connection");
  app.add_option("--iters", iters, "small synchronous round trips")->check(CLI::Range(10, 10000000));
  app.add_option("--messages", messages, "small messages for the throughput runs")->check(CLI::Range(100, 100000000));
  app.add_option("--window", window, "asynchronous requests in flight")->check(CLI::Range(1, 100000));
  app.add_option("--big-iters", big_iters, "1 MiB round trips")->check(CLI::Range(3, 100000));
  CLI11_PARSE(app, argc, argv);

  const std::size_t mib = std::size_t{1} << 20;
  // The floor first, before any runtime thread exists in this process (it forks).
  const double floor_small = tcp_echo_floor(4, std::max(iters, 100));
  const double floor_big = tcp_echo_floor(mib, big_iters);

  const std::string spec_json = "127.0.0.1:" + std::to_string(free_port());
  const std::string task_json = "127.0.0.1:" + std::to_string(free_port());
  td::ClusterSpec spec(td::ClusterSpec::JobMap{{"chief", {spec_json}}, {"worker", {task_json}}});
  const std::string token = with_token ? "actor-bench-token-0123456789abcdef" : "";
  int ready[2], done[2];
  if (pipe(ready) != 0 || pipe(done) != 0) return 1;
  const pid_t task = fork();
  if (task == 0) {
    // The task: a Server hosting the echo actor until the bench closes the pipe.
    close(ready[0]);
    close(done[1]);
    troupe::Runtime rt;
    td::ServerOptions so;
    so.cluster_token = token;
    so.log = [](const std::string&) {};
    td::Server server(rt, spec, "worker", 0, registry(), so);
    char c = 1;
    (void)!write(ready[1], &c, 1);
    (void)!read(done[0], &c, 1);  // EOF: the bench ended
    _exit(0);
  }
  close(ready[1]);
  close(done[0]);
  char c = 0;
  if (read(ready[0], &c, 1) != 1) {
    std::fprintf(stderr, "actor_bench: the task did not start\n");
    return 1;
  }
  int rc = 0;
  {
    troupe::Runtime rt;
    td::ActorClusterOptions o;
    o.cluster_token = token;
    o.data_connections = !control_plane;
    o.log = [](const std::string&) {};
    // The default heartbeats (6 x 500 ms): a flood of one-way sends waits on the actor's
    // acknowledgement window rather than queueing ahead of them.
    td::ActorCluster actors(rt, spec, "chief:0", registry(), o);
    td::ActorHandle echo = actors.spawn("echo", "worker:0");
    const std::vector<Tensor> small{Tensor::scalar<float>(1.0f)};
    const char* wire = with_token ? "TLS" : "plain";

    // 1. Synchronous round trips.
    for (int i = 0; i < 200; ++i) echo.request("echo", small);
    std::vector<double> rtts;
    rtts.reserve(static_cast<std::size_t>(iters));
    const auto sync_start = clock_type::now();
    for (int i = 0; i < iters; ++i) {
      const auto t = clock_type::now();
      echo.request("echo", small);
      rtts.push_back(seconds_since(t));
    }
    const double sync_mean = seconds_since(sync_start) / iters;
    std::printf("troupe sync round trip (%s): %.1f us median, %.1f us mean over %d\n", wire, median(rtts) * 1e6,
                sync_mean * 1e6, iters);
    std::printf("troupe loopback floor round trip 4 bytes: %.1f us median\n", floor_small * 1e6);

    // 2. Asynchronous throughput: a window of requests in flight.
    {
      std::deque<td::ActorRequest> in_flight;
      const auto start = clock_type::now();
      for (int i = 0; i < messages; ++i) {
        if (static_cast<int>(in_flight.size()) >= window) {
          in_flight.front().receive();
          in_flight.pop_front();
        }
        in_flight.push_back(echo.request_async("echo", small));
      }
      while (!in_flight.empty()) {
        in_flight.front().receive();
        in_flight.pop_front();
      }
      const double s = seconds_since(start);
      std::printf("troupe async requests (%s): %.0f msgs/s (%d requests, %d in flight)\n", wire, messages / s, messages,
                  window);
    }
    {
      const auto start = clock_type::now();
      for (int i = 0; i < messages; ++i) echo.send("echo", small);
      echo.request("echo", small, std::chrono::minutes(5));  // after every send (one sender: in order)
      const double s = seconds_since(start);
      std::printf("troupe one-way sends (%s): %.0f msgs/s (%d sends)\n", wire, messages / s, messages);
    }

    // 3. 1 MiB round trips against the loopback floor.
    const std::vector<Tensor> big{Tensor::zeros({static_cast<std::int64_t>(mib / 4)})};
    for (int i = 0; i < 3; ++i) echo.request("echo", big);
    std::vector<double> big_rtts;
    for (int i = 0; i < big_iters; ++i) {
      const auto t = clock_type::now();
      auto r = echo.request("echo", big);
      big_rtts.push_back(seconds_since(t));
      if (r.size() != 1 || r[0].nbytes() != mib) {
        std::fprintf(stderr, "actor_bench: the 1 MiB echo came back wrong\n");
        rc = 1;
        break;
      }
    }
    const double big_med = median(big_rtts);
    std::printf("troupe 1 MiB round trip (%s): %.0f us median (%.0f MB/s each way)\n", wire, big_med * 1e6,
                2.0 * mib / big_med / 1e6);
    std::printf("troupe loopback floor round trip 1 MiB: %.0f us median (%.0f MB/s each way)\n", floor_big * 1e6,
                2.0 * mib / floor_big / 1e6);
    std::printf("troupe 1 MiB share of the floor (%s): %.2f\n", wire, floor_big / big_med);
  }
  close(done[1]);
  int status = 0;
  waitpid(task, &status, 0);
  return rc;
}
