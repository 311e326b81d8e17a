// One worker of the multi-worker tests: run by run_cluster.sh in N processes with TF_CONFIG set
// (or the Slurm or mpirun variables, with MW_RESOLVER=slurm|mpi).
// Usage: mw_worker collectives | die | hang | skip | checkpoint | train | model | join | idle | compressed
//        | input | outside | steer | preempt
// Once the cluster formed it prints "replicas <R> workers <W> task <type>:<index>". Prints
// "OK <rank>" and exits 0 when every check holds; prints "FAIL ..." and exits 1 when one does not;
// prints "ERROR <message>" and exits 3 when the strategy throws.
// MW_TIMEOUT_MS sets CommunicationOptions::timeout, MW_BYTES_PER_PACK bytes_per_pack,
// MW_COMPRESSION (none, fp16, bf16) compression; MW_INPUT (data, off, file, uneven, fail) the input
// scenario of mode input.
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

namespace {

int failures = 0;

template <class A, class B>
void expect_eq(const A& got, const B& want, const std::string& what) {
  if (!(got == want)) {
    std::cout << "FAIL " << what << "\n";
    ++failures;
  }
}

// This worker's rank, from its task alone: the chief is rank 0 and the workers follow in index
// order (TensorFlow's order of a cluster spec: chief, then worker).
int expected_rank(const ClusterResolver& resolver) {
  if (resolver.task_type() == "chief") return 0;
  const ClusterSpec spec = resolver.cluster_spec();
  return (spec.has_job("chief") ? spec.num_tasks("chief") : 0) + resolver.task_id();
}

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

// Every worker saves through a CheckpointManager into one shared directory: only the chief's file
// stays; on_read values are aggregated over all workers; every worker restores the chief's file.
int checkpoint(MultiWorkerMirroredStrategy& s, const std::string& dir) {
  const int n = s.num_replicas_in_sync();
  const int task = s.cluster_resolver()->task_id();
  auto scope = s.scope();
  Variable w(Tensor::full({4}, 1.5, DType::f32), "w");
  Variable seen(Tensor::scalar<float>(0.0f), "seen", VariableSynchronization::on_read, VariableAggregation::sum);
  s.run([&] { seen.assign_add(Tensor::scalar<float>(1.0f)); });
  expect_eq(seen.value().item<float>(), float(n), "on_read SUM aggregated over every worker");
  CheckpointManager manager(Checkpoint({{"w", w}, {"seen", seen}}), dir, 2);
  const std::string written = manager.save(7);
  expect_eq(written.find(task == 0 ? "ckpt-7.ckpt" : ".tmp.ckpt") != std::string::npos, true, "chief writes the real path");
  std::cout << "wrote " << written << "\n";
  w.assign(Tensor::zeros({4}));
  seen.assign(Tensor::scalar<float>(100.0f));
  // Every worker restores the chief's file once it exists (the chief saved before answering the
  // sum below, which every worker waits for).
  s.reduce(ReduceOp::sum, s.experimental_distribute_values_from_function([](const ValueContext&) {
    return Tensor::scalar<int>(1);
  }), std::nullopt);
  auto step = manager.restore_or_initialize();
  expect_eq(step.has_value() && *step == 7, true, "restored step 7");
  for (const Tensor& c : s.experimental_local_results(w)) {
    expect_eq(c.to_vector<float>(), std::vector<float>(4, 1.5f), "w restored into every component");
  }
  expect_eq(seen.value().item<float>(), float(n), "on_read restored so that it sums back");
  return failures == 0 ? 0 : 1;
}

// PreemptionCheckpointHandler on its own: 10 steps, each adding every replica's 1 to a mirrored
// counter through an all-reduce. A termination watcher on worker MW_WATCH_TASK (1) alone says stop
// once 5 steps are done: every worker must save at step 5 and exit with restart_exit_code (75).
// Run again, every worker restores step 5 and runs steps 6..10.
int preempt(MultiWorkerMirroredStrategy& s, const std::string& dir) {
  const char* watch = std::getenv("MW_WATCH_TASK");
  const int watcher = watch != nullptr ? std::atoi(watch) : 1;
  const int task = s.cluster_resolver()->task_id();
  auto scope = s.scope();
  Variable count(Tensor::scalar<float>(0.0f), "count");
  CheckpointManager manager(Checkpoint({{"count", count}}), dir, 3);
  TerminationConfig config;
  PreemptionCheckpointHandler* handler_ptr = nullptr;
  bool fresh = false;  // the watcher speaks in the first run only
  config.termination_watcher_fn = [&] { return fresh && task == watcher && handler_ptr->total_run_calls() == 5; };
  PreemptionCheckpointHandler handler(s, manager, config);
  handler_ptr = &handler;
  const std::int64_t start = handler.total_run_calls();
  fresh = start == 0;
  std::cout << "starting at step " << start << std::endl;
  expect_eq(count.value().item<float>(), float(start * s.num_replicas_in_sync()), "the counter restored");
  while (handler.total_run_calls() < 10) {
    handler.run([&] {
      auto sums = s.run([] { return get_replica_context()->all_reduce(ReduceOp::sum, Tensor::scalar<float>(1.0f)); });
      count.assign_add(s.experimental_local_results(sums).front());
    });
  }
  expect_eq(start, std::int64_t{5}, "the second run starts from the preemption checkpoint");
  expect_eq(count.value().item<float>(), float(10 * s.num_replicas_in_sync()), "10 steps counted in all");
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

// An MLP trained with Adam, each replica on its own batch: prints the kernel path, a hash of a
// forward pass on a batch every worker shares (it differs between paths: their products round
// differently), and after every step a hash of the weights (identical on every worker, whatever
// its path: the gradients are all-reduced and the update gives the same bits everywhere).
// With `cnn`, the same for a small CNN: Conv2D(8, 3x3, same, relu) -> MaxPooling2D(2) -> Flatten
// -> Dense(10) on 8x8 images of 3 channels (the convolution's products take each path's kernels).
int train(MultiWorkerMirroredStrategy& s, bool cnn) {
  const int n = s.num_replicas_in_sync();
  const int steps = 12;
  const std::int64_t batch = 32, in = cnn ? 8 * 8 * 3 : 96, hidden = 64, classes = 10;
  auto scope = s.scope();
  nn::Sequential model;
  if (cnn) {
    model.add(nn::Conv2D(8, 3, 1, nn::Padding::same, nn::Activation::relu, 1));
    model.add(nn::MaxPooling2D(2));
    model.add(nn::Flatten());
    model.add(nn::Dense(4 * 4 * 8, classes, nn::Activation::none, 2));
    model.build({-1, 8, 8, 3});
  } else {
    model.add(nn::Dense(in, hidden, nn::Activation::relu, 1));
    model.add(nn::Dense(hidden, hidden, nn::Activation::relu, 2));
    model.add(nn::Dense(hidden, classes, nn::Activation::none, 3));
  }
  // A batch of inputs: [batch, in] rows, or the same values as [batch, 8, 8, 3] images.
  const auto input = [&](std::uint64_t seed) {
    const Tensor x = nn::glorot_uniform(batch, in, seed) * 4.0f;
    return cnn ? x.reshape({batch, 8, 8, 3}) : x;
  };
  auto optimizer = std::make_shared<nn::Adam>(0.01f);
  std::cout << "path " << Runtime::cpu_kernel_path() << "\n";
  const Tensor probe = input(99);
  std::cout << "probe " << hash_bits({model.forward(probe)}) << "\n";
  for (int step = 0; step < steps; ++step) {
    s.run([&] {
      auto* ctx = get_replica_context();
      const int id = ctx->replica_id_in_sync_group();
      const Tensor x = input(static_cast<std::uint64_t>(1000 + step * 64 + id));
      std::vector<std::int64_t> y(batch);
      for (std::int64_t i = 0; i < batch; ++i) y[i] = (i * 7 + step + id) % classes;
      std::vector<Tensor> activations;
      const Tensor logits = model.forward(x, activations);
      const auto lg = nn::sparse_softmax_cross_entropy(logits, Tensor::from_vector(y, {batch}), batch * n);
      const std::vector<Tensor> grads = model.backward(activations, lg.gradient);
      optimizer->apply_gradients(nn::zip(grads, model.trainable_variables()), ReduceOp::sum);
    });
    std::vector<Tensor> weights;
    for (const Variable& v : model.trainable_variables()) {
      const auto components = s.experimental_local_results(v);
      for (const Tensor& c : components) {
        expect_eq(hash_bits({c}), hash_bits({components.front()}), "local replicas' " + v.name() + " identical");
      }
      weights.push_back(components.front());
    }
    std::cout << "step " << step << " weights " << hash_bits(weights) << "\n";
  }
  return failures == 0 ? 0 : 1;
}

// Every step all-reduces its rows (so a worker that stopped early would leave the others waiting
// in that collective), and every element's ids are counted on the worker that got them. Returns
// the steps run; `rows` gets the rows of every step summed over the cluster, `local` the ids this
// worker saw.
template <class Ids>
int consume(MultiWorkerMirroredStrategy& s, const DistributedDataset& dist, std::int64_t& rows,
            std::vector<std::int64_t>& local, Ids ids) {
  int steps = 0;
  for (const PerReplica<data::Element>& x : dist) {
    auto global = s.run([](const data::Element& e) {
      return get_replica_context()->all_reduce(ReduceOp::sum, Tensor::scalar<std::int64_t>(e[0].shape()[0]));
    }, x);
    const Tensor step_rows = s.experimental_local_results(global)[0];
    rows += step_rows.item<std::int64_t>();
    for (const data::Element& e : x.values()) {
      for (std::int64_t id : ids(e)) {
        if (id < 0 || id >= static_cast<std::int64_t>(local.size())) {
          std::cout << "FAIL id " << id << " outside the data\n";
          ++failures;
          continue;
        }
        ++local[static_cast<std::size_t>(id)];
      }
    }
    ++steps;
  }
  return steps;
}

// How often each id was seen over the whole cluster.
std::vector<std::int64_t> cluster_counts(MultiWorkerMirroredStrategy& s, const std::vector<std::int64_t>& local) {
  const Tensor mine = Tensor::from_vector(local, {static_cast<std::int64_t>(local.size())});
  const int per_worker = s.num_local_replicas();
  auto parts = s.experimental_distribute_values_from_function([&](const ValueContext& c) {
    return c.replica_id_in_sync_group % per_worker == 0 ? mine : Tensor::zeros(mine.shape(), DType::i64);
  });
  return s.reduce(ReduceOp::sum, parts, std::nullopt).to_vector<std::int64_t>();
}

// Input across workers. data, off, file: experimental_distribute_dataset of 6 CSV files of 3..8
// rows (ids 0..32) batched by 4, under AutoShardPolicy DATA, OFF or FILE; every worker writes the
// same files into a directory of its own, as if on a shared file system. DATA and FILE: every id
// is seen once over the cluster; OFF: once per worker; FILE: a worker sees only the ids of its
// own files (w, w + W, ...). uneven: distribute_datasets_from_function where worker w's dataset
// holds 11, 4, 0 or 7 ids (by rank) batched by 2 per replica: every worker runs as many steps as
// the worker with most data, the others get empty batches (dtype int64, shape [0]) meanwhile, and
// every id is seen once; uneven-replica: the same with a pipeline per replica (11, 4, 0, 7, 5, 2,
// 9, 1 ids by pipeline). fail: worker 1's input fails. Prints "input steps <N>".
int input(MultiWorkerMirroredStrategy& s, const std::string& which) {
  const int local = s.num_local_replicas();
  const int workers = s.num_replicas_in_sync() / local;
  const int rank = expected_rank(*s.cluster_resolver());
  std::int64_t rows = 0;
  int steps = 0;
  std::vector<std::int64_t> counts;
  if (which == "fail") {
    // Worker 1's dataset fails at its third element; worker 0's holds five. Both must stop at
    // that step: worker 1 with the cause, worker 0 naming worker 1.
    auto dist = s.distribute_datasets_from_function([&](const InputContext& ctx) {
      const int me = ctx.input_pipeline_id;
      return data::Dataset::range(5).map([me](const data::Element& e) {
        if (me == 1 && e[0].item<std::int64_t>() == 2) throw std::runtime_error("bad record 2 in worker 1's shard");
        return e;
      }).batch(1);
    });
    std::vector<std::int64_t> local_ids(5, 0);
    steps = consume(s, dist, rows, local_ids, [](const data::Element& e) { return e[0].to_vector<std::int64_t>(); });
    std::cout << "FAIL the pass ended after " << steps << " steps although worker 1 failed to read\n";
    return 1;
  }
  if (which == "fit") {
    // Model::fit over distribute_datasets_from_function with 12, 5 or 0 samples per worker (by
    // rank), 2 per replica per step, for 2 epochs: every worker takes every step, the samples
    // counted are the cluster's, and every worker ends with the same weights.
    const std::vector<std::int64_t> sizes{12, 5, 0, 7};
    std::int64_t total = 0, most_steps = 0;
    for (int w = 0; w < workers; ++w) {
      total += sizes[static_cast<std::size_t>(w)];
      most_steps = std::max(most_steps, ((sizes[static_cast<std::size_t>(w)] + 1) / 2 + local - 1) / local);
    }
    auto scope = s.scope();
    nn::Model model(nn::Sequential({nn::Dense(3, 1, nn::Activation::none, 9)}));
    model.compile(std::make_shared<nn::SGD>(0.05f), nn::Loss::mean_squared_error());
    auto dist = s.distribute_datasets_from_function([&](const InputContext& ctx) {
      const std::int64_t n = sizes[static_cast<std::size_t>(ctx.input_pipeline_id)];
      std::vector<float> x, y;
      for (std::int64_t i = 0; i < n; ++i) {
        const float v = static_cast<float>(ctx.input_pipeline_id * 100 + i) / 50.0f;
        x.insert(x.end(), {v, 1.0f - v, 0.5f});
        y.push_back(2.0f * v - 1.0f);
      }
      return data::Dataset::from_tensor_slices({Tensor::from_vector(x, {n, 3}), Tensor::from_vector(y, {n, 1})})
          .batch(ctx.get_per_replica_batch_size(2 * ctx.num_replicas_in_sync));
    });
    nn::FitOptions quiet;
    quiet.verbose = 0;
    const nn::History history = model.fit(dist, 2, -1, quiet);
    expect_eq(history.steps, 2 * most_steps, "fit took the steps of the worker with most data");
    expect_eq(history.samples, 2 * total, "fit counted the samples of every worker");
    std::vector<Tensor> weights;
    for (const Variable& v : model.trainable_variables()) weights.push_back(s.experimental_local_results(v).front());
    std::cout << "fit weights " << hash_bits(weights) << "\n";
    steps = static_cast<int>(history.steps);
    std::cout << "input steps " << steps << "\n";
    return failures == 0 ? 0 : 1;
  }
  if (which == "fit-data") {
    // Model::fit over experimental_distribute_dataset (AutoShardPolicy DATA) of 25 samples batched
    // by 10, for 2 epochs: a global batch that the replicas do not split evenly (2 workers of 2
    // replicas: 3, 3, 2, 2 rows) and a last batch of 5 rows (3, 2, 0, 0: worker 1 gets none).
    // Every worker takes every step (one with no rows too), counts the cluster's samples, and
    // ends with the weights of the same fit in one process with one replica.
    const std::int64_t n = 25, batch = 10;
    std::vector<float> x, y;
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(i) / 10.0f;
      x.insert(x.end(), {v, 1.0f - v, 0.5f});
      y.push_back(2.0f * v - 1.0f);
    }
    const data::Dataset samples =
        data::Dataset::from_tensor_slices({Tensor::from_vector(x, {n, 3}), Tensor::from_vector(y, {n, 1})}).batch(batch);
    nn::FitOptions quiet;
    quiet.verbose = 0;
    std::vector<float> expected;
    {
      nn::Model alone(nn::Sequential({nn::Dense(3, 1, nn::Activation::none, 9)}));
      alone.compile(std::make_shared<nn::SGD>(0.05f), nn::Loss::mean_squared_error());
      alone.fit(samples, 2, -1, quiet);
      for (const Variable& v : alone.trainable_variables()) {
        for (float w : v.value().to_vector<float>()) expected.push_back(w);
      }
    }
    auto scope = s.scope();
    nn::Model model(nn::Sequential({nn::Dense(3, 1, nn::Activation::none, 9)}));
    model.compile(std::make_shared<nn::SGD>(0.05f), nn::Loss::mean_squared_error());
    InputOptions options;
    options.auto_shard_policy = AutoShardPolicy::data;
    const nn::History history = model.fit(s.experimental_distribute_dataset(samples, options), 2, -1, quiet);
    expect_eq(history.steps, std::int64_t{2 * 3}, "fit took every global batch's step on every worker");
    expect_eq(history.samples, 2 * n, "fit counted each global batch's rows once (" + std::to_string(history.samples) + ")");
    std::vector<Tensor> weights;
    std::vector<float> got;
    for (const Variable& v : model.trainable_variables()) {
      weights.push_back(s.experimental_local_results(v).front());
      for (float w : weights.back().to_vector<float>()) got.push_back(w);
    }
    expect_eq(got.size(), expected.size(), "as many weights as the model in one process");
    for (std::size_t i = 0; i < got.size() && i < expected.size(); ++i) {
      if (std::abs(got[i] - expected[i]) > 1e-5f * (1.0f + std::abs(expected[i]))) {
        std::cout << "FAIL weight " << i << " is " << got[i] << ", in one process " << expected[i] << "\n";
        ++failures;
      }
    }
    std::cout << "fit weights " << hash_bits(weights) << "\n";
    std::cout << "input steps " << history.steps << "\n";
    return failures == 0 ? 0 : 1;
  }
  if (which == "uneven" || which == "uneven-replica") {
    // One pipeline per worker, or (uneven-replica) per replica, each with its own number of ids.
    const bool per_replica = which == "uneven-replica";
    const std::vector<std::int64_t> sizes{11, 4, 0, 7, 5, 2, 9, 1};
    const int pipelines = per_replica ? workers * local : workers;
    std::int64_t total = 0, most_steps = 0;
    std::vector<std::int64_t> offset;
    for (int p = 0; p < pipelines; ++p) {
      offset.push_back(total);
      total += sizes[static_cast<std::size_t>(p)];
      const std::int64_t batches = (sizes[static_cast<std::size_t>(p)] + 1) / 2;
      most_steps = std::max(most_steps, per_replica ? batches : (batches + local - 1) / local);
    }
    InputOptions options;
    if (per_replica) options.experimental_replication_mode = InputReplicationMode::per_replica;
    auto dist = s.distribute_datasets_from_function([&](const InputContext& ctx) {
      const std::int64_t n = sizes[static_cast<std::size_t>(ctx.input_pipeline_id)];
      return data::Dataset::from_tensor_slices({Tensor::range(n) + Scalar(offset[static_cast<std::size_t>(ctx.input_pipeline_id)])})
          .batch(ctx.get_per_replica_batch_size(2 * ctx.num_replicas_in_sync));
    }, options);
    std::vector<std::int64_t> local_ids(static_cast<std::size_t>(total), 0);
    int empties = 0;
    steps = consume(s, dist, rows, local_ids, [&](const data::Element& e) {
      if (e[0].dtype() != DType::i64 || e[0].rank() != 1) {
        std::cout << "FAIL an element of dtype " << dtype_name(e[0].dtype()) << " shape " << shape_to_string(e[0].shape()) << "\n";
        ++failures;
      }
      if (e[0].shape()[0] == 0) ++empties;
      return e[0].to_vector<std::int64_t>();
    });
    expect_eq(steps, static_cast<int>(most_steps), "as many steps as the worker with most data");
    expect_eq(rows, total, "every row counted once over the steps");
    if (!per_replica && sizes[static_cast<std::size_t>(rank)] == 0) {
      expect_eq(empties, steps * local, "a worker without data gets empty batches");
    }
    counts = cluster_counts(s, local_ids);
    expect_eq(counts, std::vector<std::int64_t>(static_cast<std::size_t>(total), 1), "every id seen once");
  } else {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                      ("troupe-mw-input-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::vector<std::string> paths;
    std::vector<int> file_of;
    int id = 0;
    for (int f = 0; f < 6; ++f) {
      paths.push_back((dir / ("part-" + std::to_string(f) + ".csv")).string());
      std::ofstream out(paths.back());
      out << "id\n";
      for (int k = 0; k < 3 + f; ++k, ++id) {
        out << id << "\n";
        file_of.push_back(f);
      }
    }
    InputOptions options;
    options.auto_shard_policy = which == "off" ? AutoShardPolicy::off : which == "file" ? AutoShardPolicy::file : AutoShardPolicy::data;
    auto dist = s.experimental_distribute_dataset(data::csv_files_dataset(paths).batch(4), options);
    std::vector<std::int64_t> local_ids(static_cast<std::size_t>(id), 0);
    steps = consume(s, dist, rows, local_ids, [](const data::Element& e) {
      std::vector<std::int64_t> out;
      for (float v : e[0].to_vector<float>()) out.push_back(static_cast<std::int64_t>(v));
      return out;
    });
    std::filesystem::remove_all(dir);
    const std::int64_t copies = which == "off" ? workers : 1;
    expect_eq(rows, copies * id, "the steps' rows over the cluster");
    counts = cluster_counts(s, local_ids);
    expect_eq(counts, std::vector<std::int64_t>(static_cast<std::size_t>(id), copies), "how often each id was seen");
    if (which == "file") {
      for (int i = 0; i < id; ++i) {
        const bool mine = file_of[static_cast<std::size_t>(i)] % workers == rank;
        expect_eq(local_ids[static_cast<std::size_t>(i)], std::int64_t{mine ? 1 : 0},
                  "id " + std::to_string(i) + " of file " + std::to_string(file_of[static_cast<std::size_t>(i)]) +
                      (mine ? " read here" : " not read here"));
      }
    }
  }
  std::cout << "input steps " << steps << "\n";
  return failures == 0 ? 0 : 1;
}

// A strategy's variables in main, outside its scope, after training (TensorFlow's semantics): an
// on_read ONLY_FIRST_REPLICA counter incremented in 50 steps reads 50, an on_read SUM metric reads
// its sum over every replica of every worker, a mirrored variable its first component; assign
// writes every component; a CheckpointManager saves (only the chief's file stays) and restores.
int outside(MultiWorkerMirroredStrategy& s, const std::string& dir) {
  const int n = s.num_replicas_in_sync();
  std::optional<Variable> w, counter, metric;
  {
    auto scope = s.scope();
    w.emplace(Tensor::full({4}, 1.5, DType::f32), "w");
    counter.emplace(Tensor::scalar<float>(0.0f), "counter", VariableSynchronization::on_read,
                    VariableAggregation::only_first_replica);
    metric.emplace(Tensor::scalar<float>(0.0f), "metric", VariableSynchronization::on_read, VariableAggregation::sum);
  }
  for (int step = 0; step < 50; ++step) {
    s.run([&] {
      counter->assign_add(Tensor::scalar<float>(1.0f));
      metric->assign_add(Tensor::scalar<float>(2.0f));
    });
  }
  expect_eq(has_strategy(), false, "no strategy in main");
  expect_eq(counter->value().item<float>(), 50.0f, "the counter reads 50 outside the scope");
  expect_eq(metric->value().item<float>(), 100.0f * float(n), "the metric reads its sum over every worker");
  expect_eq(w->value().to_vector<float>(), std::vector<float>(4, 1.5f), "w reads its first component");
  w->assign(Tensor::full({4}, 2.5, DType::f32));
  for (const Tensor& c : s.experimental_local_results(*w)) {
    expect_eq(c.to_vector<float>(), std::vector<float>(4, 2.5f), "assign outside the scope writes every component");
  }
  CheckpointManager manager(Checkpoint({{"w", *w}, {"counter", *counter}, {"metric", *metric}}), dir, 2);
  const std::string written = manager.save(3);
  const bool chief = expected_rank(*s.cluster_resolver()) == 0;
  expect_eq(written.find(chief ? "ckpt-3.ckpt" : ".tmp.ckpt") != std::string::npos, true,
            "only the chief writes the real path, outside the scope too");
  w->assign(Tensor::zeros({4}));
  counter->assign(Tensor::scalar<float>(0.0f));
  metric->assign(Tensor::scalar<float>(0.0f));
  // Every worker restores the chief's file once it exists (the chief saved before this sum).
  s.reduce(ReduceOp::sum, s.experimental_distribute_values_from_function([](const ValueContext&) {
    return Tensor::scalar<int>(1);
  }), std::nullopt);
  auto step = manager.restore_or_initialize();
  expect_eq(step.has_value() && *step == 3, true, "restored step 3 outside the scope");
  for (const Tensor& c : s.experimental_local_results(*w)) {
    expect_eq(c.to_vector<float>(), std::vector<float>(4, 2.5f), "w restored into every component");
  }
  expect_eq(counter->value().item<float>(), 50.0f, "the counter restored");
  expect_eq(metric->value().item<float>(), 100.0f * float(n), "the metric restored so that it sums back");
  return failures == 0 ? 0 : 1;
}

// Model::fit steered from one worker at a time: worker 1 pauses after step 5 and, from another
// thread, sets the learning rate and resumes; the chief requests a checkpoint after step 12 and a
// stop after step 20. Every worker must apply each at the same step (requests ride on the next
// step's reduction; a pause's are agreed in their own collective), and end with the same weights.
// That reduction also gives every worker every replica's loss and every worker's step-time parts
// of the step before, and the stop's reason code (stopped_for).
int steer(MultiWorkerMirroredStrategy& s) {
  const int task = s.cluster_resolver()->task_id();
  auto scope = s.scope();
  nn::BlobOptions blobs;
  blobs.samples = 1024;
  const nn::ClassificationData d = nn::make_blobs(blobs);
  nn::Model model(nn::Sequential({nn::Dense(blobs.features, 32, nn::Activation::relu, 1),
                                  nn::Dense(32, blobs.classes, nn::Activation::none, 2)}));
  model.compile(std::make_shared<nn::SGD>(0.05f), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
  std::int64_t paused = 0, resumed = 0, checkpoint = 0, rate_changed = 0, rate_hook = 0;
  int replica_losses = 0, worker_parts = 0;  // at step 3: keys in the logs
  bool parts_positive = true;
  auto probe = std::make_shared<nn::LambdaCallback>();
  probe->batch_end = [&](std::int64_t, nn::Logs& logs) {
    const std::int64_t step = model.control().step();
    if (step == 3) {
      for (const auto& [name, value] : logs) {
        if (name.rfind("loss/replica_", 0) == 0 && std::isfinite(value)) ++replica_losses;
        if (name.rfind("worker_", 0) == 0 && name.find("/time/step_ms") != std::string::npos) {
          ++worker_parts;
          parts_positive = parts_positive && value > 0;
        }
      }
    }
    if (rate_changed == 0 && std::abs(logs.at("learning_rate") - 0.0125) < 1e-9) rate_changed = step;
    if (task == 1 && step == 5) model.control().pause();
    if (task == 0 && step == 12) model.control().request_checkpoint();
    if (task == 0 && step == 20) model.control().request_stop("stop from the chief");
  };
  probe->checkpoint = [&](std::int64_t step, nn::Logs&) { checkpoint = step; };
  struct Watch : nn::Callback {
    std::int64_t* paused;
    std::int64_t* resumed;
    void on_pause(std::int64_t step) override { *paused = step; }
    void on_resume(std::int64_t step) override { *resumed = step; }
    void on_learning_rate(std::int64_t step, double) override { *rate_hook = step; }
    std::int64_t* rate_hook;
  };
  auto watch = std::make_shared<Watch>();
  watch->paused = &paused;
  watch->resumed = &resumed;
  watch->rate_hook = &rate_hook;
  std::thread steering;
  if (task == 1) {
    steering = std::thread([&] {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!model.control().paused() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      model.control().set_learning_rate(0.0125);
      model.control().resume();
    });
  }
  nn::FitOptions options;
  options.verbose = 0;
  options.callbacks = {probe, watch};
  const auto batches = data::Dataset::from_tensor_slices({d.features, d.labels}).repeat().batch(32, true);
  const nn::History h = model.fit(batches, 2, 20, options);
  if (steering.joinable()) steering.join();
  std::vector<Tensor> weights;
  for (const Variable& v : model.trainable_variables()) weights.push_back(v.value());
  std::cout << "steer paused=" << paused << " resumed=" << resumed << " rate_changed=" << rate_changed
            << " checkpoint=" << checkpoint << " stopped=" << h.stopped_at_step << " steps=" << h.steps
            << " rate_hook=" << rate_hook << " replica_losses=" << replica_losses << " worker_parts=" << worker_parts
            << (parts_positive ? "" : " (not positive)")
            << " stopped_for_chief=" << model.control().stopped_for("stop from the chief")
            << " stopped_for_other=" << model.control().stopped_for("stopped from the dashboard")
            << " weights=" << hash_bits(weights) << "\n";
  std::cout << "reason " << h.stop_reason << "\n";
  return 0;
}

// The weights of `model` as one hash, after checking that every local replica holds the same bits.
std::uint64_t model_weights(MultiWorkerMirroredStrategy& s, const nn::Model& model) {
  std::vector<Tensor> weights;
  for (const Variable& v : model.trainable_variables()) {
    const auto components = s.experimental_local_results(v);
    for (const Tensor& c : components) {
      expect_eq(hash_bits({c}), hash_bits({components.front()}), "local replicas' " + v.name() + " identical");
    }
    weights.push_back(components.front());
  }
  return hash_bits(weights);
}

// nn::Model trained through train_step (or, with `via_fit`, through Model::fit with a metric, the
// way examples/mlp_classifier trains), whose gradients are all-reduced in buckets of
// TROUPE_GRADIENT_BUCKET_BYTES while the backward pass runs (0: one all-reduce after it): after
// every step a hash of the weights, which must not depend on the buckets.
int model_train(MultiWorkerMirroredStrategy& s, bool via_fit) {
  const int n = s.num_replicas_in_sync();
  const std::int64_t batch = 16, in = 96, hidden = 64, classes = 10;
  auto scope = s.scope();
  nn::Model model(nn::Sequential({nn::Dense(in, hidden, nn::Activation::relu, 1),
                                  nn::Dense(hidden, hidden, nn::Activation::relu, 2),
                                  nn::Dense(hidden, classes, nn::Activation::none, 3)}));
  if (via_fit) {
    model.compile(std::make_shared<nn::SGD>(0.05f, 0.9f), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
    const std::int64_t samples = 6 * batch * n;
    std::vector<std::int64_t> y(static_cast<std::size_t>(samples));
    for (std::int64_t i = 0; i < samples; ++i) y[static_cast<std::size_t>(i)] = (i * 3 + i / 7) % classes;
    const auto batches = data::Dataset::from_tensor_slices(
                             {nn::glorot_uniform(samples, in, 2000) * 4.0f, Tensor::from_vector(y, {samples})})
                             .batch(batch * n, true);
    auto probe = std::make_shared<nn::LambdaCallback>();
    int step = 0;
    probe->batch_end = [&](std::int64_t, nn::Logs&) {
      std::cout << "step " << step++ << " weights " << model_weights(s, model) << "\n";
    };
    nn::FitOptions options;
    options.verbose = 0;
    options.callbacks = {probe};
    const nn::History h = model.fit(batches, 1, 6, options);
    expect_eq(h.steps, std::int64_t{6}, "fit took 6 steps");
    // The wait for the other worker is a part of the exposed time.
    expect_eq(model.optimizer()->exposed_peer_wait_time() <= model.optimizer()->exposed_all_reduce_time(), true,
              "the exposed wait for another worker within the exposed time");
    std::cout << "exposed " << (model.optimizer()->exposed_all_reduce_time().count() > 0 ? "measured" : "none") << "\n";
    return failures == 0 ? 0 : 1;
  }
  model.compile(std::make_shared<nn::SGD>(0.05f, 0.9f), nn::Loss::sparse_categorical_crossentropy());
  // MW_DIE_AT_STEP: worker 1 dies there, while the others' buckets are on the ring.
  const char* die_at = std::getenv("MW_DIE_AT_STEP");
  for (int step = 0; step < 6; ++step) {
    if (die_at != nullptr && std::atoi(die_at) == step && s.cluster_resolver()->task_id() == 1) {
      std::cout << "dying" << std::endl;
      kill(getpid(), SIGKILL);
    }
    s.run([&] {
      const int id = get_replica_context()->replica_id_in_sync_group();
      const Tensor x = nn::glorot_uniform(batch, in, 2000 + step * 64 + id) * 4.0f;
      std::vector<std::int64_t> y(batch);
      for (std::int64_t i = 0; i < batch; ++i) y[i] = (i * 3 + step + id) % classes;
      return model.train_step({x, Tensor::from_vector(y, {batch})}, batch * n);
    });
    std::cout << "step " << step << " weights " << model_weights(s, model) << "\n";
  }
  // A collective after the buckets uses the ring in the same order on every worker.
  const auto total = s.run([] { return get_replica_context()->all_reduce(ReduceOp::sum, Tensor::full({3}, 1.0f)); });
  expect_eq(s.experimental_local_results(total).front().to_vector<float>(), std::vector<float>(3, static_cast<float>(n)),
            "an all_reduce after bucketed steps");
  std::cout << "exposed " << (model.optimizer()->exposed_all_reduce_time().count() > 0 ? "measured" : "none") << "\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "collectives";
  try {
    Runtime rt;
    CommunicationOptions options;
    if (const char* t = std::getenv("MW_TIMEOUT_MS")) options.timeout = std::chrono::milliseconds(std::atoi(t));
    if (const char* b = std::getenv("MW_BYTES_PER_PACK")) options.bytes_per_pack = std::strtoull(b, nullptr, 10);
    if (const char* c = std::getenv("MW_COMPRESSION")) {
      const std::string name = c;
      options.compression = name == "fp16" ? Compression::fp16 : name == "bf16" ? Compression::bf16 : Compression::none;
    }
    std::shared_ptr<ClusterResolver> resolver;
    const std::string which = std::getenv("MW_RESOLVER") ? std::getenv("MW_RESOLVER") : "tf_config";
    if (which == "slurm") {
      resolver = std::make_shared<SlurmClusterResolver>(std::atoi(std::getenv("MW_PORT_BASE")));
    } else if (which == "mpi") {
      resolver = std::make_shared<MpiClusterResolver>();
    } else {
      resolver = std::make_shared<TFConfigClusterResolver>();
    }
    MultiWorkerMirroredStrategy s(rt, options, resolver);
    const int n = s.num_replicas_in_sync();
    std::cout << "replicas " << n << " workers " << n / s.num_local_replicas() << " task "
              << s.cluster_resolver()->task_type() << ":" << s.cluster_resolver()->task_id() << std::endl;
    const int rank = expected_rank(*s.cluster_resolver());
    int rc = 0;
    if (mode == "collectives") {
      rc = collectives(s);
    } else if (mode == "die") {
      // Every worker all-reduces once; then worker MW_DYING_TASK (1 unless set) dies while the
      // others are in the next one.
      const char* dying = std::getenv("MW_DYING_TASK");
      const int victim = dying != nullptr ? std::atoi(dying) : 1;
      s.run([] { get_replica_context()->all_reduce(ReduceOp::sum, Tensor::zeros({100})); });
      if (s.cluster_resolver()->task_id() == victim) {
        std::cout << "dying" << std::endl;
        kill(getpid(), SIGKILL);
      }
      s.run([] { get_replica_context()->all_reduce(ReduceOp::sum, Tensor::zeros({100})); });
      std::cout << "FAIL the collective with a dead worker returned\n";
      rc = 1;
    } else if (mode == "hang") {
      // Worker MW_STOPPING_TASK (1 unless set) stops (as a hung process would) after the first
      // collective; the others must fail (by MW_TIMEOUT_MS, or the cluster watch) and exit.
      const char* stopping = std::getenv("MW_STOPPING_TASK");
      const int victim = stopping != nullptr ? std::atoi(stopping) : 1;
      s.run([] { get_replica_context()->all_reduce(ReduceOp::sum, Tensor::zeros({100})); });
      if (s.cluster_resolver()->task_id() == victim) {
        std::cout << "stopping" << std::endl;
        raise(SIGSTOP);
      }
      s.run([] { get_replica_context()->all_reduce(ReduceOp::sum, Tensor::zeros({100})); });
      std::cout << "FAIL the collective with a hung worker returned\n";
      rc = 1;
    } else if (mode == "skip") {
      // Every step all-reduces twice; task 1 skips the second all-reduce of step 2, so that its
      // step 3 meets the others' step 2: every worker must fail naming both steps and numbers.
      const int task = s.cluster_resolver()->task_id();
      for (int step = 1; step <= 4; ++step) {
        s.run([&] {
          auto* ctx = get_replica_context();
          ctx->all_reduce(ReduceOp::sum, Tensor::full({4}, step, DType::f32));
          if (!(task == 1 && step == 2)) ctx->all_reduce(ReduceOp::sum, Tensor::full({4}, 10 * step, DType::f32));
        });
      }
      std::cout << "FAIL every step returned although worker 1 skipped a collective\n";
      rc = 1;
    } else if (mode == "stall") {
      // Six steps of one 1 MiB all-reduce; at step MW_STALL_STEP (3 unless set) worker 1 stops
      // itself (SIGSTOP) in compute (after 1.2 s of it), before the step's all-reduce, as a hung
      // process would: the chief's stall inspector must name it while the others wait;
      // run_cluster.sh continues it.
      const char* at_env = std::getenv("MW_STALL_STEP");
      const int at = at_env != nullptr ? std::atoi(at_env) : 3;
      const int task = s.cluster_resolver()->task_id();
      for (int step = 1; step <= 6; ++step) {
        s.run([&] {
          if (task == 1 && step == at) {
            // Some compute first, so that a heartbeat tells the chief where it is.
            std::this_thread::sleep_for(std::chrono::milliseconds(1200));
            std::cout << "stopping in step " << step << std::endl;
            raise(SIGSTOP);
          }
          // The steps after the stall take a while, so that the chief sees it end.
          if (step > at) std::this_thread::sleep_for(std::chrono::milliseconds(500));
          const Tensor sum = get_replica_context()->all_reduce(ReduceOp::sum, Tensor::full({262144}, 1.0f));
          if (sum.to_vector<float>()[0] != static_cast<float>(n)) throw std::runtime_error("stall: a wrong sum");
        });
      }
      std::cout << "trained 6 steps" << std::endl;
    } else if (mode == "silent-link") {
      // Five steps of one 1 MiB all-reduce; step 3's values are 777, which silent_link_shim
      // (preloaded into worker 0 by run_cluster.sh) takes as the moment its link stops forwarding.
      for (int step = 1; step <= 5; ++step) {
        s.run([&] {
          get_replica_context()->all_reduce(ReduceOp::sum, Tensor::full({262144}, step == 3 ? 777.0f : 1.0f));
        });
      }
      std::cout << "FAIL every step returned although a ring link stopped forwarding\n";
      rc = 1;
    } else if (mode == "mismatch") {
      // Every step all-reduces twice; in step 2 worker 1's second all-reduce has another dtype
      // (MW_MISMATCH=dtype: float64) or size (MW_MISMATCH=size: 8 elements instead of 4).
      const char* what_env = std::getenv("MW_MISMATCH");
      const std::string what = what_env != nullptr ? what_env : "dtype";
      const int task = s.cluster_resolver()->task_id();
      for (int step = 1; step <= 4; ++step) {
        s.run([&] {
          auto* ctx = get_replica_context();
          ctx->all_reduce(ReduceOp::sum, Tensor::full({4}, step, DType::f32));
          if (task == 1 && step == 2) {
            ctx->all_reduce(ReduceOp::sum, what == "size" ? Tensor::full({8}, 20, DType::f32) : Tensor::full({4}, 20, DType::f64));
          } else {
            ctx->all_reduce(ReduceOp::sum, Tensor::full({4}, 10 * step, DType::f32));
          }
        });
      }
      std::cout << "FAIL every step returned although worker 1's tensor differed\n";
      rc = 1;
    } else if (mode == "tamper") {
      // Every worker all-reduces 12345 in every element, five times. run_cluster.sh preloads
      // tamper_shim into worker 0, which flips a bit of the first 12345 it sends: no worker may
      // finish with the altered sum.
      for (int k = 0; k < 5; ++k) {
        s.run([&] {
          const Tensor sum = get_replica_context()->all_reduce(ReduceOp::sum, Tensor::full({100}, 12345, DType::f32));
          if (sum.to_vector<float>() != std::vector<float>(100, 12345.0f * float(n))) {
            throw std::runtime_error("tamper: the all_reduce returned a wrong sum");
          }
        });
      }
      std::cout << "FAIL every all_reduce returned although a frame was altered\n";
      rc = 1;
    } else if (mode == "bucket-skip") {
      // Every worker's local replica 0 starts a gradient bucket that local replica 1 never starts;
      // both then all-reduce, whose merge waits for the started buckets first. The merge must
      // fail at once, naming replica 1 and the bucket, instead of waiting for it forever.
      s.run([] {
        auto* ctx = get_replica_context();
        auto& collectives = distribute::detail::collectives_of(*ctx);
        const int r = ctx->local_replica_index();
        collectives.start_all_reduce(r, ReduceOp::sum, {Tensor::full({8}, 1.0f)});
        if (r == 0) collectives.start_all_reduce(r, ReduceOp::sum, {Tensor::full({8}, 2.0f)});
        ctx->all_reduce(ReduceOp::sum, Tensor::full({4}, 1.0f));
      });
      std::cout << "FAIL the step returned although replica 1 skipped a bucket\n";
      rc = 1;
    } else if (mode == "checkpoint") {
      const char* dir = std::getenv("MW_CKPT_DIR");
      rc = checkpoint(s, dir ? dir : "/tmp/troupe-mw-ckpt");
    } else if (mode == "preempt") {
      const char* dir = std::getenv("MW_CKPT_DIR");
      rc = preempt(s, dir ? dir : "/tmp/troupe-mw-preempt");
    } else if (mode == "train" || mode == "train-cnn") {
      rc = train(s, mode == "train-cnn");
    } else if (mode == "model" || mode == "model-fit") {
      rc = model_train(s, mode == "model-fit");
    } else if (mode == "idle") {
      // The cluster watch alone for MW_IDLE_MS (what bench/control_plane_cost.sh measures).
      const char* idle = std::getenv("MW_IDLE_MS");
      std::this_thread::sleep_for(std::chrono::milliseconds(idle != nullptr ? std::atoi(idle) : 1000));
      s.run([] { get_replica_context()->all_reduce(ReduceOp::sum, Tensor::zeros({1})); });
    } else if (mode == "outside") {
      const char* dir = std::getenv("MW_CKPT_DIR");
      rc = outside(s, dir ? dir : "/tmp/troupe-mw-outside");
    } else if (mode == "input") {
      const char* which = std::getenv("MW_INPUT");
      rc = input(s, which ? which : "data");
    } else if (mode == "compressed") {
      rc = compressed(s, options.compression);
    } else if (mode == "steer") {
      rc = steer(s);
    } else if (mode == "join") {
      std::cout << "joined " << s.num_replicas_in_sync() << "\n";
    }
    if (rc == 0) std::cout << "OK " << rank << "\n";
    return rc;
  } catch (const std::exception& e) {
    std::cout << "ERROR " << e.what() << std::endl;
    return 3;
  }
}
