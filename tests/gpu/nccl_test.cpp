// GPU tests: NCCL all-reduce correctness for every dtype over 1..N GPUs, SUM and MEAN, and the
// abort path. Exits 77 (skipped, with the reason) on a machine without a GPU; a CUDA error on a
// machine with one fails (gpu_check.hpp).

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu_check.hpp"
#include "nccl_group.hpp"

using namespace troupe::transport;
using namespace troupe::transport::cuda;

namespace {

int passes = 0;
int failures = 0;

void expect(bool ok, const std::string& what) {
  if (ok) {
    ++passes;
    return;
  }
  std::printf("FAIL %s\n", what.c_str());
  ++failures;
}

template <class T>
void all_reduce_case(int gpus, scalar_type type, reduce_kind op, std::int64_t count) {
  std::vector<int> devices;
  for (int g = 0; g < gpus; ++g) devices.push_back(g);
  nccl_group group(devices);
  std::vector<std::unique_ptr<device_buffer>> buffers;
  std::vector<void*> ptrs;
  for (int g = 0; g < gpus; ++g) {
    buffers.push_back(std::make_unique<device_buffer>(g, static_cast<std::size_t>(count) * sizeof(T)));
    buffers.back()->fill(count, type, g + 1);
    ptrs.push_back(buffers.back()->data());
  }
  group.all_reduce(ptrs, count, type, op, std::chrono::seconds(60));
  T expected = static_cast<T>(gpus * (gpus + 1) / 2);
  if (op == reduce_kind::mean) expected = static_cast<T>(expected / static_cast<T>(gpus));
  for (int g = 0; g < gpus; ++g) {
    std::vector<T> host(static_cast<std::size_t>(count));
    buffers[static_cast<std::size_t>(g)]->copy_to_host(host.data(), host.size() * sizeof(T));
    bool ok = true;
    for (T v : host) ok = ok && v == expected;
    expect(ok, std::string(scalar_name(type)) + " " + (op == reduce_kind::sum ? "SUM" : "MEAN") + " over " +
                   std::to_string(gpus) + " GPUs, " + std::to_string(count) + " elements, GPU " + std::to_string(g));
  }
}

}  // namespace

int main() {
  const auto check = troupe::testing::check_gpus("NCCL tests");
  if (!check.run()) return check.exit_code;
  const int gpus = check.devices;
  std::printf("NCCL %s\n", nccl_version().c_str());
  for (int n = 1; n <= gpus; ++n) {
    for (std::int64_t count : {std::int64_t{1}, std::int64_t{1001}, std::int64_t{1} << 22}) {
      for (reduce_kind op : {reduce_kind::sum, reduce_kind::mean}) {
        all_reduce_case<float>(n, scalar_type::f32, op, count);
        all_reduce_case<double>(n, scalar_type::f64, op, count);
        all_reduce_case<std::int32_t>(n, scalar_type::i32, op, count);
        all_reduce_case<std::int64_t>(n, scalar_type::i64, op, count);
      }
    }
  }
  // Abort: the group refuses further work with a clear error instead of hanging.
  {
    nccl_group group({0});
    group.abort();
    device_buffer b(0, 16);
    bool threw = false;
    try {
      group.all_reduce({b.data()}, 4, scalar_type::f32, reduce_kind::sum);
    } catch (const cuda_error& e) {
      threw = std::string(e.what()).find("aborted") != std::string::npos;
    }
    expect(threw, "an aborted group refuses all_reduce");
  }
  troupe::testing::report_unexercised(
      gpus, "NCCL tests",
      {{2, "all-reduce across GPUs (over one GPU NCCL leaves each buffer as it was, which is also the "
           "expected value: a reduction that did nothing passes)"}});
  std::printf("%d passed, %d failed\n", passes, failures);
  return failures == 0 ? 0 : 1;
}
