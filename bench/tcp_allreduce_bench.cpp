// Cross-process all-reduce over troupe's TCP ring on loopback: N processes, float32 SUM, sizes
// from 4 B to 64 MiB. Prints per size the median time per operation of the slowest rank over
// several repetitions, algbw and busbw (nccl-tests' definitions: busbw = algbw x 2(n-1)/n).
// With --floor (2 processes) it measures the data movement of a 2-rank all-reduce instead: both
// processes send and receive the same bytes at once over one connection pair, busy-polling.
// With --compression none,fp16,bf16 every size runs each listed wire format, the repetitions
// interleaved (none, fp16, bf16, none, ...), and each row gives its ratio to the first format's
// median. A compressed operation is what CommunicationOptions::compression does: round the float32
// buffer to 16 bits, all-reduce those, widen the result back; SIZE and algbw count float32 bytes.
//
// With --token every frame carries its integrity tag (as in a cluster with TROUPE_CLUSTER_TOKEN);
// --tag-hashing says where a rank hashes its large frames (tcp_ring_options::hash_tags: auto,
// beside its thread, in line on it).
// --segment-bytes sets the ring's pipelining unit (tcp_ring_options::segment_bytes) and --spin-us
// how long a wait busy-polls before it sleeps, and --send-ahead off makes the ring handle one
// segment at a time (tcp_ring_options::send_ahead), for sweeps on a bigger host (bench/ring_sweep.sh).
// cpu_us is the CPU time per operation of all ranks together (user and system, the kernel's
// loopback copies included): what an operation costs where the ranks share the cores.
//
// Usage: tcp_allreduce_bench [-n RANKS] [--floor] [--reps R] [--target-ms T]
//                            [--compression none,fp16,bf16] [--token TEXT]
//                            [--tag-hashing auto|beside|inline] [--segment-bytes B] [--spin-us U]
//                            [--send-ahead on|off] [SIZE...]

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "troupe/kernels/half_kernels.hpp"
#include "troupe/transport/tcp_ring.hpp"

using namespace troupe::transport;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// A float32 buffer all-reduced as `wire` elements: f32 as it is; f16 or bf16 rounded into
// `packed`, all-reduced, and widened back, as the runtime's compression does.
void all_reduce_as(tcp_ring& ring, std::vector<float>& buf, std::vector<std::uint16_t>& packed, std::int64_t count,
                   scalar_type wire) {
  if (wire == scalar_type::f32) {
    ring.all_reduce(buf.data(), count, scalar_type::f32, reduce_kind::sum);
    return;
  }
  troupe::kernels::compress_range(buf.data(), packed.data(), count, wire);
  ring.all_reduce(packed.data(), count, wire, reduce_kind::sum);
  troupe::kernels::decompress_range(packed.data(), buf.data(), count, wire);
}

// This process's CPU time (user and system, all threads), in seconds.
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

struct op_time {
  double wall = 0;  // seconds per op
  double cpu = 0;   // this rank's CPU seconds per op
};

// Runs `iters` all-reduces of `bytes` (of float32) and returns the time per op; all ranks start
// together because each all-reduce is itself a synchronisation.
op_time time_ring(tcp_ring& ring, std::vector<float>& buf, std::vector<std::uint16_t>& packed, std::size_t bytes,
                  int iters, scalar_type wire) {
  const auto count = static_cast<std::int64_t>(bytes / 4);
  all_reduce_as(ring, buf, packed, count, wire);  // line up
  const double cpu = cpu_seconds();
  const auto start = clock_type::now();
  for (int i = 0; i < iters; ++i) all_reduce_as(ring, buf, packed, count, wire);
  return {seconds_since(start) / iters, (cpu_seconds() - cpu) / iters};
}

const char* wire_name(scalar_type wire) {
  return wire == scalar_type::f16 ? "fp16" : wire == scalar_type::bf16 ? "bf16" : "none";
}

int run_rank(int rank, int n, std::vector<listener*>& listeners, const std::vector<endpoint>& peers,
             const std::vector<std::size_t>& sizes, int reps, double target_ms, const std::vector<scalar_type>& wires,
             const std::string& token, tag_hashing hashing, std::size_t segment_bytes, int spin_us, bool send_ahead) {
  tcp_ring_options options;
  options.send_ahead = send_ahead;
  options.segment_bytes = segment_bytes;
  options.timeout = std::chrono::seconds(30);
  options.auth = {token, "tcp_allreduce_bench"};
  options.hash_tags = hashing;
  tcp_ring ring(rank, n, *listeners[static_cast<std::size_t>(rank)], peers, options);
  // All ranks share this machine: spinning only pays while each has a core of its own.
  if (spin_us >= 0) {
    ring.set_spin(std::chrono::microseconds(spin_us), n > static_cast<int>(std::thread::hardware_concurrency()));
  } else if (n > static_cast<int>(std::thread::hardware_concurrency())) {
    ring.set_spin(std::chrono::microseconds(50), true);
  }
  std::vector<float> buf(std::max<std::size_t>(1, sizes.back() / 4), 1.0f);
  std::vector<std::uint16_t> packed(buf.size());
  std::vector<float> check(1024, float(rank + 1));
  ring.all_reduce(check.data(), 1024, scalar_type::f32, reduce_kind::sum);
  if (check[1023] != float(n * (n + 1) / 2)) {
    std::fprintf(stderr, "rank %d: wrong all-reduce result %f\n", rank, check[1023]);
    return 1;
  }
  for (std::size_t bytes : sizes) {
    // Calibrate each format on rank 0's first measurement, agreed by all through an all-reduce.
    std::vector<int> iters(wires.size());
    for (std::size_t w = 0; w < wires.size(); ++w) {
      std::vector<float> iters_f(1, 0.0f);
      // Ones stay exact in every format only while n is small: refill before each format.
      std::fill(buf.begin(), buf.end(), 1.0f);
      double t1 = time_ring(ring, buf, packed, bytes, 3, wires[w]).wall;
      if (rank == 0) iters_f[0] = float(std::clamp(target_ms / 1e3 / t1, 3.0, 20000.0));
      ring.all_reduce(iters_f.data(), 1, scalar_type::f32, reduce_kind::sum);
      iters[w] = static_cast<int>(iters_f[0]);
    }
    std::vector<std::vector<double>> times(wires.size()), cpus(wires.size());
    for (int r = 0; r < reps; ++r) {
      for (std::size_t w = 0; w < wires.size(); ++w) {  // interleaved: the machine's noise hits every format
        std::fill(buf.begin(), buf.end(), 1.0f);
        // Each rank's wall and CPU time per op: the slowest rank's wall time, all ranks' CPU.
        std::vector<float> t(2 * static_cast<std::size_t>(n), 0.0f);
        const op_time mine = time_ring(ring, buf, packed, bytes, iters[w], wires[w]);
        t[static_cast<std::size_t>(rank)] = float(mine.wall);
        t[static_cast<std::size_t>(n + rank)] = float(mine.cpu);
        ring.all_reduce(t.data(), 2 * n, scalar_type::f32, reduce_kind::sum);
        times[w].push_back(*std::max_element(t.begin(), t.begin() + n));
        cpus[w].push_back(std::accumulate(t.begin() + n, t.end(), 0.0));
      }
    }
    double first_med = 0;
    for (std::size_t w = 0; w < wires.size(); ++w) {
      std::sort(times[w].begin(), times[w].end());
      std::sort(cpus[w].begin(), cpus[w].end());
      const double med = times[w][times[w].size() / 2];
      const double cpu_med = cpus[w][cpus[w].size() / 2];
      if (w == 0) first_med = med;
      if (rank == 0) {
        const double algbw = double(bytes) / med / 1e9;
        std::printf("tcp_allreduce bytes=%zu ranks=%d iters=%d median_us=%.2f algbw_GBps=%.3f busbw_GBps=%.3f "
                    "cpu_us=%.2f compression=%s",
                    bytes, n, iters[w], med * 1e6, algbw, algbw * 2.0 * (n - 1) / n, cpu_med * 1e6,
                    wire_name(wires[w]));
        if (wires.size() > 1) std::printf(" speedup_vs_%s=%.2f", wire_name(wires[0]), first_med / med);
        std::printf(" segment_bytes=%zu send_ahead=%s\n", segment_bytes, send_ahead ? "on" : "off");
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

// Both ends send and receive `bytes` at once, busy-polling non-blocking sockets.
double exchange(int fd, std::vector<char>& out, std::vector<char>& in, std::size_t bytes) {
  const auto start = clock_type::now();
  std::size_t sent = 0, got = 0;
  while (sent < bytes || got < bytes) {
    if (sent < bytes) {
      ssize_t w = send(fd, out.data() + sent, bytes - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w > 0) sent += static_cast<std::size_t>(w);
    }
    if (got < bytes) {
      ssize_t r = recv(fd, in.data() + got, bytes - got, MSG_DONTWAIT);
      if (r > 0) got += static_cast<std::size_t>(r);
      if (r == 0) return -1;
    }
  }
  return seconds_since(start);
}

int run_floor(int fd, bool first, const std::vector<std::size_t>& sizes, int reps, double target_ms) {
  std::vector<char> out(sizes.back()), in(sizes.back());
  for (std::size_t bytes : sizes) {
    double t1 = exchange(fd, out, in, bytes);
    const int iters = static_cast<int>(std::clamp(target_ms / 1e3 / std::max(t1, 1e-7), 3.0, 20000.0));
    // Both sides must run the same count: the first side decides and tells the other.
    int agreed = iters;
    if (first) {
      (void)!send(fd, &agreed, sizeof agreed, MSG_NOSIGNAL);
    } else {
      std::size_t got = 0;
      while (got < sizeof agreed) {
        ssize_t r = recv(fd, reinterpret_cast<char*>(&agreed) + got, sizeof agreed - got, 0);
        if (r <= 0) return 1;
        got += static_cast<std::size_t>(r);
      }
    }
    std::vector<double> times;
    for (int r = 0; r < reps; ++r) {
      const auto start = clock_type::now();
      for (int i = 0; i < agreed; ++i) exchange(fd, out, in, bytes);
      times.push_back(seconds_since(start) / agreed);
    }
    std::sort(times.begin(), times.end());
    if (first) {
      const double med = times[times.size() / 2];
      std::printf("exchange_floor bytes=%zu iters=%d median_us=%.2f algbw_GBps=%.3f\n", bytes, agreed, med * 1e6,
                  double(bytes) / med / 1e9);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 2;
  bool floor_mode = false;
  int reps = 5;
  double target_ms = 50;
  std::vector<std::size_t> sizes;
  std::string compression_list = "none";
  std::string token;
  std::string hashing_name = "auto";
  std::size_t segment_bytes = tcp_ring_options::default_segment_bytes;
  int spin_us = -1;
  std::string send_ahead = "on";
  CLI::App app{"All-reduce over troupe's TCP ring between processes on loopback (or, with --floor, the bare\n"
               "exchange).",
               "tcp_allreduce_bench"};
  app.option_defaults()->always_capture_default();
  app.add_option("-n", n, "ranks (processes)")->check(CLI::Range(1, 64));
  app.add_flag("--floor", floor_mode, "measure the loopback exchange floor instead of the ring");
  app.add_option("--reps", reps, "repetitions per size (the median is printed)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--target-ms", target_ms, "time each repetition aims at")->check(CLI::Range(0.001, 1e6));
  app.add_option("--compression", compression_list,
                 "wire formats to compare, comma-separated and interleaved (none: float32; fp16, bf16: "
                 "16-bit, as CommunicationOptions::compression)")
      ->check([](const std::string& list) {
        std::size_t at = 0;
        while (at <= list.size()) {
          const std::size_t end = std::min(list.find(',', at), list.size());
          const std::string name = list.substr(at, end - at);
          if (name != "none" && name != "fp16" && name != "bf16") return name + " is not none, fp16 or bf16";
          at = end + 1;
        }
        return std::string();
      });
  app.add_option("--token", token,
                 "a cluster token: the ring's connections prove it, and every frame carries an integrity tag "
                 "(empty: no tags)");
  app.add_option("--tag-hashing", hashing_name,
                 "with --token, where a rank hashes its large frames' tags: auto (beside its thread where the "
                 "machine has two cores per rank), beside (a thread of its own), inline (its own thread)")
      ->check(CLI::IsMember({"auto", "beside", "inline"}));
  app.add_option("--segment-bytes", segment_bytes,
                 "the ring's pipelining unit (tcp_ring_options::segment_bytes: a multiple of 8 in 64..64 MiB)")
      ->check(CLI::Range(tcp_ring_options::min_segment_bytes, tcp_ring_options::max_segment_bytes));
  app.add_option("--spin-us", spin_us,
                 "how long a wait busy-polls before it sleeps (default: 50, yielding when ranks outnumber cores)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--send-ahead", send_ahead,
                 "on: a ring step writes the next segment before adding the last (tcp_ring_options::send_ahead)")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("sizes", sizes, "bytes per all-reduce (default: a sweep)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 34));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (segment_bytes % 8 != 0) {
    std::fprintf(stderr, "tcp_allreduce_bench: --segment-bytes %zu is not a multiple of 8\n", segment_bytes);
    return 2;
  }
  const tag_hashing hashing = hashing_name == "beside"   ? tag_hashing::beside
                              : hashing_name == "inline" ? tag_hashing::in_line
                                                         : tag_hashing::automatic;
  if (sizes.empty()) sizes = {4, 64, 1024, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
  std::sort(sizes.begin(), sizes.end());
  std::vector<scalar_type> wires;
  for (std::size_t at = 0; at <= compression_list.size();) {
    const std::size_t end = std::min(compression_list.find(',', at), compression_list.size());
    const std::string c = compression_list.substr(at, end - at);
    wires.push_back(c == "fp16" ? scalar_type::f16 : c == "bf16" ? scalar_type::bf16 : scalar_type::f32);
    at = end + 1;
  }
  if (floor_mode) {
    int sv[2];
    listener l("127.0.0.1", 0);
    pid_t child = fork();
    if (child == 0) {
      // The child connects over loopback TCP (not a socketpair): the same path as the ring.
      tcp_ring* unused = nullptr;
      (void)unused;
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(l.port());
      addr.sin_addr.s_addr = htonl(0x7f000001);
      while (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) usleep(1000);
      _exit(run_floor(fd, false, sizes, reps, target_ms));
    }
    int fd = accept(l.fd(), nullptr, nullptr);
    (void)sv;
    int rc = run_floor(fd, true, sizes, reps, target_ms);
    int status = 0;
    waitpid(child, &status, 0);
    return rc;
  }
  std::vector<listener*> listeners;
  std::vector<endpoint> peers;
  for (int r = 0; r < n; ++r) {
    listeners.push_back(new listener("127.0.0.1", 0));
    peers.push_back({"127.0.0.1", listeners.back()->port()});
  }
  std::vector<pid_t> children;
  for (int r = 1; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(run_rank(r, n, listeners, peers, sizes, reps, target_ms, wires, token, hashing, segment_bytes, spin_us, send_ahead == "on"));
    children.push_back(pid);
  }
  int rc = run_rank(0, n, listeners, peers, sizes, reps, target_ms, wires, token, hashing, segment_bytes, spin_us, send_ahead == "on");
  for (pid_t c : children) {
    int status = 0;
    waitpid(c, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  return rc;
}
