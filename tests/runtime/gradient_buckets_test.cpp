#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "distribute/collectives/collectives.hpp"
#include "test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;

using troupe::testing::contains;
using troupe::testing::cpus;
using troupe::testing::message_of;

namespace {

// The bytes of every component of every variable, after each step.
using Bits = std::vector<std::vector<unsigned char>>;

void append_bits(Bits& out, const Tensor& t) {
  std::vector<unsigned char> bytes(t.nbytes());
  if (!bytes.empty()) std::memcpy(bytes.data(), t.raw_data(), bytes.size());
  out.push_back(std::move(bytes));
}

struct Trained {
  std::vector<Bits> steps;   // per step: every variable's replica-0 component
  bool replicas_agree = true;
  double exposed_seconds = 0;
  double peer_wait_seconds = 0;
};

// 40 -> 32 relu -> 16 relu -> 3, SGD with momentum, `replicas` CPU replicas on their own batches,
// gradients in buckets of `bucket_bytes` (0: one all-reduce after the backward pass). Gradient
// bytes in backward order: bias 12, kernel 192 | bias 64, kernel 2048 | bias 128, kernel 5120.
Trained train(int replicas, int bucket_bytes, int steps = 4) {
  RuntimeOptions options;
  options.gradient_bucket_bytes = bucket_bytes;
  Runtime rt(options);
  MirroredStrategy s(rt, cpus(replicas));
  auto scope = s.scope();
  nn::Model model(nn::Sequential({nn::Dense(40, 32, nn::Activation::relu, 1), nn::Dense(32, 16, nn::Activation::relu, 2),
                                  nn::Dense(16, 3, nn::Activation::none, 3)}));
  model.compile(std::make_shared<nn::SGD>(0.1f, 0.9f), nn::Loss::sparse_categorical_crossentropy());
  const std::int64_t batch = 8;
  Trained out;
  for (int step = 0; step < steps; ++step) {
    s.run([&] {
      const int id = get_replica_context()->replica_id_in_sync_group();
      const Tensor x = nn::glorot_uniform(batch, 40, 500 + static_cast<std::uint64_t>(step * 16 + id)) * 3.0f;
      std::vector<std::int64_t> y(batch);
      for (std::int64_t i = 0; i < batch; ++i) y[static_cast<std::size_t>(i)] = (i * 5 + step + id) % 3;
      return model.train_step({x, Tensor::from_vector(y, {batch})}, batch * replicas);
    });
    Bits bits;
    for (const Variable& v : model.trainable_variables()) {
      const auto components = s.experimental_local_results(v);
      Bits first, other;
      append_bits(first, components.front());
      for (const Tensor& c : components) {
        other.clear();
        append_bits(other, c);
        if (other != first) out.replicas_agree = false;
      }
      bits.push_back(first.front());
    }
    out.steps.push_back(std::move(bits));
  }
  out.exposed_seconds = std::chrono::duration<double>(model.optimizer()->exposed_all_reduce_time()).count();
  out.peer_wait_seconds = std::chrono::duration<double>(model.optimizer()->exposed_peer_wait_time()).count();
  return out;
}

}  // namespace

TEST_CASE("bucketed gradient all-reduce: the same bits as one all-reduce after backward, for every bucket size") {
  for (int replicas : {2, 3, 4}) {
    CAPTURE(replicas);
    const Trained reference = train(replicas, 0);
    REQUIRE(reference.replicas_agree);
    CHECK(reference.exposed_seconds == 0);  // the unbucketed path measures no exposed time
    // The training moves the weights: a comparison of unchanged weights could not fail.
    REQUIRE(reference.steps.size() == 4);
    CHECK(reference.steps.front() != reference.steps.back());
    // 100: every tensor alone (each layer split into its bias and its kernel); 2400: the last two
    // layers in one bucket; 1 GiB: every gradient in one bucket.
    for (int bytes : {100, 2400, 1 << 30}) {
      CAPTURE(bytes);
      const Trained bucketed = train(replicas, bytes);
      CHECK(bucketed.replicas_agree);
      CHECK(bucketed.exposed_seconds > 0);  // the bucketed path ran
      CHECK(bucketed.peer_wait_seconds == 0);  // one process: no other worker to wait for
      CHECK(bucketed.steps == reference.steps);
    }
  }
}

TEST_CASE("bucketed gradient all-reduce: a replica that fails before its buckets releases the others") {
  RuntimeOptions options;
  options.gradient_bucket_bytes = 100;
  Runtime rt(options);
  MirroredStrategy s(rt, cpus(3));
  auto scope = s.scope();
  nn::Model model(nn::Sequential({nn::Dense(6, 5, nn::Activation::relu, 1), nn::Dense(5, 2, nn::Activation::none, 2)}));
  model.compile(std::make_shared<nn::SGD>(0.1f), nn::Loss::sparse_categorical_crossentropy());
  const data::Element inputs{Tensor::full({4, 6}, 1.0f), Tensor::from_vector(std::vector<std::int64_t>{0, 1, 0, 1}, {4})};
  const std::string message = message_of([&] {
    s.run([&] {
      if (get_replica_context()->replica_id_in_sync_group() == 1) throw std::runtime_error("replica 1 gave up");
      return model.train_step(inputs, 12);
    });
  });
  CHECK(contains(message, "replica 1 gave up"));
  // The next step runs normally, and every replica's weights agree.
  s.run([&] { return model.train_step(inputs, 12); });
  for (const Variable& v : model.trainable_variables()) {
    const auto components = s.experimental_local_results(v);
    for (const Tensor& c : components) CHECK(c.to_vector<float>() == components.front().to_vector<float>());
  }
}

TEST_CASE("bucketed gradient all-reduce: replicas whose buckets differ fail with both shapes named") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  const std::string message = message_of([&] {
    s.run([&] {
      ReplicaContext* ctx = get_replica_context();
      const std::int64_t n = ctx->replica_id_in_sync_group() == 1 ? 5 : 4;
      auto& collectives = distribute::detail::collectives_of(*ctx);
      std::chrono::steady_clock::time_point all_started{};
      const std::size_t b = collectives.start_all_reduce(ctx->local_replica_index(), ReduceOp::sum, {Tensor::full({n}, 1.0f)});
      collectives.wait_all_reduce(ctx->local_replica_index(), b, all_started);
    });
  });
  CHECK(contains(message, "differs from the other replicas'"));
  CHECK(contains(message, "[5]"));
  CHECK(contains(message, "[4]"));
  // Sums of buckets started in turn: each replica's values summed in replica order.
  auto sums = s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    auto& collectives = distribute::detail::collectives_of(*ctx);
    const int r = ctx->local_replica_index();
    std::chrono::steady_clock::time_point all_started{};
    const std::size_t a = collectives.start_all_reduce(r, ReduceOp::sum, {Tensor::full({70000}, r + 1.0f, DType::f32)});
    const std::size_t b = collectives.start_all_reduce(r, ReduceOp::mean, {Tensor::full({3}, 2.0f * r, DType::f32)});
    const Tensor big = collectives.wait_all_reduce(r, a, all_started).at(0);
    const Tensor small = collectives.wait_all_reduce(r, b, all_started).at(0);
    return std::vector<float>{big.to_vector<float>().front(), big.to_vector<float>().back(), small.to_vector<float>()[1]};
  });
  for (const auto& v : s.experimental_local_results(sums)) CHECK(v == std::vector<float>{3.0f, 3.0f, 1.0f});
}

TEST_CASE("GradientTape::gradient with an all-reduce: the bits of all_reduce(gradient(...)), for every bucket size") {
  // Per replica: the tape's gradients all-reduced in buckets while it differentiates, and the
  // plain gradients all-reduced afterwards, over the bytes of each.
  auto run = [](int bucket_bytes, ReduceOp op) {
    RuntimeOptions options;
    options.gradient_bucket_bytes = bucket_bytes;
    Runtime rt(options);
    MirroredStrategy s(rt, cpus(3));
    auto scope = s.scope();
    nn::Sequential model({nn::Dense(20, 16, nn::Activation::relu, 1), nn::Dense(16, 8, nn::Activation::relu, 2),
                          nn::Dense(8, 3, nn::Activation::none, 3)});
    std::vector<Variable> sources = model.trainable_variables();
    sources.emplace_back(Tensor::zeros({5}), "unused");  // the loss does not depend on it: zeros
    auto out = s.run([&] {
      const int id = get_replica_context()->replica_id_in_sync_group();
      const Tensor x = nn::glorot_uniform(6, 20, 70 + static_cast<std::uint64_t>(id)) * 3.0f;
      const Tensor y = Tensor::from_vector(std::vector<std::int64_t>{0, 1, 2, id % 3, 1, 0}, {6});
      std::vector<Tensor> bucketed, plain;
      {
        GradientTape tape;
        const Tensor loss = nn::compute_average_loss(nn::sparse_softmax_cross_entropy_per_example(model.forward(x), y), 18);
        bucketed = tape.gradient(loss, sources, op);
      }
      {
        GradientTape tape;
        const Tensor loss = nn::compute_average_loss(nn::sparse_softmax_cross_entropy_per_example(model.forward(x), y), 18);
        plain = get_replica_context()->all_reduce(op, tape.gradient(loss, sources));
      }
      Bits a, b;
      for (const Tensor& t : bucketed) append_bits(a, t);
      for (const Tensor& t : plain) append_bits(b, t);
      return std::make_pair(a, b);
    });
    return s.experimental_local_results(out);
  };
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean}) {
    for (int bytes : {0, 100, 700, 1 << 30}) {
      CAPTURE(bytes);
      const auto results = run(bytes, op);
      REQUIRE(results.size() == 3);
      for (const auto& [bucketed, plain] : results) {
        CHECK(bucketed == plain);
        CHECK(bucketed == results.front().first);  // every replica the same sums
      }
      // The sums are not all zeros (a comparison of zeros could not fail); the unused one is.
      const Bits& first = results.front().first;
      CHECK(std::any_of(first.front().begin(), first.front().end(), [](unsigned char c) { return c != 0; }));
      CHECK(std::all_of(first.back().begin(), first.back().end(), [](unsigned char c) { return c == 0; }));
    }
  }
}

TEST_CASE("gradient_bucket_bytes: a bad setting names the field or the variable and what is possible") {
  RuntimeOptions options;
  options.gradient_bucket_bytes = -5;
  const std::string field = message_of([&] { Runtime rt(options); });
  CHECK(contains(field, "gradient_bucket_bytes"));
  CHECK(contains(field, "-5"));
  CHECK(contains(field, "0 for one all-reduce after the backward pass"));
  ::setenv("TROUPE_GRADIENT_BUCKET_BYTES", "lots", 1);
  const std::string variable = message_of([] { RuntimeOptions::from_environment(); });
  ::setenv("TROUPE_GRADIENT_BUCKET_BYTES", "4096", 1);
  const int parsed = RuntimeOptions::from_environment().gradient_bucket_bytes;
  ::unsetenv("TROUPE_GRADIENT_BUCKET_BYTES");
  CHECK(contains(variable, "TROUPE_GRADIENT_BUCKET_BYTES"));
  CHECK(contains(variable, "lots"));
  CHECK(parsed == 4096);
  CHECK(RuntimeOptions::from_environment().gradient_bucket_bytes == RuntimeOptions::automatic_gradient_bucket_bytes);
}

TEST_CASE("bucketed gradient all-reduce: a replica that enters another collective without starting a bucket fails the wait") {
  // Replica 0 waits for a bucket replica 1 never starts, because replica 1 waits in another
  // collective, which waits for replica 0: each would wait for the other forever.
  for (const char* collective : {"all_reduce", "all_gather", "merge"}) {
    CAPTURE(collective);
    Runtime rt;
    MirroredStrategy s(rt, cpus(2));
    const std::string message = message_of([&] {
      s.run([&] {
        ReplicaContext* ctx = get_replica_context();
        auto& collectives = distribute::detail::collectives_of(*ctx);
        const int r = ctx->local_replica_index();
        if (r == 0) {
          std::chrono::steady_clock::time_point all_started{};
          const std::size_t b = collectives.start_all_reduce(r, ReduceOp::sum, {Tensor::full({4}, 1.0f)});
          collectives.wait_all_reduce(r, b, all_started);
        }
        const std::string which = collective;
        if (which == "all_reduce") collectives.all_reduce(r, ReduceOp::sum, Tensor::full({4}, 1.0f));
        if (which == "all_gather") collectives.all_gather(r, Tensor::full({4}, 1.0f), 0);
        if (which == "merge") collectives.merge(r, nullptr, [](const std::vector<const void*>&) {});
      });
    });
    CHECK(contains(message, "replica 1 entered another collective"));
    CHECK(contains(message, "without starting bucket 0"));
    // The next step runs normally.
    auto sums = s.run([&] { return get_replica_context()->all_reduce(ReduceOp::sum, Tensor::full({3}, 2.0f)); });
    for (const Tensor& t : s.experimental_local_results(sums)) CHECK(t.to_vector<float>() == std::vector<float>(3, 4.0f));
  }
}

}  // namespace TROUPE_TEST_FILE
