#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../common/free_port.hpp"
#include "../common/temp_dir.hpp"
#include "distribute/cluster/remote_wire.hpp"
#include "test_util.hpp"
#include "troupe/troupe.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::message_of;
namespace wire = troupe::distribute::detail;

TEST_CASE("remote values: tensors and per-worker iterators survive the wire bit for bit") {
  std::vector<FunctionContext::Argument> args(3);
  args[0].tensor = Tensor::from_vector<float>({1.5f, -2.0f, 3.25f, 0.0f}, {2, 2});
  args[1].iterator = 7;
  args[1].dataset_function = "mnist";
  args[2].tensor = Tensor::scalar<std::int64_t>(-42);
  auto back = wire::decode_arguments(wire::encode_arguments(args));
  REQUIRE(back.size() == 3);
  CHECK(back[0].tensor.shape() == Shape{2, 2});
  CHECK(back[0].tensor.to_vector<float>() == std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f});
  CHECK(back[1].iterator == 7);
  CHECK(back[1].dataset_function == "mnist");
  CHECK(back[2].tensor.item<std::int64_t>() == -42);
  auto empty = wire::decode_tensors(wire::encode_tensors({Tensor::zeros({0, 3}, DType::f64)}));
  REQUIRE(empty.size() == 1);
  CHECK(empty[0].shape() == Shape{0, 3});
  CHECK(empty[0].dtype() == DType::f64);
}

TEST_CASE("remote values: a truncated, oversized or inconsistent message is refused naming what is wrong") {
  const std::string good = wire::encode_tensors({Tensor::from_vector<float>({1, 2, 3}, {3})});
  for (std::size_t n = 0; n < good.size(); ++n) {
    CHECK_THROWS_AS(wire::decode_tensors(good.substr(0, n)), std::invalid_argument);
  }
  CHECK(contains(message_of([&] { wire::decode_tensors(good + "x"); }), "1 bytes are left over"));
  // The tensor claims 4 elements' bytes for a shape of 3.
  std::string lying = good;
  const std::size_t nbytes_at = 4 + 4 + 1 + 1 + 8;
  std::uint64_t wrong = 16;
  std::memcpy(lying.data() + nbytes_at, &wrong, sizeof wrong);
  CHECK(contains(message_of([&] { wire::decode_tensors(lying); }), "16 bytes for a float32 tensor of 3 elements"));
  // A dtype that does not exist, and a count far beyond the bytes.
  std::string bad_dtype = good;
  bad_dtype[8] = 9;
  CHECK(contains(message_of([&] { wire::decode_tensors(bad_dtype); }), "dtype 9 is unknown"));
  std::string huge = good;
  std::uint32_t count = 0xffffffffu;
  std::memcpy(huge.data() + 4, &count, sizeof count);
  CHECK(contains(message_of([&] { wire::decode_tensors(huge); }), "tensor count 4294967295 is above"));
  // A shape whose size overflows.
  std::string overflow = wire::encode_tensors({Tensor::zeros({2, 2})});
  std::int64_t big = std::int64_t{1} << 62;
  std::memcpy(overflow.data() + 10, &big, sizeof big);
  std::memcpy(overflow.data() + 18, &big, sizeof big);
  CHECK(contains(message_of([&] { wire::decode_tensors(overflow); }), "overflows"));
  CHECK(contains(message_of([&] { wire::decode_arguments(good); }), "does not start with this message kind"));
}

TEST_CASE("remote values: a variable table whose shards do not add up to the variable is refused") {
  wire::VariableTable t;
  t.ps.push_back({"/job:ps/replica:0/task:0", "127.0.0.1", 2222});
  t.variables.push_back(ShardedVariable{"w", {5, 2}, DType::f32, {{0, 3, "w/part_0"}, {0, 2, "w/part_1"}}});
  auto back = wire::decode_table(wire::encode_table(t));
  REQUIRE(back.variables.size() == 1);
  CHECK(back.variables[0].shards[1].key == "w/part_1");
  t.variables[0].shards[1].rows = 1;
  CHECK(contains(message_of([&] { wire::decode_table(wire::encode_table(t)); }), "hold 4 rows of 5"));
  t.variables[0].shards[1] = {3, 2, "w/part_1"};
  CHECK(contains(message_of([&] { wire::decode_table(wire::encode_table(t)); }), "on ps task 3 of 1"));
}

TEST_CASE("partitioners split axis 0 as TensorFlow's do") {
  CHECK(FixedShardsPartitioner(3)({10, 4}, DType::f32) == std::vector<int>{3, 1});
  CHECK(FixedShardsPartitioner(8)({5, 4}, DType::f32) == std::vector<int>{5, 1});  // at most one row each
  CHECK_THROWS_AS(FixedShardsPartitioner(0), std::invalid_argument);
  // 1024 x 256 float32 = 1 MiB.
  CHECK(MinSizePartitioner(256 << 10, 8)({1024, 256}, DType::f32) == std::vector<int>{4, 1});
  CHECK(MinSizePartitioner(256 << 10, 2)({1024, 256}, DType::f32) == std::vector<int>{2, 1});
  CHECK(MinSizePartitioner(4 << 20, 8)({1024, 256}, DType::f32) == std::vector<int>{1, 1});
  CHECK(MaxSizePartitioner(300 << 10)({1024, 256}, DType::f32) == std::vector<int>{4, 1});
  CHECK(MaxSizePartitioner(300 << 10, 2)({1024, 256}, DType::f32) == std::vector<int>{2, 1});
  CHECK(MaxSizePartitioner(1)({3}, DType::f64) == std::vector<int>{3});
  CHECK(contains(message_of([] { MaxSizePartitioner(0); }), "max_shard_bytes 0"));
}

TEST_CASE("a function registry refuses duplicate names and names a module it cannot load") {
  FunctionRegistry r;
  r.add("step", [](FunctionContext&) { return std::vector<Tensor>{}; });
  r.add_dataset("data", [] { return data::Dataset::range(3); });
  CHECK(contains(message_of([&] { r.add("step", [](FunctionContext&) { return std::vector<Tensor>{}; }); }),
                 "'step' is registered already"));
  CHECK(contains(message_of([&] { r.add_dataset("step", [] { return data::Dataset::range(1); }); }),
                 "'step' is registered already"));
  CHECK(r.names() == std::vector<std::string>{"data", "step"});
  CHECK(r.find("data") == nullptr);
  CHECK(r.find_dataset("data") != nullptr);
  CHECK(contains(message_of([&] { r.load_module("/nonexistent/libsteps.so"); }),
                 "cannot load module '/nonexistent/libsteps.so'"));
}

TEST_CASE("a Server refuses a chief task and a cluster beyond loopback without a token") {
  Runtime rt;
  ClusterSpec spec(ClusterSpec::JobMap{{"chief", {"127.0.0.1:1"}}, {"worker", {"10.1.2.3:2222"}}, {"ps", {"10.1.2.4:2222"}}});
  ServerOptions o;
  CHECK(contains(message_of([&] { Server s(rt, spec, "chief", 0, {}, o); }), "runs no Server"));
  CHECK(contains(message_of([&] { Server s(rt, spec, "worker", 0, {}, o); }),
                 "Server: the cluster spans more than loopback (10.1.2.4:2222) and no cluster token is set"));
  CHECK_THROWS_AS(Server(rt, spec, "worker", 3, {}, o), std::out_of_range);
}

TEST_CASE("a coordinator schedules onto in-process servers, shards variables over two ps tasks and names failures") {
  const auto a = troupe::testing::loopback_addresses(4);
  ClusterSpec spec(ClusterSpec::JobMap{{"chief", {a[0]}}, {"worker", {a[1]}}, {"ps", {a[2], a[3]}}});
  FunctionRegistry functions;
  functions.add("scale", [](FunctionContext& ctx) {
    Tensor w = ctx.read_variable("w");
    ctx.assign_add("w", w * ctx.arg(0).item<float>());
    return std::vector<Tensor>{w};
  });
  functions.add("throw", [](FunctionContext&) -> std::vector<Tensor> { throw std::runtime_error("bad batch"); });
  // Both variables at once, each shard's read and update in flight together.
  functions.add("step", [](FunctionContext& ctx) {
    auto vs = ctx.read_variables({"w", "b"});
    ctx.assign_sub({"w", "b"}, {vs[0] * 0.5f, vs[1] * 0.5f});
    ctx.assign_sub(std::vector<std::string>{"w"}, std::vector<Tensor>{});  // one value per name, or nothing is sent
    return vs;
  });
  ServerOptions o;
  Runtime worker_rt, ps0_rt, ps1_rt, chief_rt;
  Server worker(worker_rt, spec, "worker", 0, functions, o);
  Server ps0(ps0_rt, spec, "ps", 0, {}, o);
  std::optional<Server> ps1;
  ps1.emplace(ps1_rt, spec, "ps", 1, FunctionRegistry{}, o);
  {
    auto resolver = std::make_shared<SimpleClusterResolver>(spec, "chief", 0);
    ParameterServerStrategy strategy(chief_rt, resolver, std::make_shared<FixedShardsPartitioner>(2), o);
    ClusterCoordinator coordinator(strategy);
    auto v = strategy.create_variable("w", Tensor::from_vector<float>({1, 2, 3}, {3, 1}));
    REQUIRE(v.shards.size() == 2);
    CHECK(v.shards[0].ps == 0);
    CHECK(v.shards[1].ps == 1);
    CHECK(v.shards[0].rows == 2);  // the first rows % n shards take one row more
    CHECK(v.shards[1].rows == 1);
    auto r = coordinator.schedule("scale", 1.0f);
    CHECK(coordinator.fetch(r).at(0).to_vector<float>() == std::vector<float>{1, 2, 3});
    coordinator.join();
    CHECK(strategy.read_variable("w").to_vector<float>() == std::vector<float>{2, 4, 6});
    CHECK(contains(message_of([&] { strategy.create_variable("w", Tensor::zeros({1})); }), "exists already"));
    strategy.create_variable("b", Tensor::from_vector<float>({8, 8, 8, 8}, {4}));
    auto step = coordinator.schedule("step");
    CHECK(contains(message_of([&] { coordinator.join(); }), "1 names and 0 values (expected one value per name)"));
    CHECK_THROWS_AS(coordinator.fetch(step), troupe::Error);  // after the first updates were applied
    CHECK(strategy.read_variable("w").to_vector<float>() == std::vector<float>{1, 2, 3});
    CHECK(strategy.read_variable("b").to_vector<float>() == std::vector<float>{4, 4, 4, 4});

    coordinator.schedule("throw");
    CHECK(contains(message_of([&] { coordinator.join(); }),
                   "function 'throw' failed on /job:worker/replica:0/task:0: bad batch"));
    CHECK(coordinator.done());
    CHECK(coordinator.closures_done() == 3);
    CHECK(coordinator.closures_retried() == 0);

    // A ps task that goes away fails join and the chief's own reads at once, naming it.
    ps1.reset();
    const auto t0 = std::chrono::steady_clock::now();
    std::string lost;
    while (lost.empty() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2)) {
      lost = message_of([&] { coordinator.done(); });  // empty until the loss is known
      if (lost.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    CHECK(contains(lost, "ps task /job:ps/replica:0/task:1 is lost"));
    CHECK(contains(message_of([&] { coordinator.join(); }), "ps task /job:ps/replica:0/task:1 is lost"));
    CHECK(contains(message_of([&] { strategy.read_variable("w"); }), "/job:ps/replica:0/task:1"));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
  }
}

TEST_CASE("a ps shard applies updates in place and refuses one that does not fit") {
  using op = troupe::actors::update_op;
  std::string shard = wire::encode_tensor(Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2}));
  CHECK_FALSE(wire::update_in_place(shard, op::add, wire::encode_tensor(Tensor::from_vector<float>({1, 1, 1, 1}, {2, 2}))));
  CHECK_FALSE(wire::update_in_place(shard, op::subtract, wire::encode_tensor(Tensor::from_vector<float>({0, 0, 0, 0.5f}, {2, 2}))));
  CHECK(wire::decode_tensor(shard).to_vector<float>() == std::vector<float>{2, 3, 4, 4.5f});
  auto bad = wire::update_in_place(shard, op::add, wire::encode_tensor(Tensor::from_vector<float>({1, 1}, {2})));
  REQUIRE(bad);
  CHECK(contains(*bad, "shapes and dtypes must match"));
  // 16-bit shards: the sum in float32, rounded once to the format.
  for (const DType dtype : {DType::f16, DType::bf16}) {
    std::string half = wire::encode_tensor(Tensor::from_vector<float>({1, 2, -3}).cast(dtype));
    CHECK(wire::decode_tensor(half).dtype() == dtype);
    CHECK_FALSE(wire::update_in_place(half, op::add, wire::encode_tensor(Tensor::from_vector<float>({0.5f, 0.25f, 1}).cast(dtype))));
    CHECK_FALSE(wire::update_in_place(half, op::subtract, wire::encode_tensor(Tensor::from_vector<float>({1, 0, 0}).cast(dtype))));
    CHECK(wire::decode_tensor(half).cast(DType::f32).to_vector<float>() == std::vector<float>{0.5f, 2.25f, -2});
  }
  // An operation byte from the network that names none is refused before it reaches the shard.
  CHECK_FALSE(troupe::actors::update_op_of(7).has_value());
  CHECK(troupe::actors::update_op_of(2) == op::subtract);
  CHECK(troupe::actors::unknown_update_op(7) == "update operation 7 is unknown (expected 0 assign, 1 add or 2 subtract)");
  std::string ints = wire::encode_tensor(Tensor::from_vector<std::int64_t>({5, -5}, {2}));
  CHECK_FALSE(wire::update_in_place(ints, op::subtract, wire::encode_tensor(Tensor::from_vector<std::int64_t>({7, 7}, {2}))));
  CHECK(wire::decode_tensor(ints).to_vector<std::int64_t>() == std::vector<std::int64_t>{-2, -12});
  CHECK_FALSE(wire::update_in_place(ints, op::assign, wire::encode_tensor(Tensor::from_vector<std::int64_t>({9, 9}, {2}))));
  CHECK(wire::decode_tensor(ints).to_vector<std::int64_t>() == std::vector<std::int64_t>{9, 9});
  CHECK_THROWS_AS(wire::update_in_place(ints, op::add, "junk"), std::invalid_argument);
}

TEST_CASE("embedding lookups and scatters move only the rows named, over two ps tasks") {
  const auto a = troupe::testing::loopback_addresses(4);
  ClusterSpec spec(ClusterSpec::JobMap{{"chief", {a[0]}}, {"worker", {a[1]}}, {"ps", {a[2], a[3]}}});
  FunctionRegistry functions;
  // Rows 5, 0, 5 and 3 (shard 1, shard 0, shard 1 again, shard 1): in the order asked.
  functions.add("lookup", [](FunctionContext& ctx) {
    return std::vector<Tensor>{ctx.embedding_lookup("emb", {5, 0, 5, 3})};
  });
  // An SGD step on the rows a batch used: row 1 twice (both subtracted), row 4 once.
  functions.add("sgd_rows", [](FunctionContext& ctx) {
    ctx.scatter_sub("emb", {1, 4, 1}, Tensor::from_vector<float>({1, 1, 1, 10, 10, 10, 2, 2, 2}, {3, 3}));
    ctx.scatter_update("emb", {0, 0}, Tensor::from_vector<float>({7, 7, 7, 9, 9, 9}, {2, 3}));
    return std::vector<Tensor>{};
  });
  functions.add("outside", [](FunctionContext& ctx) {
    return std::vector<Tensor>{ctx.embedding_lookup("emb", {2, 6})};
  });
  functions.add("bad_rows", [](FunctionContext& ctx) {
    ctx.scatter_add("emb", {2}, Tensor::zeros({2, 3}));
    return std::vector<Tensor>{};
  });
  ServerOptions o;
  Runtime worker_rt, ps0_rt, ps1_rt, chief_rt;
  Server worker(worker_rt, spec, "worker", 0, functions, o);
  Server ps0(ps0_rt, spec, "ps", 0, {}, o);
  Server ps1(ps1_rt, spec, "ps", 1, {}, o);
  auto resolver = std::make_shared<SimpleClusterResolver>(spec, "chief", 0);
  ParameterServerStrategy strategy(chief_rt, resolver, std::make_shared<FixedShardsPartitioner>(2), o);
  ClusterCoordinator coordinator(strategy);
  std::vector<float> init(18);
  for (std::size_t i = 0; i < init.size(); ++i) init[i] = static_cast<float>(i);  // row r holds 3r, 3r+1, 3r+2
  auto v = strategy.create_variable("emb", Tensor::from_vector<float>(init, {6, 3}));
  REQUIRE(v.shards.size() == 2);
  REQUIRE(v.shards[0].ps != v.shards[1].ps);

  auto rows = coordinator.fetch(coordinator.schedule("lookup")).at(0);
  CHECK(rows.shape() == Shape{4, 3});
  CHECK(rows.to_vector<float>() == std::vector<float>{15, 16, 17, 0, 1, 2, 15, 16, 17, 9, 10, 11});

  coordinator.fetch(coordinator.schedule("sgd_rows"));
  auto after = strategy.read_variable("emb").to_vector<float>();
  std::vector<float> expected = init;
  for (int c = 0; c < 3; ++c) {
    expected[3 + c] -= 1 + 2;  // row 1, named twice
    expected[12 + c] -= 10;    // row 4
    expected[c] = 9;           // row 0 set twice: the last wins
  }
  CHECK(after == expected);

  CHECK(contains(message_of([&] { coordinator.fetch(coordinator.schedule("outside")); }),
                 "variable 'emb' has 6 rows; id 6 (at 1) is outside them"));
  CHECK(contains(message_of([&] { coordinator.join(); }), "is outside them"));  // raised once, as TensorFlow does
  CHECK(contains(message_of([&] { coordinator.fetch(coordinator.schedule("bad_rows")); }),
                 "with shape [1, the variable's other dims] (one row per id)"));
  CHECK(strategy.read_variable("emb").to_vector<float>() == expected);  // the refused ones changed nothing
}

TEST_CASE("a checkpoint of ps variables restores onto another number of ps tasks (resharded)") {
  // Both clusters' addresses at once: the second's tasks start as the first's stop.
  const auto a = troupe::testing::loopback_addresses(9);
  troupe::testing::temp_dir dir("ps-ckpt");
  std::vector<float> init(21);
  for (std::size_t i = 0; i < init.size(); ++i) init[i] = static_cast<float>(i) * 0.5f;
  std::string saved;
  {
    ClusterSpec spec(ClusterSpec::JobMap{{"chief", {a[0]}}, {"worker", {a[1]}}, {"ps", {a[2], a[3]}}});
    ServerOptions o;
    Runtime worker_rt, ps0_rt, ps1_rt, chief_rt;
    Server worker(worker_rt, spec, "worker", 0, FunctionRegistry{}, o);
    Server ps0(ps0_rt, spec, "ps", 0, {}, o);
    Server ps1(ps1_rt, spec, "ps", 1, {}, o);
    auto resolver = std::make_shared<SimpleClusterResolver>(spec, "chief", 0);
    ParameterServerStrategy strategy(chief_rt, resolver, std::make_shared<FixedShardsPartitioner>(2), o);
    auto scope = strategy.scope();
    Variable emb(Tensor::from_vector<float>(init, {7, 3}), "emb");
    Variable bias(Tensor::from_vector<float>({1, 2}), "bias");
    REQUIRE(strategy.variables().at(0).shards.size() == 2);
    Checkpoint ckpt({{"emb", emb}, {"bias", bias}});
    saved = ckpt.save((dir.path / "ps").string());
  }
  ClusterSpec spec(ClusterSpec::JobMap{{"chief", {a[4]}}, {"worker", {a[5]}}, {"ps", {a[6], a[7], a[8]}}});
  ServerOptions o;
  Runtime worker_rt, ps0_rt, ps1_rt, ps2_rt, chief_rt;
  Server worker(worker_rt, spec, "worker", 0, FunctionRegistry{}, o);
  Server ps0(ps0_rt, spec, "ps", 0, {}, o);
  Server ps1(ps1_rt, spec, "ps", 1, {}, o);
  Server ps2(ps2_rt, spec, "ps", 2, {}, o);
  auto resolver = std::make_shared<SimpleClusterResolver>(spec, "chief", 0);
  ParameterServerStrategy strategy(chief_rt, resolver, std::make_shared<FixedShardsPartitioner>(3), o);
  auto scope = strategy.scope();
  Variable emb(Tensor::zeros({7, 3}), "emb");
  Variable bias(Tensor::zeros({2}), "bias");
  REQUIRE(strategy.variables().at(0).shards.size() == 3);
  Checkpoint ckpt({{"emb", emb}, {"bias", bias}});
  ckpt.restore(saved);
  CHECK(strategy.read_variable("emb").to_vector<float>() == init);
  CHECK(strategy.read_variable("bias").to_vector<float>() == std::vector<float>{1, 2});
  // A shape that does not match is refused naming the variable, and changes nothing.
  Variable other(Tensor::zeros({3, 3}), "other");
  Checkpoint wrong({{"emb", other}});
  CHECK(contains(message_of([&] { wrong.restore(saved); }), "emb"));
  CHECK(strategy.read_variable("other").to_vector<float>() == std::vector<float>(9, 0.0f));
}

TEST_CASE("a Checkpoint of ps variables is a sharded checkpoint with their optimizer slots, and a values-only file is refused for them") {
  const auto a = troupe::testing::loopback_addresses(4);
  troupe::testing::temp_dir dir("ps-ckpt-slots");
  ClusterSpec spec(ClusterSpec::JobMap{{"chief", {a[0]}}, {"worker", {a[1]}}, {"ps", {a[2], a[3]}}});
  FunctionRegistry functions;
  functions.add("adam", [](FunctionContext& ctx) {
    ctx.apply_gradients(ShardOptimizer::adam(0.01f), {"w"}, {Tensor::full({4, 3}, 1.0f)});
    return std::vector<Tensor>{};
  });
  functions.add("sgd", [](FunctionContext& ctx) {
    ctx.apply_gradients(ShardOptimizer::sgd(0.1f), {"s"}, {Tensor::full({4, 3}, 1.0f)});
    return std::vector<Tensor>{};
  });
  ServerOptions o;
  Runtime worker_rt, ps0_rt, ps1_rt, chief_rt;
  Server worker(worker_rt, spec, "worker", 0, functions, o);
  Server ps0(ps0_rt, spec, "ps", 0, {}, o);
  Server ps1(ps1_rt, spec, "ps", 1, {}, o);
  auto resolver = std::make_shared<SimpleClusterResolver>(spec, "chief", 0);
  ParameterServerStrategy strategy(chief_rt, resolver, std::make_shared<FixedShardsPartitioner>(2), o);
  ClusterCoordinator coordinator(strategy);
  const Variable local_w(Tensor::full({4, 3}, 5.0f), "w");  // a variable of this process
  const Variable local_copy(Tensor::zeros({4, 3}), "copy");
  auto scope = strategy.scope();
  Variable w(Tensor::zeros({4, 3}), "w");
  Variable s(Tensor::zeros({4, 3}), "s");
  Variable b(Tensor::from_vector<float>({1, 2}), "b");
  REQUIRE(strategy.variables().at(0).shards.size() == 2);
  // A Checkpoint of ps variables is a sharded checkpoint: the directory "ps-1", every ps task's
  // file and the manifest.
  Checkpoint all({{"w", w}, {"s", s}, {"b", b}});
  const std::string before = all.save((dir.path / "ps").string());
  CHECK(std::filesystem::is_directory(before));
  CHECK(std::filesystem::exists(std::filesystem::path(before) / "manifest.json"));
  CHECK(std::filesystem::exists(std::filesystem::path(before) / "shard-1-of-2.ckpt"));

  // Adam's first update makes its two slots on both shards of w; plain SGD keeps none. Saved with
  // them, and restored: the slots come back too (a second Adam step from the restored checkpoint
  // gives the bits of a second step without the restore).
  coordinator.fetch(coordinator.schedule("adam"));
  coordinator.fetch(coordinator.schedule("sgd"));
  const std::vector<float> trained = w.value().to_vector<float>();
  REQUIRE(trained != std::vector<float>(12, 0.0f));
  const std::string after = all.save((dir.path / "ps").string());
  CHECK(after == (dir.path / "ps-2").string());
  coordinator.fetch(coordinator.schedule("adam"));
  const std::vector<float> second_step = w.value().to_vector<float>();
  all.restore(before);  // before any update: values, no slots
  CHECK(w.value().to_vector<float>() == std::vector<float>(12, 0.0f));
  all.restore(after);
  CHECK(w.value().to_vector<float>() == trained);
  CHECK(s.value().to_vector<float>() == std::vector<float>(12, -0.1f));
  coordinator.fetch(coordinator.schedule("adam"));
  CHECK(w.value().to_vector<float>() == second_step);
  // Restored into a variable of this process (a copy of the model outside the cluster): the value.
  Checkpoint copy({{"w", local_copy}});
  copy.restore(after);
  CHECK(local_copy.value().to_vector<float>() == trained);

  // A checkpoint file (values only) of a variable named w, restored into w with Adam's slots:
  // refused, naming what keeps the slots, and nothing changes.
  Checkpoint file({{"w", local_w}});
  const std::string values_only = file.save((dir.path / "local").string());
  Checkpoint just_w({{"w", w}});
  const std::string restoring = message_of([&] { just_w.restore(values_only); });
  CAPTURE(restoring);
  CHECK(contains(restoring, "Checkpoint::restore: variable 'w'"));
  CHECK(contains(restoring, "keeps 2 optimizer slot(s)"));
  CHECK(contains(restoring, "restore a sharded checkpoint"));
  CHECK(w.value().to_vector<float>() == second_step);
  // A variable of this process beside ps variables: refused before anything is written.
  Checkpoint mixed({{"w", w}, {"local", local_w}});
  const std::string mixing = message_of([&] { mixed.save((dir.path / "mixed").string()); });
  CHECK(contains(mixing, "variable 'local' lives in this process, beside variables on the ps tasks"));
  CHECK_FALSE(std::filesystem::exists(dir.path / "mixed-1"));
}

TEST_CASE("ps tasks apply SGD, momentum, Adam and AdamW with their own slots, dense and to rows, with nn's bits") {
  const auto a = troupe::testing::loopback_addresses(4);
  ClusterSpec spec(ClusterSpec::JobMap{{"chief", {a[0]}}, {"worker", {a[1]}}, {"ps", {a[2], a[3]}}});
  const auto optimizer_of = [](int which) {
    switch (which) {
      case 0: return ShardOptimizer::sgd(0.1f);
      case 1: return ShardOptimizer::sgd(0.05f, 0.9f, true);
      case 2: return ShardOptimizer::adam(0.01f);
      default: return ShardOptimizer::adamw(0.01f, 0.05f);
    }
  };
  FunctionRegistry functions;
  // arg 0: the optimizer; arg 1: the variable's gradient.
  functions.add("apply", [&](FunctionContext& ctx) {
    const int which = ctx.arg(0).item<std::int32_t>();
    ctx.apply_gradients(optimizer_of(which), {"w" + std::to_string(which)}, {ctx.arg(1)});
    return std::vector<Tensor>{};
  });
  // Rows 1, 4 and 1 again of "emb" by Adam: row 1 gets the sum of its two gradients.
  functions.add("rows", [](FunctionContext& ctx) {
    ctx.apply_gradients(ShardOptimizer::adam(0.01f), "emb", {1, 4, 1},
                        Tensor::from_vector<float>({0.5f, -1, 2, 3, 3, 3, 0.25f, 1, -4}, {3, 3}));
    return std::vector<Tensor>{};
  });
  functions.add("other_kind", [](FunctionContext& ctx) {
    ctx.apply_gradients(ShardOptimizer::sgd(0.1f), "emb", {0}, Tensor::zeros({1, 3}));
    return std::vector<Tensor>{};
  });
  functions.add("integers", [](FunctionContext& ctx) {
    ctx.apply_gradients(ShardOptimizer::sgd(0.1f), {"count"}, {Tensor::zeros({2}, DType::i64)});
    return std::vector<Tensor>{};
  });
  ServerOptions o;
  Runtime worker_rt, ps0_rt, ps1_rt, chief_rt;
  Server worker(worker_rt, spec, "worker", 0, functions, o);
  Server ps0(ps0_rt, spec, "ps", 0, {}, o);
  Server ps1(ps1_rt, spec, "ps", 1, {}, o);
  auto resolver = std::make_shared<SimpleClusterResolver>(spec, "chief", 0);
  ParameterServerStrategy strategy(chief_rt, resolver, std::make_shared<FixedShardsPartitioner>(2), o);
  ClusterCoordinator coordinator(strategy);

  const Tensor init = Tensor::from_vector<float>({0.5f, -1.25f, 2, 0.75f, -0.5f, 1.5f, 3, -2, 0.125f}, {3, 3});
  std::vector<Tensor> grads;
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g(9);
    for (int i = 0; i < 9; ++i) g[static_cast<std::size_t>(i)] = 0.1f * static_cast<float>((i * 7 + step * 3) % 11) - 0.4f;
    grads.push_back(Tensor::from_vector<float>(g, {3, 3}));
  }
  for (int which = 0; which < 4; ++which) {
    CAPTURE(which);
    auto v = strategy.create_variable("w" + std::to_string(which), init);
    REQUIRE(v.shards.size() == 2);
    for (const Tensor& g : grads) coordinator.fetch(coordinator.schedule("apply", which, g));
    // The same three steps by nn's optimizer in this process.
    Variable local(init);
    std::shared_ptr<nn::Optimizer> opt;
    if (which == 0) opt = std::make_shared<nn::SGD>(0.1f);
    if (which == 1) opt = std::make_shared<nn::SGD>(0.05f, 0.9f, true);
    if (which == 2) opt = std::make_shared<nn::Adam>(0.01f);
    if (which == 3) opt = std::make_shared<nn::AdamW>(0.01f, 0.05f);
    for (const Tensor& g : grads) opt->apply_gradients({{g, local}});
    CHECK(strategy.read_variable("w" + std::to_string(which)).equals(local.value()));
  }

  std::vector<float> rows(18);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = 0.25f * static_cast<float>(i);
  strategy.create_variable("emb", Tensor::from_vector<float>(rows, {6, 3}));
  coordinator.fetch(coordinator.schedule("rows"));
  const auto after = strategy.read_variable("emb").to_vector<float>();
  for (int r : {0, 2, 3, 5}) {  // rows no id named keep their values
    for (int c = 0; c < 3; ++c) CHECK(after[static_cast<std::size_t>(r * 3 + c)] == rows[static_cast<std::size_t>(r * 3 + c)]);
  }
  const auto one_row = [&](int r, std::vector<float> g) {
    Variable local(Tensor::from_vector<float>({rows[static_cast<std::size_t>(r * 3)], rows[static_cast<std::size_t>(r * 3 + 1)],
                                               rows[static_cast<std::size_t>(r * 3 + 2)]}));
    nn::Adam adam(0.01f);
    adam.apply_gradients({{Tensor::from_vector<float>(g), local}});
    return local.value().to_vector<float>();
  };
  const auto row1 = one_row(1, {0.5f + 0.25f, -1.0f + 1.0f, 2.0f + -4.0f});
  const auto row4 = one_row(4, {3, 3, 3});
  for (int c = 0; c < 3; ++c) {
    CHECK(after[static_cast<std::size_t>(3 + c)] == row1[static_cast<std::size_t>(c)]);
    CHECK(after[static_cast<std::size_t>(12 + c)] == row4[static_cast<std::size_t>(c)]);
  }

  // Another optimizer on a variable with Adam's slots, and an integer variable: refused, named.
  CHECK(contains(message_of([&] { coordinator.fetch(coordinator.schedule("other_kind")); }),
                 "keeps the slots of adam; an update by sgd cannot use them"));
  CHECK(contains(message_of([&] { coordinator.join(); }), "keeps the slots of adam"));  // raised once more, as TensorFlow does
  strategy.create_variable("count", Tensor::zeros({2}, DType::i64));
  const std::string integers = message_of([&] { coordinator.fetch(coordinator.schedule("integers")); });
  CAPTURE(integers);
  CHECK(contains(integers, "optimizers update float32 and float64 variables"));
  CHECK(contains(message_of([&] { coordinator.join(); }), "optimizers update float32 and float64 variables"));
  CHECK(strategy.read_variable("emb").to_vector<float>() == after);  // the refused update changed nothing
  CHECK_THROWS_AS(ShardOptimizer::adam(0.01f, 1.5f), std::invalid_argument);
}

}  // namespace TROUPE_TEST_FILE
