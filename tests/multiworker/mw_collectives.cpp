// mw_worker's modes collectives and compressed: every collective across the workers, checked.
#include "mw_modes.hpp"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <troupe/troupe.hpp>

#include "distribute/collectives/collectives.hpp"
#include "troupe/kernels/half_kernels.hpp"

using namespace troupe;
using namespace troupe::distribute;

namespace mw {

int collectives(MultiWorkerMirroredStrategy& s) {
  const int n = s.num_replicas_in_sync();
  const int local = s.num_local_replicas();
  const int rank = expected_rank(*s.cluster_resolver());
  // all_reduce in replica context: SUM and MEAN of (global id + 1), and a packed list.
  auto sums = s.run([] {
    auto* ctx = get_replica_context();
    const int id = ctx->replica_id_in_sync_group();
    Tensor v = Tensor::full({1000}, id + 1, DType::f32);
    auto packed = ctx->all_reduce(ReduceOp::sum, std::vector<Tensor>{Tensor::scalar<std::int64_t>(id), v});
    // Three float32 tensors cross the workers as one pack; each must come back whole.
    auto trio = ctx->all_reduce(ReduceOp::sum, std::vector<Tensor>{Tensor::full({3}, 1, DType::f32), Tensor::zeros({0}),
                                                                  Tensor::full({5}, id, DType::f32)});
    if (trio[0].to_vector<float>() != std::vector<float>(3, float(ctx->num_replicas_in_sync())) ||
        trio[2].to_vector<float>()[4] != float(ctx->num_replicas_in_sync() * (ctx->num_replicas_in_sync() - 1) / 2)) {
      throw std::runtime_error("packed all_reduce of three float32 tensors came back wrong");
    }
    // Five float32 tensors of 3 elements: with bytes_per_pack 24 they cross as packs of 2, 2 and
    // 1 tensors. Element e of tensor t on replica id is 100 t + 10 e + id.
    std::vector<Tensor> five;
    for (int t = 0; t < 5; ++t) {
      five.push_back(Tensor::from_vector<float>({100.0f * t + id, 100.0f * t + 10 + id, 100.0f * t + 20 + id}, {3}));
    }
    five = ctx->all_reduce(ReduceOp::sum, five);
    const int replicas = ctx->num_replicas_in_sync();
    for (int t = 0; t < 5; ++t) {
      for (int e = 0; e < 3; ++e) {
        const float want = float(replicas) * (100.0f * t + 10.0f * e) + float(replicas * (replicas - 1) / 2);
        if (five[static_cast<std::size_t>(t)].to_vector<float>()[static_cast<std::size_t>(e)] != want) {
          throw std::runtime_error("packed all_reduce of five float32 tensors: tensor " + std::to_string(t) +
                                   " element " + std::to_string(e) + " came back wrong");
        }
      }
    }
    Tensor mean = ctx->all_reduce(ReduceOp::mean, Tensor::scalar<double>(id));
    return std::vector<Tensor>{ctx->all_reduce(ReduceOp::sum, v), packed[0], mean};
  });
  for (const auto& r : sums.values()) {
    expect_eq(r[0].to_vector<float>()[999], float(n * (n + 1) / 2), "all_reduce SUM");
    expect_eq(r[1].item<std::int64_t>(), std::int64_t(n * (n - 1) / 2), "packed all_reduce");
    expect_eq(r[2].item<double>(), (n - 1) / 2.0, "all_reduce MEAN");
    expect_eq(r[0].equals(sums[0][0]), true, "bit-identical on every local replica");
  }
  // reduce in cross-replica context, over all workers.
  auto ids = s.experimental_distribute_values_from_function(
      [](const ValueContext& c) { return Tensor::scalar<int>(c.replica_id_in_sync_group); });
  expect_eq(s.reduce(ReduceOp::sum, ids, std::nullopt).item<int>(), n * (n - 1) / 2, "reduce SUM across workers");
  // axis reduce with a partial batch: global replica g holds g+1 rows of ones.
  auto rows = s.experimental_distribute_values_from_function(
      [](const ValueContext& c) { return Tensor::full({c.replica_id_in_sync_group + 1}, 1.0, DType::f32); });
  expect_eq(s.reduce(ReduceOp::sum, rows, 0).item<float>(), float(n * (n + 1) / 2), "reduce along axis 0");
  expect_eq(s.reduce(ReduceOp::mean, rows, 0).item<float>(), 1.0f, "mean along axis 0 over every row");
  // gather across workers, in global replica order.
  auto id_rows = s.experimental_distribute_values_from_function(
      [](const ValueContext& c) { return Tensor::full({1}, c.replica_id_in_sync_group, DType::i32); });
  Tensor g = s.gather(id_rows, 0);
  std::vector<int> want(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) want[static_cast<std::size_t>(i)] = i;
  expect_eq(g.to_vector<int>(), want, "gather across workers");
  // all_gather in replica context, uneven rows.
  auto gathered = s.run([] {
    auto* ctx = get_replica_context();
    const int id = ctx->replica_id_in_sync_group();
    return ctx->all_gather(Tensor::full({id % 2 + 1}, id, DType::i64), 0);
  });
  std::vector<std::int64_t> want_g;
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < i % 2 + 1; ++k) want_g.push_back(i);
  }
  for (const auto& t : gathered.values()) expect_eq(t.to_vector<std::int64_t>(), want_g, "all_gather across workers");
  // Along axis 1, uneven: global replica g holds a [2, g % 2 + 1] block of g and 100 + g.
  auto block = [](int id) {
    const std::int64_t cols = id % 2 + 1;
    std::vector<std::int64_t> v;
    for (std::int64_t c = 0; c < cols; ++c) v.push_back(id);
    for (std::int64_t c = 0; c < cols; ++c) v.push_back(100 + id);
    return Tensor::from_vector(v, {2, cols});
  };
  std::vector<std::int64_t> want_axis1;
  for (int row = 0; row < 2; ++row) {
    for (int i = 0; i < n; ++i) {
      for (int k = 0; k < i % 2 + 1; ++k) want_axis1.push_back(row * 100 + i);
    }
  }
  auto blocks = s.experimental_distribute_values_from_function(
      [&](const ValueContext& c) { return block(c.replica_id_in_sync_group); });
  expect_eq(s.gather(blocks, 1).to_vector<std::int64_t>(), want_axis1, "gather along axis 1 across workers");
  auto gathered1 = s.run([&] { return get_replica_context()->all_gather(block(get_replica_context()->replica_id_in_sync_group()), 1); });
  for (const auto& t : gathered1.values()) {
    expect_eq(t.to_vector<std::int64_t>(), want_axis1, "all_gather along axis 1 across workers");
  }
  // A distributed dataset: every replica gets its rows of each global batch.
  auto it = s.experimental_distribute_dataset(data::Dataset::range(2 * n).batch(n)).make_iterator();
  for (int step = 0; step < 2; ++step) {
    auto x = it.get_next();
    for (int r = 0; r < local; ++r) {
      // Global replica ids run over the workers in rank order, each worker's replicas together.
      const int global = rank * local + r;
      expect_eq(x[r][0].to_vector<std::int64_t>(), std::vector<std::int64_t>{step * n + global}, "dataset rows");
    }
  }
  expect_eq(it.get_next_as_optional().has_value(), false, "dataset ends on every worker together");
  // Variables start from the chief's value, even when each worker passes its own.
  {
    auto scope = s.scope();
    const int task = s.cluster_resolver()->task_id();
    Variable v(Tensor::full({3}, 10 + task, DType::f32), "v");
    for (const Tensor& c : s.experimental_local_results(v)) {
      expect_eq(c.to_vector<float>(), std::vector<float>{10, 10, 10}, "variable initialised from the chief");
    }
    Variable w(Tensor::scalar<float>(0.0f), "w", VariableSynchronization::on_write, VariableAggregation::sum);
    s.run([&] { w.assign_add(Tensor::scalar<float>(1.0f)); });
    for (const Tensor& c : s.experimental_local_results(w)) {
      expect_eq(c.item<float>(), float(n), "replica-context writes aggregate over every worker");
    }
    // on_read variables read in cross-replica context aggregate over every replica of every
    // worker: replica g holds 2 g + 1.
    Variable avg(Tensor::scalar<float>(0.0f), "avg", VariableSynchronization::on_read, VariableAggregation::mean);
    Variable first(Tensor::scalar<float>(0.0f), "first", VariableSynchronization::on_read,
                   VariableAggregation::only_first_replica);
    s.run([&] {
      const float g = float(get_replica_context()->replica_id_in_sync_group());
      avg.assign(Tensor::scalar<float>(2 * g + 1));
      first.assign(Tensor::scalar<float>(2 * g + 1));
    });
    expect_eq(avg.value().item<float>(), float(n), "on_read MEAN read over every worker");  // mean of 1, 3, ..., 2n-1
    expect_eq(avg.read_value().item<float>(), float(n), "on_read MEAN read_value over every worker");
    expect_eq(first.value().item<float>(), 1.0f, "on_read ONLY_FIRST_REPLICA reads the chief's first replica");
  }
  return failures == 0 ? 0 : 1;
}


// FNV-1a over the bits of every tensor, in order.
std::uint64_t hash_bits(const std::vector<Tensor>& tensors) {
  std::uint64_t h = 1469598103934665603ull;
  for (const Tensor& t : tensors) {
    const auto* p = static_cast<const unsigned char*>(t.raw_data());
    for (std::size_t i = 0; i < t.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  return h;
}


// all_reduce in replica context with CommunicationOptions::compression, on 2 workers: the float32
// tensors cross as 16-bit values, so element i must be round(round(s0) + round(s1)) (the local sums
// of worker 0 and 1, rounded to the format, added in float32 and rounded again), widened back; a
// MEAN is that divided by the replicas; int32 and float64 tensors cross unchanged. Prints a hash
// of every local replica's result bits ("compressed <replica> <hash>"): run_cluster.sh checks that
// they are the same on every replica of every worker.
int compressed(MultiWorkerMirroredStrategy& s, Compression compression) {
  const int n = s.num_replicas_in_sync();
  const int local = s.num_local_replicas();
  if (n / local != 2) {
    std::cout << "FAIL the compressed scenario needs 2 workers\n";
    return 1;
  }
  // 40000 elements: 80 KB on the wire in 16 bits, over the ring's reduce-scatter path; 9: a swap.
  auto value = [](int replica, std::int64_t i) {
    return 0.1f * static_cast<float>(i % 1000 - 500) + 0.37f * static_cast<float>(replica) + 1.0f / 3.0f;
  };
  auto results = s.run([&] {
    auto* ctx = get_replica_context();
    const int id = ctx->replica_id_in_sync_group();
    std::vector<Tensor> out;
    for (const std::int64_t count : {std::int64_t{40000}, std::int64_t{9}}) {
      std::vector<float> mine(static_cast<std::size_t>(count));
      for (std::int64_t i = 0; i < count; ++i) mine[static_cast<std::size_t>(i)] = value(id, i);
      const Tensor t = Tensor::from_vector(mine, {count});
      out.push_back(ctx->all_reduce(ReduceOp::sum, t));
      out.push_back(ctx->all_reduce(ReduceOp::mean, t));
    }
    // A pack of float32, int32 and float64 tensors: only the float32 one is compressed.
    auto mixed = ctx->all_reduce(ReduceOp::sum, std::vector<Tensor>{Tensor::full({5}, 1.0 / 3.0, DType::f64),
                                                                     Tensor::full({5}, id + 1000001, DType::i32),
                                                                     Tensor::full({5}, value(id, 1), DType::f32)});
    out.insert(out.end(), mixed.begin(), mixed.end());
    return out;
  });
  auto round_trip = [&](float x) {
    return compression == Compression::fp16 ? troupe::kernels::f16_to_float(troupe::kernels::float_to_f16(x))
                                            : troupe::kernels::bf16_to_float(troupe::kernels::float_to_bf16(x));
  };
  auto want_sum = [&](std::int64_t i) {
    float worker_sum[2];
    for (int w = 0; w < 2; ++w) {
      float acc = value(w * local, i);
      for (int r = 1; r < local; ++r) acc += value(w * local + r, i);
      worker_sum[w] = acc;
    }
    if (compression == Compression::none) return worker_sum[0] + worker_sum[1];
    return round_trip(round_trip(worker_sum[0]) + round_trip(worker_sum[1]));
  };
  int rounded = 0;
  for (int r = 0; r < local; ++r) {
    const auto& got = results[r];
    for (std::size_t k = 0; k < 2; ++k) {
      const std::vector<float> sum = got[2 * k].to_vector<float>();
      const std::vector<float> mean = got[2 * k + 1].to_vector<float>();
      for (std::size_t i = 0; i < sum.size(); ++i) {
        const float want = want_sum(static_cast<std::int64_t>(i));
        if (sum[i] != want || mean[i] != want / static_cast<float>(n)) {
          std::cout << "FAIL replica " << r << " element " << i << " of " << sum.size() << ": sum " << sum[i]
                    << " mean " << mean[i] << ", expected " << want << " and " << want / static_cast<float>(n) << "\n";
          ++failures;
          break;
        }
        float exact = 0;
        for (int g = 0; g < n; ++g) exact += value(g, static_cast<std::int64_t>(i));
        if (sum[i] != exact) ++rounded;
      }
    }
    expect_eq(got[4].to_vector<double>(), std::vector<double>(5, n * (1.0 / 3.0)), "float64 crosses unchanged");
    expect_eq(got[5].to_vector<std::int32_t>(), std::vector<std::int32_t>(5, n * 1000001 + n * (n - 1) / 2),
              "int32 crosses unchanged");
    expect_eq(got[6].to_vector<float>(), std::vector<float>(5, want_sum(1)), "float32 in a mixed pack");
    std::cout << "compressed " << s.cluster_resolver()->task_id() * local + r << " " << hash_bits(got) << "\n";
  }
  // The check must be able to fail: compression changes some bits of the float32 sums.
  if (compression != Compression::none) expect_eq(rounded > 0, true, "some sums were rounded to 16 bits");
  return failures == 0 ? 0 : 1;
}

}  // namespace mw
