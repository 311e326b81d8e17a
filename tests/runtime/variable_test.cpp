#include <doctest/doctest.h>

#include <atomic>

#include "../common/temp_dir.hpp"
#include "test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::cpus;
using troupe::testing::message_of;

TEST_CASE("seed 10: a variable created in scope is mirrored, one component per device") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  auto scope = s.scope();
  Variable v(Tensor::scalar<float>(1.0f));
  auto local = s.experimental_local_results(v);
  REQUIRE(local.size() == 2);
  CHECK(local[0].item<float>() == 1.0f);
  CHECK(local[1].item<float>() == 1.0f);
  CHECK(local[1].device().to_string() == "CPU:1");
  CHECK(v.devices().size() == 2);
}

TEST_CASE("a variable outside any scope has one component") {
  Variable v(Tensor::from_vector<int>({1, 2}), "plain");
  CHECK(v.components().size() == 1);
  v.assign_add(Tensor::from_vector<int>({1, 1}));
  CHECK(v.value().to_vector<int>() == std::vector<int>{2, 3});
  CHECK(v.name() == "plain");
  CHECK(contains(message_of([&] { v.assign(Tensor::zeros({2})); }),
                 "Variable 'plain': assign with a float32 tensor of shape [2], the variable is int32 [2]"));
}

TEST_CASE("on_write variables: replica-context writes aggregate, every component stays equal") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(4));
  auto scope = s.scope();
  Variable sum(Tensor::scalar<float>(0.0f), "sum", VariableSynchronization::on_write, VariableAggregation::sum);
  Variable mean(Tensor::scalar<float>(0.0f), "mean", VariableSynchronization::on_write, VariableAggregation::mean);
  Variable first(Tensor::scalar<float>(0.0f), "first", VariableSynchronization::on_write,
                 VariableAggregation::only_first_replica);
  Variable none(Tensor::scalar<float>(0.0f), "none");
  s.run([&] {
    const float id = static_cast<float>(get_replica_context()->replica_id_in_sync_group());
    sum.assign(Tensor::scalar<float>(id));             // 0+1+2+3
    mean.assign_add(Tensor::scalar<float>(id + 1));    // mean of 1..4
    first.assign(Tensor::scalar<float>(id + 10));      // replica 0's
    return sum.value().item<float>();
  });
  for (const Tensor& t : s.experimental_local_results(sum)) CHECK(t.item<float>() == 6.0f);
  for (const Tensor& t : s.experimental_local_results(mean)) CHECK(t.item<float>() == 2.5f);
  for (const Tensor& t : s.experimental_local_results(first)) CHECK(t.item<float>() == 10.0f);
  std::string msg = message_of([&] { s.run([&] { none.assign(Tensor::scalar<float>(1.0f)); }); });
  CHECK(contains(msg, "Variable 'none': assign in replica context needs an aggregation"));
  // Cross-replica context writes every component.
  none.assign(Tensor::scalar<float>(7.0f));
  for (const Tensor& t : s.experimental_local_results(none)) CHECK(t.item<float>() == 7.0f);
  sum.assign_sub(Tensor::scalar<float>(1.0f));
  for (const Tensor& t : s.experimental_local_results(sum)) CHECK(t.item<float>() == 5.0f);
}

TEST_CASE("on_read variables keep a value per replica and aggregate when read across replicas") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(3));
  auto scope = s.scope();
  Variable total(Tensor::scalar<float>(0.0f), "total", VariableSynchronization::on_read, VariableAggregation::sum);
  Variable avg(Tensor::scalar<float>(0.0f), "avg", VariableSynchronization::on_read, VariableAggregation::mean);
  Variable first(Tensor::scalar<float>(0.0f), "first", VariableSynchronization::on_read,
                 VariableAggregation::only_first_replica);
  for (int step = 0; step < 2; ++step) {
    s.run([&] {
      const float id = static_cast<float>(get_replica_context()->replica_id_in_sync_group());
      total.assign_add(Tensor::scalar<float>(id));
      avg.assign(Tensor::scalar<float>(id * 3));
      first.assign(Tensor::scalar<float>(id + 5));
      return total.value().item<float>();  // its own component inside run
    });
  }
  CHECK(total.value().item<float>() == 6.0f);  // (0+1+2) twice
  CHECK(avg.value().item<float>() == 3.0f);    // mean of 0, 3, 6
  CHECK(first.value().item<float>() == 5.0f);
  auto parts = s.experimental_local_results(total);
  CHECK(parts[2].item<float>() == 4.0f);
  total.assign(Tensor::scalar<float>(9.0f));  // cross-replica: split so that it sums back
  CHECK(total.value().item<float>() == 9.0f);
  CHECK(s.experimental_local_results(total)[0].item<float>() == 3.0f);
}

TEST_CASE("merge_call runs once in cross-replica context with every replica's value") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(4));
  std::atomic<int> calls{0};
  auto r = s.run([&] {
    auto* ctx = get_replica_context();
    const int id = ctx->replica_id_in_sync_group();
    return ctx->merge_call(
        [&](Strategy& strategy, const PerReplica<int>& values) {
          ++calls;
          CHECK(in_cross_replica_context());
          CHECK(&strategy == &s);
          int sum = 0;
          for (int v : values) sum += v;
          return sum * 10;
        },
        id + 1);
  });
  CHECK(calls == 1);
  CHECK(r.values() == std::vector<int>(4, 100));
  // A failing merge function fails the step and releases the other replicas.
  std::string msg = message_of([&] {
    s.run([&] {
      get_replica_context()->merge_call([](Strategy&, const PerReplica<int>&) -> int { throw std::runtime_error("bad merge"); },
                                        1);
    });
  });
  CHECK(contains(msg, "bad merge"));
  CHECK(s.run([] { return get_replica_context()->all_reduce(ReduceOp::sum, Tensor::scalar<int>(1)).item<int>(); })
            .values() == std::vector<int>(4, 4));
}

TEST_CASE("StrategyExtended update, reduce_to and batch_reduce_to") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  Variable v(Tensor::from_vector<float>({1, 2}));
  s.extended().update(v, [](const Tensor& c) { return c * 3.0f; });
  for (const Tensor& t : s.experimental_local_results(v)) CHECK(t.to_vector<float>() == std::vector<float>{3, 6});
  auto ids = s.experimental_distribute_values_from_function(
      [](const ValueContext& c) { return Tensor::scalar<int>(c.replica_id_in_sync_group + 1); });
  CHECK(s.extended().reduce_to(ReduceOp::sum, ids).item<int>() == 3);
  auto both = s.extended().batch_reduce_to(ReduceOp::mean, {ids, ids});
  CHECK(both.size() == 2);
  CHECK(both[1].item<int>() == 1);  // integer mean of 1 and 2
}

TEST_CASE("mirrored variables stay bit-identical over 100 steps of replica-context updates") {
  Runtime rt;
  for (int replicas : {1, 2, 4}) {
    CAPTURE(replicas);
    MirroredStrategy s(rt, cpus(replicas));
    auto scope = s.scope();
    Variable w(Tensor::full({257}, 0.5, DType::f32), "w", VariableSynchronization::on_write, VariableAggregation::mean);
    for (int step = 0; step < 100; ++step) {
      s.run([&] {
        const int id = get_replica_context()->replica_id_in_sync_group();
        // Different, awkward deltas per replica: the mean is not exact in float.
        Tensor delta = Tensor::full({257}, 0.1 * (id + 1) / 3.0, DType::f32) * w.value();
        w.assign_sub(delta);
      });
    }
    auto parts = s.experimental_local_results(w);
    for (const Tensor& p : parts) CHECK(p.equals(parts[0]));
    // The same recurrence on the host, in float: each replica's delta c_r * w rounded to float,
    // summed in replica order, divided by the replica count (the documented order of a replica
    // all_reduce), then subtracted. Every element starts equal, so one scalar stands for all.
    float expected = 0.5f;
    double real = 0.5;  // the recurrence without rounding: w * (1 - mean c_r) each step
    double mean_c = 0;
    for (int r = 0; r < replicas; ++r) mean_c += static_cast<double>(static_cast<float>(0.1 * (r + 1) / 3.0));
    mean_c /= replicas;
    for (int step = 0; step < 100; ++step) {
      volatile float sum = 0.0f;  // volatile: no fused multiply-add, each operation rounds as the library's
      for (int r = 0; r < replicas; ++r) {
        volatile float delta = static_cast<float>(0.1 * (r + 1) / 3.0) * expected;
        sum = sum + delta;
      }
      volatile float mean = sum / static_cast<float>(replicas);
      expected = expected - mean;
      real *= 1.0 - mean_c;
    }
    for (float v : parts[0].to_vector<float>()) REQUIRE(v == expected);
    // The float result stays within 100 steps' rounding (a few float ulps each) of the real one.
    CHECK(static_cast<double>(expected) == doctest::Approx(real).epsilon(1e-5));
  }
}

TEST_CASE("read_value is the value in each context, and a snapshot that later writes leave alone") {
  Variable plain(Tensor::from_vector<int>({1, 2}), "plain");
  const Tensor before = plain.read_value();
  CHECK(before.to_vector<int>() == std::vector<int>{1, 2});
  plain.assign(Tensor::from_vector<int>({5, 6}));
  plain.assign_add(Tensor::from_vector<int>({10, 20}));
  CHECK(before.to_vector<int>() == std::vector<int>{1, 2});
  CHECK(plain.read_value().to_vector<int>() == std::vector<int>{15, 26});

  Runtime rt;
  MirroredStrategy s(rt, cpus(3));
  auto scope = s.scope();
  Variable mirrored(Tensor::scalar<float>(2.0f), "mirrored");
  Variable per_replica(Tensor::scalar<float>(0.0f), "per_replica", VariableSynchronization::on_read,
                       VariableAggregation::sum);
  auto inside = s.run([&] {
    const int id = get_replica_context()->replica_id_in_sync_group();
    per_replica.assign(Tensor::scalar<float>(static_cast<float>(10 * (id + 1))));
    // Inside run: this replica's own component, on its own device.
    const Tensor mine = per_replica.read_value();
    return mine.device().to_string() + " " + mine.to_string() + " " + mirrored.read_value().device().to_string();
  });
  CHECK(inside.values() == std::vector<std::string>{"CPU:0 10.0 CPU:0", "CPU:1 20.0 CPU:1", "CPU:2 30.0 CPU:2"});
  // Across replicas: the on_read variable's sum, and the mirrored one's single value.
  CHECK(per_replica.read_value().item<float>() == 60.0f);
  CHECK(mirrored.read_value().item<float>() == 2.0f);
}

TEST_CASE("variables are created in a scope, not inside a replica function") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  std::string msg = message_of([&] { s.run([] { Variable v(Tensor::scalar<float>(1.0f)); }); });
  CHECK(contains(msg, "create variables in the strategy's scope"));
}

// Outside every scope (main after training) a strategy's variables read, write and checkpoint as
// in its cross-replica context; TensorFlow 2.21 gives the same values.
TEST_CASE("outside the scope: an on_read ONLY_FIRST_REPLICA counter incremented in 50 steps reads 50.0") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(3));
  std::optional<Variable> counter;
  {
    auto scope = s.scope();
    counter.emplace(Tensor::scalar<float>(0.0f), "counter", VariableSynchronization::on_read,
                    VariableAggregation::only_first_replica);
  }
  for (int step = 0; step < 50; ++step) s.run([&] { counter->assign_add(Tensor::scalar<float>(1.0f)); });
  REQUIRE_FALSE(has_strategy());
  CHECK(counter->value().item<float>() == 50.0f);
  CHECK(counter->read_value().item<float>() == 50.0f);
}

TEST_CASE("outside the scope: an on_read SUM metric over 3 replicas reads the sum, 300.0") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(3));
  std::optional<Variable> metric;
  {
    auto scope = s.scope();
    metric.emplace(Tensor::scalar<float>(0.0f), "metric", VariableSynchronization::on_read, VariableAggregation::sum);
  }
  for (int step = 0; step < 50; ++step) s.run([&] { metric->assign_add(Tensor::scalar<float>(2.0f)); });
  CHECK(metric->value().item<float>() == 300.0f);
  for (const Tensor& c : s.experimental_local_results(*metric)) CHECK(c.item<float>() == 100.0f);
  // assign outside the scope splits the value so that it sums back, as in cross-replica context.
  metric->assign(Tensor::scalar<float>(30.0f));
  CHECK(metric->value().item<float>() == 30.0f);
  for (const Tensor& c : s.experimental_local_results(*metric)) CHECK(c.item<float>() == 10.0f);
}

TEST_CASE("outside the scope: a mirrored variable reads its first component - assign writes every component") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(3));
  std::optional<Variable> w;
  {
    auto scope = s.scope();
    w.emplace(Tensor::from_vector<float>({1.0f, 2.0f}), "w");
  }
  // Training outside the scope: every replica applies the same update to its own component.
  for (int step = 0; step < 4; ++step) {
    s.run([&] { w->assign_local(w->value() + Scalar(0.5)); });
  }
  CHECK(w->value().to_vector<float>() == std::vector<float>{3.0f, 4.0f});
  w->assign(Tensor::from_vector<float>({7.0f, 8.0f}));
  w->assign_add(Tensor::from_vector<float>({1.0f, 1.0f}));
  w->assign_sub(Tensor::from_vector<float>({0.5f, 0.5f}));
  for (const Tensor& c : s.experimental_local_results(*w)) {
    CHECK(c.to_vector<float>() == std::vector<float>{7.5f, 8.5f});
  }
  CHECK(w->value().to_vector<float>() == std::vector<float>{7.5f, 8.5f});
  // The replicas see what main wrote.
  auto seen = s.run([&] { return w->value(); });
  for (const Tensor& t : s.experimental_local_results(seen)) CHECK(t.to_vector<float>() == std::vector<float>{7.5f, 8.5f});
}

TEST_CASE("outside the scope: a checkpoint saves and restores mirrored and on_read variables") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(3));
  std::optional<Variable> w, counter, metric;
  {
    auto scope = s.scope();
    w.emplace(Tensor::from_vector<float>({1.0f, 2.0f}), "w");
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
  troupe::testing::temp_dir dir("outside-scope");
  Checkpoint ckpt({{"w", *w}, {"counter", *counter}, {"metric", *metric}});
  const std::string path = ckpt.save((dir.path / "after-training").string());
  const CheckpointInfo info = inspect_checkpoint(path, true);
  for (const CheckpointEntry& e : info.entries) {
    if (e.name == "counter") CHECK(e.value.item<float>() == 50.0f);
    if (e.name == "metric") CHECK(e.value.item<float>() == 300.0f);
    if (e.name == "w") CHECK(e.value.to_vector<float>() == std::vector<float>{1.0f, 2.0f});
  }
  w->assign(Tensor::zeros({2}));
  counter->assign(Tensor::scalar<float>(0.0f));
  metric->assign(Tensor::scalar<float>(0.0f));
  ckpt.restore(path);
  for (const Tensor& c : s.experimental_local_results(*w)) CHECK(c.to_vector<float>() == std::vector<float>{1.0f, 2.0f});
  CHECK(counter->value().item<float>() == 50.0f);
  CHECK(metric->value().item<float>() == 300.0f);
  for (const Tensor& c : s.experimental_local_results(*metric)) CHECK(c.item<float>() == 100.0f);
}

TEST_CASE("a variable used by a replica of another strategy is still refused, naming it") {
  Runtime rt;
  MirroredStrategy a(rt, cpus(2));
  MirroredStrategy b(rt, cpus(2));
  std::optional<Variable> w;
  {
    auto scope = a.scope();
    w.emplace(Tensor::scalar<float>(1.0f), "w");
  }
  CHECK(contains(message_of([&] { b.run([&] { return w->value(); }); }),
                 "Variable 'w' belongs to another strategy than the replica using it"));
}

}  // namespace TROUPE_TEST_FILE
