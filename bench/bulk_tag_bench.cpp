// Where a ps data connection hashes its messages' integrity tags (transport's bulk_channel): a
// shard read and a shard update of <bytes> over loopback between a bulk_listener (the ps task's
// side, its own thread) and a bulk_stream (a worker's), in one process:
//   BM_BulkRead/<bytes>/<mode>    the request, then the shard's bytes back into the caller's buffer;
//   BM_BulkUpdate/<bytes>/<mode>  the shard's bytes out, received whole by the listener, then the
//                                 acknowledgement;
// <mode>: 0 without a token (no tags), 1 tagged in line (on the connection's thread), 2 tagged
// beside (tag_hashing::beside: a thread of the connection's own hashes messages of 64 KiB and up).
// Time is wall time per operation; cpu_us the CPU time of the whole process per operation (both
// sides, every thread). bench/results/collectives.md, "Hashing beside on the data connections", has the runs.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "troupe/transport/bulk_channel.hpp"

namespace {

namespace tt = troupe::transport;
using namespace std::chrono_literals;

double process_cpu_us() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return 1e6 * static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

tt::tag_hashing hashing_of(std::int64_t mode) { return mode == 2 ? tt::tag_hashing::beside : tt::tag_hashing::in_line; }

// One shard of `bytes` served by a listener, and a connection to it.
struct pair {
  pair(std::size_t bytes, std::int64_t mode)
      : shard(bytes, 0x5a),
        auth{mode == 0 ? std::string() : std::string("bench token"), "bench secret"},
        listener("127.0.0.1", 0, auth, 10000ms, "bench ps", [this](tt::bulk_stream& s) { serve(s); }, 64,
                 hashing_of(mode)),
        stream(tt::bulk_stream::connect(tt::endpoint{"127.0.0.1", listener.port()}, auth, 10000ms, "bench ps",
                                        hashing_of(mode))) {}

  void serve(tt::bulk_stream& s) {
    std::vector<unsigned char> in;
    while (auto r = s.receive_request()) {
      if (r->kind == tt::bulk_request::update) {
        in.resize(static_cast<std::size_t>(r->bytes));
        s.receive(in.data(), in.size());
        s.send_reply(nullptr, 0);
      } else {
        s.send_reply(shard.data(), shard.size());
      }
    }
  }

  std::vector<unsigned char> shard;
  tt::ring_auth auth;
  tt::bulk_listener listener;
  std::unique_ptr<tt::bulk_stream> stream;
};

void run(benchmark::State& state, std::uint8_t kind) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  pair p(bytes, state.range(1));
  std::vector<unsigned char> buffer(bytes, 0x33);
  tt::bulk_request r;
  r.kind = kind;
  r.key = "dense/kernel";
  r.bytes = bytes;
  auto once = [&] {
    p.stream->send_request(r, buffer.data());
    if (kind == tt::bulk_request::read) {
      p.stream->receive_reply(bytes);
      p.stream->receive(buffer.data(), bytes);
    } else {
      p.stream->receive_reply(0);
    }
  };
  once();  // checked once, outside the timed loop
  if (kind == tt::bulk_request::read && std::memcmp(buffer.data(), p.shard.data(), bytes) != 0) {
    state.SkipWithError("the shard read back differs");
    return;
  }
  const double cpu0 = process_cpu_us();
  for (auto _ : state) once();
  state.counters["cpu_us"] = (process_cpu_us() - cpu0) / static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

void BM_BulkRead(benchmark::State& state) { run(state, tt::bulk_request::read); }
void BM_BulkUpdate(benchmark::State& state) { run(state, tt::bulk_request::update); }

void sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t bytes : {std::int64_t{1} << 20, std::int64_t{16} << 20, std::int64_t{64} << 20}) {
    for (std::int64_t mode : {0, 1, 2}) b->Args({bytes, mode});
  }
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK(BM_BulkRead)->Apply(sizes);
BENCHMARK(BM_BulkUpdate)->Apply(sizes);
BENCHMARK_MAIN();
