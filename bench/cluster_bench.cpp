// ClusterCoordinator's costs on one machine, one binary for every role:
//   troupe-launch --chief --ps 1 -n 2 -- cluster_bench [--closures 20000] [--rounds 5]
// The chief prints, as medians of --rounds rounds:
//   - empty closures scheduled, run and joined per second over the workers;
//   - variable reads and updates of 4 KiB to 16 MiB (one shard on the ps task), each a closure
//     that reads the variable, or adds a tensor of its size to it, in MB/s of variable bytes;
//   - embedding lookups and scatters: 1024 rows of 256 bytes of a 64 MiB table per closure, in
//     MB/s of rows moved.
// bench/tf_ps.py measures the same on TensorFlow's ParameterServerStrategy; bench/cluster_bench.sh
// runs both.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "troupe/troupe.hpp"

using namespace troupe;
using namespace troupe::distribute;

namespace {

const std::int64_t sizes[] = {4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20};

std::string var_name(std::int64_t bytes) { return "v" + std::to_string(bytes); }

// The embedding table: rows of 64 floats (256 bytes), 64 MiB in all; a closure looks up (or
// scatters into) 1024 rows spread over it.
constexpr std::int64_t table_rows = 262144;
constexpr std::int64_t table_dim = 64;
constexpr std::size_t batch_rows = 1024;

std::vector<std::int64_t> batch_ids(std::int64_t seed) {
  std::vector<std::int64_t> ids(batch_rows);
  std::uint64_t x = static_cast<std::uint64_t>(seed) * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& id : ids) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<std::int64_t>((x >> 33) % static_cast<std::uint64_t>(table_rows));
  }
  return ids;
}

FunctionRegistry functions() {
  FunctionRegistry r;
  r.add("empty", [](FunctionContext&) { return std::vector<Tensor>{}; });
  r.add("read", [](FunctionContext& ctx) {
    ctx.read_variable(var_name(ctx.arg(0).item<std::int64_t>()));
    return std::vector<Tensor>{};
  });
  r.add("lookup", [](FunctionContext& ctx) {
    ctx.embedding_lookup("table", batch_ids(ctx.arg(0).item<std::int64_t>()));
    return std::vector<Tensor>{};
  });
  r.add("scatter", [](FunctionContext& ctx) {
    ctx.scatter_sub("table", batch_ids(ctx.arg(0).item<std::int64_t>()),
                    Tensor::full({static_cast<std::int64_t>(batch_rows), table_dim}, 0.001, DType::f32));
    return std::vector<Tensor>{};
  });
  r.add("update", [](FunctionContext& ctx) {
    const auto bytes = ctx.arg(0).item<std::int64_t>();
    ctx.assign_add(var_name(bytes), Tensor::full({bytes / 4}, 1.0, DType::f32));
    return std::vector<Tensor>{};
  });
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Fn>
double seconds(Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cluster_bench: ClusterCoordinator's closure rate and variable traffic"};
  int closures = 20000;
  int rounds = 5;
  app.add_option("--closures", closures, "empty closures per round")->check(CLI::Range(1, 1 << 24));
  app.add_option("--rounds", rounds, "rounds; medians are printed")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  try {
    Runtime rt;
    auto resolver = std::make_shared<TFConfigClusterResolver>();
    if (serve_if_worker_or_ps(rt, *resolver, functions())) return 0;
    ParameterServerStrategy strategy(rt, resolver);
    ClusterCoordinator coordinator(strategy);
    for (auto bytes : sizes) strategy.create_variable(var_name(bytes), Tensor::zeros({bytes / 4}));
    strategy.create_variable("table", Tensor::zeros({table_rows, table_dim}));
    coordinator.schedule("empty");
    coordinator.join();  // every worker connected and warm

    std::vector<double> rate;
    for (int r = 0; r < rounds; ++r) {
      const double s = seconds([&] {
        for (int i = 0; i < closures; ++i) coordinator.schedule("empty");
        coordinator.join();
      });
      rate.push_back(closures / s);
    }
    std::printf("troupe empty closures: %d workers, %d per round: %.0f closures/s (median of %d)\n",
                strategy.num_workers(), closures, median(rate), rounds);
    for (const char* op : {"read", "update"}) {
      for (auto bytes : sizes) {
        const int n = static_cast<int>(std::clamp<std::int64_t>((256ll << 20) / bytes, 8, 2000));
        std::vector<double> mbs;
        for (int r = 0; r < rounds; ++r) {
          const double s = seconds([&] {
            for (int i = 0; i < n; ++i) coordinator.schedule(op, bytes);
            coordinator.join();
          });
          mbs.push_back(static_cast<double>(n) * static_cast<double>(bytes) / s / 1e6);
        }
        std::printf("troupe %s %lld bytes: %d closures: %.1f MB/s, %.1f us per closure (median of %d)\n", op,
                    static_cast<long long>(bytes), n, median(mbs),
                    static_cast<double>(bytes) / median(mbs), rounds);
      }
    }
    for (const char* op : {"lookup", "scatter"}) {
      const int n = 500;
      std::vector<double> mbs;
      for (int r = 0; r < rounds; ++r) {
        const double s = seconds([&] {
          for (int i = 0; i < n; ++i) coordinator.schedule(op, static_cast<std::int64_t>(r * n + i));
          coordinator.join();
        });
        mbs.push_back(static_cast<double>(n) * batch_rows * table_dim * 4 / s / 1e6);
      }
      const double bytes = static_cast<double>(batch_rows * table_dim * 4);
      std::printf("troupe %s %zu rows of %lld bytes: %d closures: %.1f MB/s, %.1f us per closure (median of %d)\n", op,
                  batch_rows, static_cast<long long>(table_dim * 4), n, median(mbs), bytes / median(mbs), rounds);
    }
    // The adds all happened: every update added 1.0 to each element.
    const auto v = strategy.read_variable(var_name(sizes[0])).to_vector<float>();
    const float expected = static_cast<float>(rounds * std::clamp<std::int64_t>((256ll << 20) / sizes[0], 8, 2000));
    if (v.front() != expected || v.back() != expected) {
      std::fprintf(stderr, "cluster_bench: the 4 KiB variable holds %g, expected %g\n", v.front(), expected);
      return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "cluster_bench: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
