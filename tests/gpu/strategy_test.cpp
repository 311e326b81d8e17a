// The Strategy API on GPU replicas: GPU tensors and their kernels against the CPU's results, the
// seed examples on GPU:0..N-1, NCCL all-reduce/all-gather for every dtype, the cross-device ops,
// the optimizers' kernels, checkpoints of GPU variables, and the failure paths. Exits 77 (skipped,
// with the reason) where there is no GPU; a CUDA error on a machine with one fails, and an
// inherited TROUPE_FORCE_CPU is cleared first (gpu_check.hpp).

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <chrono>
#include <limits>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "../common/free_port.hpp"
#include "../common/temp_dir.hpp"
#include "../runtime/test_util.hpp"
#include "gpu_check.hpp"

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::free_port;
using troupe::testing::message_of;

namespace {

int gpu_count() { return Runtime::gpu_count(); }

std::vector<std::string> gpus(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back("GPU:" + std::to_string(i));
  return out;
}

std::vector<std::string> cpus(int n) { return troupe::testing::cpus(n); }

const Device gpu0 = Device(Device::Type::gpu, 0);

// Random values of every dtype; integers small and never zero (they serve as divisors too).
Tensor random_tensor(DType dtype, Shape shape, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const std::int64_t n = shape_num_elements(shape);
  switch (dtype) {
    case DType::f32: {
      std::uniform_real_distribution<float> d(-4.0f, 4.0f);
      std::vector<float> v(static_cast<std::size_t>(n));
      for (auto& x : v) x = d(rng);
      return Tensor::from_vector(v, shape);
    }
    case DType::f64: {
      std::uniform_real_distribution<double> d(-4.0, 4.0);
      std::vector<double> v(static_cast<std::size_t>(n));
      for (auto& x : v) x = d(rng);
      return Tensor::from_vector(v, shape);
    }
    case DType::i32: {
      std::uniform_int_distribution<int> d(1, 50);
      std::vector<std::int32_t> v(static_cast<std::size_t>(n));
      for (auto& x : v) x = d(rng) * (d(rng) % 2 ? 1 : -1);
      return Tensor::from_vector(v, shape);
    }
    case DType::i64: {
      std::uniform_int_distribution<std::int64_t> d(1, 50);
      std::vector<std::int64_t> v(static_cast<std::size_t>(n));
      for (auto& x : v) x = d(rng) * (d(rng) % 2 ? 1 : -1);
      return Tensor::from_vector(v, shape);
    }
    case DType::f16:
    case DType::bf16: return random_tensor(DType::f32, std::move(shape), seed).cast(dtype);
  }
  return Tensor();
}

const DType all_dtypes[] = {DType::f32, DType::f64, DType::i32, DType::i64};

}  // namespace

TEST_CASE("GPU tensors: copies both ways, through the staging buffers, are exact") {
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1001}, std::int64_t{3} << 20}) {
    Tensor host = random_tensor(DType::f32, {n}, 7);
    Tensor dev = host.to(gpu0);
    CHECK(dev.is_gpu());
    CHECK(dev.device() == gpu0);
    CHECK_FALSE(dev.shares_storage_with(host));
    CHECK(dev.to_vector<float>() == host.to_vector<float>());
    CHECK(dev.to(Device()).equals(host));
    CHECK(dev.equals(host));
  }
  // Every GPU to every other.
  for (int g = 1; g < gpu_count(); ++g) {
    Tensor t = random_tensor(DType::i64, {4097}, 3).to(gpu0);
    Tensor there = t.to(Device(Device::Type::gpu, g));
    CHECK(there.device().index() == g);
    CHECK(there.to_vector<std::int64_t>() == t.to_vector<std::int64_t>());
  }
}

TEST_CASE("GPU tensors: elementwise arithmetic, casts, concat, stack and reduce_sum give the CPU's values") {
  for (DType dtype : all_dtypes) {
    CAPTURE(dtype_name(dtype));
    const Tensor a = random_tensor(dtype, {33, 17}, 1);
    const Tensor b = random_tensor(dtype, {33, 17}, 2);
    const Tensor ga = a.to(gpu0);
    const Tensor gb = b.to(gpu0);
    CHECK((ga + gb).equals(a + b));
    CHECK((ga - gb).equals(a - b));
    CHECK((ga * gb).equals(a * b));
    CHECK((ga / gb).equals(a / b));
    CHECK((ga + 3).equals(a + 3));
    CHECK((ga * 2).equals(a * 2));
    CHECK((ga / 7).equals(a / 7));
    CHECK((5 - ga).equals(5 - a));
    CHECK((100 / ga).equals(100 / a));
    CHECK((-ga).equals(-a));
    CHECK((ga + gb).device() == gpu0);
    for (DType to : all_dtypes) CHECK(ga.cast(to).equals(a.cast(to)));
    CHECK(concat({ga, gb}, 0).equals(concat({a, b}, 0)));
    CHECK(concat({ga, gb.slice(0, 33)}, 1).equals(concat({a, b}, 1)));
    CHECK(stack({ga, gb}).equals(stack({a, b})));
    CHECK(reduce_sum(ga, 0).equals(reduce_sum(a, 0)));
    CHECK(reduce_sum(ga, 1).equals(reduce_sum(a, 1)));
    CHECK(ga.slice(3, 9).equals(a.slice(3, 9)));
    CHECK(ga.reshape({17, 33}).equals(a.reshape({17, 33})));
    CHECK(Tensor::zeros({5}, dtype, gpu0).equals(Tensor::zeros({5}, dtype)));
    CHECK(Tensor::full({5, 2}, 3, dtype, gpu0).equals(Tensor::full({5, 2}, 3, dtype)));
  }
  CHECK(Tensor::full({2}, std::int64_t{1} << 60, DType::i64, gpu0).to_vector<std::int64_t>() ==
        std::vector<std::int64_t>{std::int64_t{1} << 60, std::int64_t{1} << 60});
  CHECK(Tensor::scalar<float>(2.5f).to(gpu0).to_string() == "2.5");
  CHECK(Tensor::scalar<int>(4).to(gpu0).item<int>() == 4);
}

TEST_CASE("GPU tensors: errors say what is wrong") {
  Tensor g = Tensor::from_vector<int>({1, 2, 3}).to(gpu0);
  CHECK(contains(message_of([&] { (void)g.data<int>(); }), "data: the tensor is on GPU:0"));
  CHECK(contains(message_of([&] { (void)(g + Tensor::from_vector<int>({1, 1, 1})); }),
                 "operator+: operands are on GPU:0 and CPU:0"));
  CHECK(contains(message_of([&] { (void)(g / Tensor::from_vector<int>({1, 0, 1}).to(gpu0)); }),
                 "integer division by zero"));
  CHECK(contains(message_of([&] { (void)(g / 0); }), "integer division by zero"));
  Runtime rt;
  CHECK(contains(message_of([&] { MirroredStrategy(rt, {"GPU:0", "CPU:0"}); }), "mix CPU and GPU replicas"));
  CHECK(contains(message_of([&] { MirroredStrategy(rt, {"GPU:" + std::to_string(gpu_count())}); }),
                 "GPU(s) exist"));
  CHECK(contains(message_of([&] { MirroredStrategy(rt, cpus(2), std::make_shared<NcclAllReduce>()); }),
                 "NCCL needs GPU devices"));
}

TEST_CASE("CPU replicas given GPU tensors copy them to the host for their collectives") {
  Runtime rt;
  MirroredStrategy c(rt, cpus(2));
  const Tensor on_gpu = Tensor::from_vector<float>({1.0f, 2.0f}).to(gpu0);
  auto r = c.run([&] {
    auto* ctx = get_replica_context();
    return concat({ctx->all_reduce(ReduceOp::sum, on_gpu), ctx->all_gather(on_gpu, 0)}, 0);
  });
  for (const Tensor& t : c.experimental_local_results(r)) {
    CHECK_FALSE(t.is_gpu());
    CHECK(t.to_vector<float>() == std::vector<float>{2.0f, 4.0f, 1.0f, 2.0f, 1.0f, 2.0f});
  }
}

TEST_CASE("MirroredStrategy with no devices takes every GPU, and NCCL is its cross-device op") {
  Runtime rt;
  MirroredStrategy s(rt);
  CHECK(s.num_replicas_in_sync() == gpu_count());
  CHECK(s.extended().worker_devices()[0] == gpu0);
  CHECK(s.extended().cross_device_ops().name() == "NcclAllReduce");
}

TEST_CASE("the seed examples on GPU replicas print what they print on CPU replicas") {
  const int n = gpu_count();
  Runtime rt;
  MirroredStrategy g(rt, gpus(n));
  MirroredStrategy c(rt, cpus(n));
  // 1 and 2: gather.
  auto seed1 = [](Strategy& s) {
    return s.gather(s.experimental_distribute_values_from_function(
                        [](const ValueContext&) { return Tensor::from_vector<int>({1, 2}, {2, 1}); }),
                    0);
  };
  CHECK(seed1(g).to_string() == seed1(c).to_string());
  CHECK(seed1(g).device().to_string() == "CPU:0");
  auto seed2 = [](Strategy& s, int axis) {
    return s.gather(s.experimental_distribute_values_from_function(
                        [](const ValueContext&) { return Tensor::range(6, DType::i32).reshape({1, 2, 3}); }),
                    axis);
  };
  for (int axis : {0, 1, 2}) CHECK(seed2(g, axis).to_string() == seed2(c, axis).to_string());
  // 3: reduce(SUM) of the replica ids.
  auto ids = g.run([] {
    return Tensor::scalar<int>(get_replica_context()->replica_id_in_sync_group());
  });
  CHECK(g.experimental_local_results(ids)[0].device() == gpu0);
  CHECK(g.reduce(ReduceOp::sum, ids, std::nullopt).item<int>() == n * (n - 1) / 2);
  // 4: axis semantics and the partial batch denominator.
  auto partial = [](Strategy& s) {
    return s.experimental_distribute_values_from_function([](const ValueContext& ctx) {
      return ctx.replica_id_in_sync_group == 0 ? Tensor::from_vector<float>({0, 1, 2, 3})
                                               : Tensor::from_vector<float>({4, 5});
    });
  };
  CHECK(g.reduce(ReduceOp::mean, partial(g), 0).item<float>() == c.reduce(ReduceOp::mean, partial(c), 0).item<float>());
  CHECK(g.reduce("sum", partial(g), 0).item<float>() == c.reduce("sum", partial(c), 0).item<float>());
  // 5 and 6: plain and distributed arguments.
  auto five = g.run([](const Tensor& x) { return x * 2.0f; }, Tensor::scalar<float>(3.0f));
  for (const Tensor& t : g.experimental_local_results(five)) {
    CHECK(t.is_gpu());
    CHECK(t.to_string() == "6.0");
  }
  auto counts = g.experimental_distribute_values_from_function(
      [](const ValueContext& ctx) { return Tensor::scalar<int>(ctx.num_replicas_in_sync); });
  for (const Tensor& t : g.experimental_local_results(g.run([](const Tensor& x) { return x * 2; }, counts))) {
    CHECK(t.item<int>() == 2 * n);
  }
  // 7: all_reduce in the replica function.
  auto seven = g.run([](const Tensor& x) { return get_replica_context()->all_reduce(ReduceOp::sum, x); },
                     g.experimental_distribute_values_from_function(
                         [](const ValueContext& ctx) { return Tensor::scalar<int>(ctx.replica_id_in_sync_group); }));
  int r = 0;
  for (const Tensor& t : g.experimental_local_results(seven)) {
    CHECK(t.item<int>() == n * (n - 1) / 2);
    CHECK(t.device().to_string() == "GPU:" + std::to_string(r++));
  }
  // 8: values from a host array.
  const std::vector<double> array_value{3.0, 2.0, 1.0, 0.5, 0.25, 0.125, 9.0, 8.0};
  auto eight = g.experimental_distribute_values_from_function([&](const ValueContext& ctx) {
    return Tensor::scalar<double>(array_value[static_cast<std::size_t>(ctx.replica_id_in_sync_group)]);
  });
  CHECK(g.experimental_local_results(eight)[0].item<double>() == 3.0);
  CHECK(g.experimental_local_results(eight)[0].is_gpu());
}

TEST_CASE("NCCL all-reduce and all-gather in replica context: every dtype, SUM and MEAN, packed lists") {
  const int n = gpu_count();
  Runtime rt;
  MirroredStrategy g(rt, gpus(n));
  MirroredStrategy c(rt, cpus(n));
  for (DType dtype : all_dtypes) {
    CAPTURE(dtype_name(dtype));
    for (std::int64_t count : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1001}, std::int64_t{1} << 20}) {
      CAPTURE(count);
      auto inputs = [&](Strategy& s) {
        return s.experimental_distribute_values_from_function([&](const ValueContext& ctx) {
          return random_tensor(dtype, {count}, static_cast<std::uint32_t>(ctx.replica_id_in_sync_group + 10));
        });
      };
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean}) {
        auto fn = [op](const Tensor& x) { return get_replica_context()->all_reduce(op, x); };
        auto on_gpu = g.experimental_local_results(g.run(fn, inputs(g)));
        auto on_cpu = g.experimental_local_results(c.run(fn, inputs(c)));
        for (int r = 0; r < n; ++r) {
          CHECK(on_gpu[r].is_gpu());
          // NCCL sums in its own order: floats agree to rounding, integers exactly.
          if (dtype == DType::i32 || dtype == DType::i64 || n <= 2) {
            CHECK(on_gpu[r].equals(on_cpu[r]));
          } else {
            const auto a = on_gpu[r].cast(DType::f64).to_vector<double>();
            const auto b = on_cpu[r].cast(DType::f64).to_vector<double>();
            for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-5));
          }
        }
      }
    }
  }
  // A packed list is one NCCL group; all_gather with uneven first dimensions along axis 0 and 1.
  auto packed = g.run([](const Tensor& x) {
    auto* ctx = get_replica_context();
    auto outs = ctx->all_reduce(ReduceOp::sum, std::vector<Tensor>{x, x.cast(DType::f64), x.cast(DType::i64)});
    return concat({outs[0].cast(DType::f64), outs[1], outs[2].cast(DType::f64)}, 0);
  }, g.experimental_distribute_values_from_function([](const ValueContext& ctx) {
    return Tensor::full({3}, ctx.replica_id_in_sync_group + 1, DType::f32);
  }));
  const double total = n * (n + 1) / 2.0;
  for (const Tensor& t : g.experimental_local_results(packed)) {
    CHECK(t.to_vector<double>() == std::vector<double>(9, total));
  }
  auto gathered = g.run([](const Tensor& x) { return get_replica_context()->all_gather(x, 0); },
                        g.experimental_distribute_values_from_function([](const ValueContext& ctx) {
                          const int rows = ctx.replica_id_in_sync_group + 1;
                          return Tensor::full({rows, 2}, ctx.replica_id_in_sync_group, DType::i32);
                        }));
  for (const Tensor& t : g.experimental_local_results(gathered)) {
    CHECK(t.shape() == Shape{n * (n + 1) / 2, 2});
    CHECK(t.to_vector<int>()[0] == 0);
    CHECK(t.to_vector<int>().back() == n - 1);
  }
}

TEST_CASE("reduce with each cross-device op on GPU replicas, and reduce along an axis, match the CPU's") {
  const int n = gpu_count();
  Runtime rt;
  MirroredStrategy c(rt, cpus(n));
  std::vector<std::shared_ptr<CrossDeviceOps>> ops{std::make_shared<NcclAllReduce>(),
                                                   std::make_shared<ReductionToOneDevice>(),
                                                   std::make_shared<HierarchicalCopyAllReduce>()};
  for (const auto& op : ops) {
    CAPTURE(op->name());
    MirroredStrategy g(rt, gpus(n), op);
    for (DType dtype : all_dtypes) {
      auto values = [&](Strategy& s) {
        return s.experimental_distribute_values_from_function([&](const ValueContext& ctx) {
          return random_tensor(dtype, {64, 3}, static_cast<std::uint32_t>(ctx.replica_id_in_sync_group + 1));
        });
      };
      for (ReduceOp rop : {ReduceOp::sum, ReduceOp::mean}) {
        Tensor a = g.reduce(rop, values(g), std::nullopt);
        Tensor b = c.reduce(rop, values(c), std::nullopt);
        CHECK(a.device().to_string() == "CPU:0");
        CHECK(a.equals(b));
        CHECK(g.reduce(rop, values(g), 0).equals(c.reduce(rop, values(c), 0)));
      }
    }
  }
}

TEST_CASE("optimizers on GPU variables compute the CPU's bits, and checkpoints bring them back") {
  const int n = gpu_count();
  auto train = [&](Strategy& s, int which) {
    auto scope = s.scope();
    Variable w(random_tensor(DType::f32, {257}, 5), "w");
    std::shared_ptr<nn::Optimizer> opt;
    if (which == 0) opt = std::make_shared<nn::SGD>(0.1f);
    if (which == 1) opt = std::make_shared<nn::SGD>(0.05f, 0.9f, true);
    if (which == 2) opt = std::make_shared<nn::Adam>(0.01f);
    opt->build({{"w", w}});
    for (int step = 0; step < 5; ++step) {
      s.run([&] {
        const auto id = static_cast<std::uint32_t>(get_replica_context()->replica_id_in_sync_group());
        opt->apply_gradients({{random_tensor(DType::f32, {257}, 100 + id + static_cast<std::uint32_t>(step)), w}});
      });
    }
    return s.experimental_local_results(w);
  };
  Runtime rt;
  for (int which = 0; which < 3; ++which) {
    CAPTURE(which);
    MirroredStrategy g(rt, gpus(n));
    MirroredStrategy c(rt, cpus(n));
    auto on_gpu = train(g, which);
    auto on_cpu = train(c, which);
    {
      // The optimizer's iterations stay in host memory beside GPU replicas (read every step).
      auto scope = g.scope();
      nn::SGD probe(0.1f);
      Variable v(Tensor::from_vector<float>({1.0f}), "v");
      probe.build({{"v", v}});
      for (const Tensor& t : g.experimental_local_results(probe.iterations())) CHECK_FALSE(t.is_gpu());
      for (const Tensor& t : g.experimental_local_results(v)) CHECK(t.is_gpu());
    }
    for (int r = 0; r < n; ++r) {
      CHECK(on_gpu[r].is_gpu());
      if (n <= 2) {
        CHECK(on_gpu[r].equals(on_cpu[0]));  // NCCL's sum of two is the CPU's sum of two
      } else {
        const auto a = on_gpu[r].to_vector<float>();
        const auto b = on_cpu[0].to_vector<float>();
        for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-4));
      }
    }
  }
  // A checkpoint of a GPU variable holds its value, and restore puts it back on the GPU.
  troupe::testing::temp_dir dir("gpu-ckpt");
  MirroredStrategy g(rt, gpus(n));
  auto scope = g.scope();
  Variable w(Tensor::from_vector<float>({1.5f, -2.0f}), "w");
  Checkpoint ckpt({{"w", w}});
  const std::string path = ckpt.save((dir.path / "model").string());
  w.assign(Tensor::from_vector<float>({0.0f, 0.0f}));
  ckpt.restore(path);
  for (const Tensor& t : g.experimental_local_results(w)) {
    CHECK(t.is_gpu());
    CHECK(t.to_vector<float>() == std::vector<float>{1.5f, -2.0f});
  }
}

TEST_CASE("an MLP trained with fit on GPU replicas follows the CPU's loss curve and learns") {
  const int n = gpu_count();
  const nn::ClassificationData data = nn::make_blobs({1024, 8, 3, 2, 2.0f, 1.0f, 9});
  // Compiled with the accuracy metric, which a GPU replica counts on its device with the loss.
  std::vector<std::vector<double>> epoch_accuracy;
  auto curve = [&](Strategy& s) {
    auto scope = s.scope();
    nn::Model model(nn::Sequential({nn::Dense(8, 32, nn::Activation::relu, 21), nn::Dense(32, 3, nn::Activation::none, 22)}));
    model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
    std::vector<double> losses;
    nn::FitOptions o;
    o.verbose = 0;
    o.on_step_end = [&](std::int64_t, double loss) { losses.push_back(loss); };
    const nn::History h = model.fit(data::Dataset::from_tensor_slices({data.features, data.labels}).batch(64), 3, -1, o);
    REQUIRE(h.history.count("accuracy") == 1);
    epoch_accuracy.push_back(h.history.at("accuracy"));
    const double accuracy = model.evaluate(data.features, data.labels).accuracy;
    return std::make_pair(losses, accuracy);
  };
  Runtime rt;
  MirroredStrategy g(rt, gpus(n));
  MirroredStrategy c(rt, cpus(n));
  const bool tf32 = config::tensor_float_32_execution_enabled();
  config::enable_tensor_float_32_execution(false);  // exact float32 products, to follow the CPU closely
  const auto on_gpu = curve(g);
  config::enable_tensor_float_32_execution(true);
  const auto on_gpu_tf32 = curve(g);
  config::enable_tensor_float_32_execution(tf32);
  const auto on_cpu = curve(c);
  REQUIRE(on_gpu.first.size() == on_cpu.first.size());
  REQUIRE(on_gpu_tf32.first.size() == on_cpu.first.size());
  REQUIRE(on_gpu.first.size() == 48);
  for (std::size_t i = 0; i < on_gpu.first.size(); ++i) {
    CHECK(on_gpu.first[i] == doctest::Approx(on_cpu.first[i]).epsilon(1e-3));
    CHECK(on_gpu_tf32.first[i] == doctest::Approx(on_cpu.first[i]).epsilon(3e-2));
  }
  CHECK(on_gpu.first.back() < 0.5 * on_gpu.first.front());
  // Each epoch's accuracy counted on the GPU (exact float32) is the CPU's, but for the rare row
  // whose two largest logits swap under another order of additions.
  REQUIRE(epoch_accuracy.size() == 3);
  REQUIRE(epoch_accuracy[0].size() == 3);
  REQUIRE(epoch_accuracy[2].size() == 3);
  for (std::size_t e = 0; e < 3; ++e) {
    CHECK(epoch_accuracy[0][e] == doctest::Approx(epoch_accuracy[2][e]).epsilon(0.01));
    CHECK(epoch_accuracy[0][e] > 0.3);
  }
  CHECK(epoch_accuracy[0].back() >= 0.9);
  CHECK(on_gpu.second >= 0.9);
  CHECK(on_gpu_tf32.second >= 0.9);
}

TEST_CASE("a failing GPU replica fails the step with its cause, and the next step works") {
  const int n = gpu_count();
  Runtime rt;
  MirroredStrategy g(rt, gpus(n));
  const int bad = n - 1;
  auto inputs = g.experimental_distribute_values_from_function(
      [](const ValueContext&) { return Tensor::full({1 << 16}, 1.0f, DType::f32); });
  const auto start = std::chrono::steady_clock::now();
  std::string msg = message_of([&] {
    g.run([&](const Tensor& x) {
      auto* ctx = get_replica_context();
      if (ctx->replica_id_in_sync_group() == bad) throw std::runtime_error("bad batch");
      return ctx->all_reduce(ReduceOp::sum, x);  // the others wait inside NCCL for the failed one
    }, inputs);
  });
  CHECK(contains(msg, "replica " + std::to_string(bad)));
  CHECK(contains(msg, "bad batch"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
  auto ok = g.run([](const Tensor& x) { return get_replica_context()->all_reduce(ReduceOp::sum, x); }, inputs);
  for (const Tensor& t : g.experimental_local_results(ok)) CHECK(t.to_vector<float>()[7] == static_cast<float>(n));
  // Replicas that disagree on what they reduce are named with both shapes (needs two GPUs).
  if (n >= 2) {
    std::string mismatch = message_of([&] {
      g.run([](const Tensor&) {
        auto* ctx = get_replica_context();
        const std::int64_t len = ctx->replica_id_in_sync_group() == 0 ? 4 : 5;
        return ctx->all_reduce(ReduceOp::sum, Tensor::zeros({len}, DType::f32));
      }, inputs);
    });
    CHECK(contains(mismatch, "replica 0 sent float32 tensor of shape [4]"));
    CHECK(contains(mismatch, "replica 1 sent float32 tensor of shape [5]"));
  }
}

TEST_CASE("a GPU replica whose work outlasts TROUPE_COLLECTIVE_TIMEOUT_MS fails the step instead of waiting") {
  setenv("TROUPE_COLLECTIVE_TIMEOUT_MS", "30", 1);
  Runtime rt;
  MirroredStrategy g(rt, gpus(1));
  unsetenv("TROUPE_COLLECTIVE_TIMEOUT_MS");
  const bool tf32 = config::tensor_float_32_execution_enabled();
  config::enable_tensor_float_32_execution(false);  // exact float32: about 1 s of products on an H200
  const Tensor a = Tensor::full({8192, 8192}, 1.0f, DType::f32, gpu0);
  const auto start = std::chrono::steady_clock::now();
  std::string msg = message_of([&] {
    g.run([&] {
      Tensor x = a;
      for (int i = 0; i < 48; ++i) x = nn::matmul(x, a) * 0.0f;
      return get_replica_context()->all_reduce(ReduceOp::sum, x);
    });
  });
  CHECK(contains(msg, "did not complete within 30 ms; the communicators were aborted"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  config::enable_tensor_float_32_execution(tf32);
  // The next step runs on new communicators, after the queued work.
  auto ok = g.run([] { return get_replica_context()->all_reduce(ReduceOp::sum, Tensor::scalar<int>(5)); });
  CHECK(g.experimental_local_results(ok)[0].item<int>() == 5);
}

TEST_CASE("MultiWorkerMirroredStrategy with NCCL: the chief's id joins a communicator, and every call works") {
  // One worker: the whole cross-worker path (the id through the rendezvous, ncclCommInitRank on a
  // non-blocking communicator, the ring for cross-replica sums) on one machine's GPUs. Clusters of
  // several workers need a GPU per worker process.
  const int n = gpu_count();
  Runtime rt;
  auto resolver = std::make_shared<SimpleClusterResolver>(
      ClusterSpec(ClusterSpec::JobMap{{"worker", {"127.0.0.1:" + std::to_string(free_port())}}}), "worker", 0);
  CommunicationOptions options;
  options.implementation = CommunicationImplementation::nccl;
  MultiWorkerMirroredStrategy s(rt, options, resolver);
  REQUIRE(s.num_replicas_in_sync() == n);
  CHECK(s.extended().worker_devices()[0] == gpu0);
  auto ids = s.experimental_distribute_values_from_function(
      [](const ValueContext& ctx) { return Tensor::full({4}, ctx.replica_id_in_sync_group + 1, DType::f32); });
  auto summed = s.run([](const Tensor& x) {
    auto* ctx = get_replica_context();
    Tensor sum = ctx->all_reduce(ReduceOp::sum, x);
    Tensor mean = ctx->all_reduce(ReduceOp::mean, x);
    Tensor gathered = ctx->all_gather(x, 0);
    return concat({sum, mean, gathered.slice(0, 4)}, 0);
  }, ids);
  const float total = n * (n + 1) / 2.0f;
  for (const Tensor& t : s.experimental_local_results(summed)) {
    CHECK(t.is_gpu());
    const auto v = t.to_vector<float>();
    CHECK(v[0] == total);
    CHECK(v[4] == total / static_cast<float>(n));
    CHECK(v[8] == 1.0f);
  }
  CHECK(s.reduce(ReduceOp::sum, ids, std::nullopt).to_vector<float>()[0] == total);
  CHECK(s.gather(ids, 0).shape() == Shape{4 * n});
  auto scope = s.scope();
  Variable w(Tensor::from_vector<float>({1.0f, 2.0f}), "w");
  nn::SGD sgd(0.5f);
  sgd.build({{"w", w}});
  s.run([&] { sgd.apply_gradients({{Tensor::from_vector<float>({1.0f, 1.0f}), w}}); });
  for (const Tensor& t : s.experimental_local_results(w)) {
    CHECK(t.is_gpu());
    CHECK(t.to_vector<float>() == std::vector<float>{1.0f - 0.5f * n, 2.0f - 0.5f * n});
  }
}

namespace {

// Every bit pattern of a 16-bit format, as a tensor of that dtype.
Tensor all_16bit_patterns(DType dtype) {
  std::vector<std::uint16_t> bits(65536);
  for (std::uint32_t b = 0; b < 65536; ++b) bits[b] = static_cast<std::uint16_t>(b);
  return Tensor::from_bytes(bits.data(), bits.size() * 2, dtype, {65536});
}

// Equal bits, except that a float64 NaN may differ in its payload (the GPU widens NaN to its
// canonical NaN): there both must be NaN.
bool same_cast(const Tensor& gpu_result, const Tensor& cpu_result) {
  const Tensor g = gpu_result.to(Device());
  if (g.dtype() != DType::f64) return g.equals(cpu_result);
  const std::vector<double> a = g.to_vector<double>();
  const std::vector<double> b = cpu_result.to_vector<double>();
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0) return false;
  }
  return true;
}

// Random bit patterns of T (every float class: NaN payloads, infinities, denormals, huge).
template <class T, class Bits>
Tensor random_bits(std::size_t n, std::uint32_t seed, std::vector<T> extra) {
  std::mt19937_64 rng(seed);
  std::vector<T> v = std::move(extra);
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<Bits>(rng());
    T x;
    std::memcpy(&x, &b, sizeof x);
    v.push_back(x);
  }
  return Tensor::from_vector(v);
}

}  // namespace

TEST_CASE("GPU tensors: casts into and out of float16 and bfloat16 give the CPU's bits") {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<Tensor> sources = {
      random_bits<float, std::uint32_t>(1 << 16, 1, {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65519.0f, 65520.0f,
                                                      0x1p-25f, 3 * 0x1p-26f, inf, -inf, 1.0f + 0x1p-8f}),
      random_bits<double, std::uint64_t>(1 << 16, 2, {1.0 + 0x1p-11 + 0x1p-40, 1e300, -1e-300, 65520.0}),
      random_bits<std::int32_t, std::uint32_t>(1 << 16, 3, {2049, 2051, 65520, -70000}),
      random_bits<std::int64_t, std::uint64_t>(1 << 16, 4, {(std::int64_t{1} << 30) + (std::int64_t{1} << 22) + 1,
                                                             std::numeric_limits<std::int64_t>::min()}),
      all_16bit_patterns(DType::f16).cast(DType::f32),
      all_16bit_patterns(DType::bf16).cast(DType::f32)};
  for (const Tensor& s : sources) {
    CAPTURE(dtype_name(s.dtype()));
    const Tensor on_gpu = s.to(gpu0);
    for (DType to : {DType::f16, DType::bf16}) {
      CAPTURE(dtype_name(to));
      CHECK(same_cast(on_gpu.cast(to), s.cast(to)));
    }
  }
  for (DType from : {DType::f16, DType::bf16}) {
    CAPTURE(dtype_name(from));
    const Tensor all = all_16bit_patterns(from);
    const Tensor on_gpu = all.to(gpu0);
    for (DType to : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
      CAPTURE(dtype_name(to));
      CHECK(same_cast(on_gpu.cast(to), all.cast(to)));
    }
    // Into integers only the values that fit (a NaN or an overflow has no C++ result to match).
    std::vector<float> fit;
    for (float v : all.cast(DType::f32).to_vector<float>()) {
      if (std::isfinite(v) && std::fabs(v) < 2e9f) fit.push_back(v);
    }
    const Tensor fitting = Tensor::from_vector(fit).cast(from);
    for (DType to : {DType::i32, DType::i64}) {
      CAPTURE(dtype_name(to));
      CHECK(same_cast(fitting.to(gpu0).cast(to), fitting.cast(to)));
    }
  }
}

TEST_CASE("GPU tensors: 16-bit arithmetic and sums give the CPU's bits") {
  for (DType dtype : {DType::f16, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    const Tensor a = random_tensor(DType::f32, {33, 17}, 5).cast(dtype);
    const Tensor b = random_tensor(DType::f32, {33, 17}, 6).cast(dtype);
    const Tensor ga = a.to(gpu0);
    const Tensor gb = b.to(gpu0);
    CHECK((ga + gb).equals(a + b));
    CHECK((ga * gb).equals(a * b));
    CHECK((ga / 3).equals(a / 3));
    CHECK(reduce_sum(ga, 0).equals(reduce_sum(a, 0)));
    CHECK(Tensor::full({4}, 0.1, dtype, gpu0).equals(Tensor::full({4}, 0.1, dtype)));
  }
}

namespace {

// make_blobs' default problem on GPU:0 under `policy`; returns the training accuracy.
double fit_blobs_on_gpu(const char* policy, std::shared_ptr<nn::Optimizer> optimizer,
                        std::shared_ptr<nn::Optimizer>* compiled) {
  Runtime rt;
  MirroredStrategy strategy(rt, gpus(1));
  auto scope = strategy.scope();
  nn::BlobOptions blobs;
  blobs.samples = 4096;
  const nn::ClassificationData set = nn::make_blobs(blobs);
  nn::mixed_precision::set_global_policy(policy);
  nn::Model model(nn::Sequential({nn::Dense(32, 64, nn::Activation::relu, 1), nn::Dense(64, 64, nn::Activation::relu, 2),
                                  nn::Dense(64, 4, nn::Activation::none, 3)}));
  nn::mixed_precision::set_global_policy("float32");
  model.compile(std::move(optimizer), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
  nn::FitOptions options;
  options.verbose = 0;
  const data::Dataset examples = data::Dataset::from_tensor_slices({set.features, set.labels});
  model.fit(examples.shuffle(4096, 1).batch(64), 3, -1, options);
  *compiled = model.optimizer();
  return model.evaluate(examples.batch(512)).accuracy;
}

}  // namespace

TEST_CASE("GPU replicas: Model::fit converges on blobs under mixed_bfloat16 and mixed_float16, and loss scaling "
          "skips the steps that overflow and recovers") {
  std::shared_ptr<nn::Optimizer> compiled;
  CHECK(fit_blobs_on_gpu("mixed_bfloat16", std::make_shared<nn::Adam>(0.005f), &compiled) > 0.9);
  // 2^40 times the gradients overflows float16: the first steps are skipped and halve the scale.
  CHECK(fit_blobs_on_gpu("mixed_float16",
                         std::make_shared<nn::LossScaleOptimizer>(std::make_shared<nn::Adam>(0.005f), true, 0x1p40),
                         &compiled) > 0.9);
  const auto* lso = dynamic_cast<const nn::LossScaleOptimizer*>(compiled.get());
  REQUIRE(lso != nullptr);
  CHECK(lso->loss_scale() < 0x1p40);
  CHECK(lso->dynamic_counter() >= 96);
}

int main(int argc, char** argv) {
  const auto check = troupe::testing::check_gpus("GPU strategy tests");
  if (!check.run()) return check.exit_code;
  // The runtime's own count drives every test's replica count: it must be CUDA's.
  if (Runtime::gpu_count() != check.devices) {
    std::printf("FAIL GPU strategy tests: Runtime::gpu_count() is %d, the CUDA runtime reports %d\n",
                Runtime::gpu_count(), check.devices);
    return 1;
  }
  doctest::Context context(argc, argv);
  const int rc = context.run();
  troupe::testing::report_unexercised(
      check.devices, "GPU strategy tests",
      {{2, "copies from one GPU to another"},
       {2, "NCCL all-reduce and all-gather across GPU replicas (one replica's all_reduce returns its input)"},
       {2, "a failing replica while the others wait inside NCCL for it"},
       {2, "the error naming two replicas that reduce different shapes"},
       {3, "float sums in NCCL's order, compared with the CPU's to a tolerance"}});
  return rc;
}
