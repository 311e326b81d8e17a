// The peer for tcp_allreduce_bench: Gloo's ring all-reduce (gloo::AllreduceRing, over its TCP
// transport on loopback) between N processes, float32 SUM, measured the same way: per size the
// median over repetitions of the time per operation of the slowest rank.
// Usage: gloo_allreduce [-n RANKS] [--reps R] [--target-ms T] [SIZE...]

#include <gloo/allreduce_ring.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace {

using clock_type = std::chrono::steady_clock;

// Sums `v` over the ranks (a small helper all-reduce for agreeing on counts and timings).
void sum(const std::shared_ptr<gloo::Context>& ctx, std::vector<float>& v) {
  gloo::AllreduceRing<float> algo(ctx, {v.data()}, static_cast<int>(v.size()));
  algo.run();
}

int run_rank(int rank, int n, const std::string& store_dir, const std::vector<std::size_t>& sizes, int reps,
             double target_ms) {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(store_dir);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
  ctx->connectFullMesh(store, device);
  std::vector<float> buf(std::max<std::size_t>(1, sizes.back() / 4), 1.0f);
  for (std::size_t bytes : sizes) {
    const int count = static_cast<int>(std::max<std::size_t>(1, bytes / 4));
    gloo::AllreduceRing<float> algo(ctx, {buf.data()}, count);
    algo.run();
    auto t0 = clock_type::now();
    for (int i = 0; i < 3; ++i) algo.run();
    const double t1 = std::chrono::duration<double>(clock_type::now() - t0).count() / 3;
    std::vector<float> iters(1, rank == 0 ? float(std::clamp(target_ms / 1e3 / t1, 3.0, 20000.0)) : 0.0f);
    sum(ctx, iters);
    std::vector<double> times;
    for (int r = 0; r < reps; ++r) {
      auto start = clock_type::now();
      for (int i = 0; i < int(iters[0]); ++i) algo.run();
      std::vector<float> t(static_cast<std::size_t>(n), 0.0f);
      t[static_cast<std::size_t>(rank)] =
          float(std::chrono::duration<double>(clock_type::now() - start).count() / int(iters[0]));
      sum(ctx, t);
      times.push_back(*std::max_element(t.begin(), t.end()));
    }
    std::sort(times.begin(), times.end());
    if (rank == 0) {
      std::printf("gloo_allreduce bytes=%zu ranks=%d iters=%d median_us=%.2f\n", bytes, n, int(iters[0]),
                  times[times.size() / 2] * 1e6);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 2, reps = 5;
  double target_ms = 50;
  std::vector<std::size_t> sizes;
  CLI::App app{"Gloo's ring all-reduce between processes on loopback (the peer of tcp_allreduce_bench).",
               "gloo_allreduce"};
  app.option_defaults()->always_capture_default();
  app.add_option("-n", n, "ranks (processes)")->check(CLI::Range(1, 64));
  app.add_option("--reps", reps, "repetitions per size (the median is printed)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--target-ms", target_ms, "time each repetition aims at")->check(CLI::Range(0.001, 1e6));
  app.add_option("sizes", sizes, "bytes per all-reduce (default: a sweep)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 34));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (sizes.empty()) sizes = {4, 4096, 65536, 1 << 20, 16 << 20, 64 << 20};
  std::sort(sizes.begin(), sizes.end());
  const std::string dir = (std::filesystem::temp_directory_path() / ("gloo-store-" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  std::vector<pid_t> children;
  for (int r = 1; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(run_rank(r, n, dir, sizes, reps, target_ms));
    children.push_back(pid);
  }
  int rc = run_rank(0, n, dir, sizes, reps, target_ms);
  for (pid_t c : children) {
    int status = 0;
    waitpid(c, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  std::filesystem::remove_all(dir);
  return rc;
}
