// Keras's mixed precision: dtype policies, Dense under them, dynamic loss scaling, Model::fit.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "../common/temp_dir.hpp"
#include "test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::message_of;
namespace mp = troupe::nn::mixed_precision;

namespace {

// Puts the global policy back to float32 when a test ends, whatever it set.
struct policy_guard {
  ~policy_guard() { mp::set_global_policy("float32"); }
};

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

}  // namespace
TEST_CASE("mixed_precision::Policy: Keras's three policies, the global one, and a clear error for others") {
  policy_guard guard;
  const mp::Policy f32("float32");
  const mp::Policy f16("mixed_float16");
  const mp::Policy bf16("mixed_bfloat16");
  CHECK(f32.compute_dtype() == DType::f32);
  CHECK(f16.compute_dtype() == DType::f16);
  CHECK(bf16.compute_dtype() == DType::bf16);
  for (const mp::Policy& p : {f32, f16, bf16}) CHECK(p.variable_dtype() == DType::f32);
  CHECK(f16.name() == "mixed_float16");
  CHECK(mp::global_policy().name() == "float32");
  const std::string m = message_of([] { mp::Policy("mixed_half"); });
  CHECK(m == "mixed_precision::Policy: unknown policy 'mixed_half' (expected one of \"float32\", \"mixed_float16\", "
             "\"mixed_bfloat16\")");
  CHECK_THROWS_AS(mp::set_global_policy("float16"), std::invalid_argument);
  CHECK(mp::global_policy() == f32);  // a refused name changes nothing

  mp::set_global_policy("mixed_bfloat16");
  CHECK(mp::global_policy() == bf16);
  const nn::Dense layer(4, 3, nn::Activation::relu, 7);
  mp::set_global_policy(f32);
  const nn::Dense plain(3, 2, nn::Activation::none, 8);
  CHECK(layer.dtype_policy() == bf16);
  CHECK(layer.compute_dtype() == DType::bf16);
  CHECK(layer.kernel().dtype() == DType::f32);
  CHECK(layer.bias().dtype() == DType::f32);
  CHECK(plain.compute_dtype() == DType::f32);

  // The layer's output: the float32 computation on bfloat16-rounded operands, rounded once.
  const Tensor x = Tensor::from_vector<float>({0.1f, -0.7f, 1.3f, 2.2f, 0.4f, 0.5f, -0.6f, 0.9f}, {2, 4});
  const Tensor out = layer.forward(x);
  CHECK(out.dtype() == DType::bf16);
  const auto rounded = [](const Tensor& t) { return t.cast(DType::bf16).cast(DType::f32); };
  const Tensor want = nn::dense_forward(rounded(x), rounded(layer.kernel().value()), rounded(layer.bias().value()),
                                        nn::Activation::relu)
                          .cast(DType::bf16);
  CHECK(out.equals(want));
  // A float32 layer after it takes the bfloat16 output in float32.
  CHECK(plain.forward(out).dtype() == DType::f32);
  // Gradients of the variables are float32, the input's gradient bfloat16.
  const nn::DenseGradients d = layer.backward(x, out, Tensor::full({2, 3}, 1.0f));
  CHECK(d.kernel.dtype() == DType::f32);
  CHECK(d.bias.dtype() == DType::f32);
  CHECK(d.input.dtype() == DType::f32);  // the input was float32
  const nn::DenseGradients d16 = layer.backward(x.cast(DType::bf16), out, Tensor::full({2, 3}, 1.0f));
  CHECK(d16.input.dtype() == DType::bf16);
  CHECK(d16.kernel.equals(rounded(d16.kernel)));  // a bfloat16 gradient, held as float32
}

TEST_CASE("dynamic loss scale: halve and skip on a non-finite step, grow after growth_steps finite ones") {
  // Halves, never below 1, and restarts the count.
  auto s = nn::next_loss_scale(32768, 5, false, 3);
  CHECK(s.scale == 16384);
  CHECK(s.good_steps == 0);
  CHECK_FALSE(s.apply);
  CHECK(nn::next_loss_scale(1, 0, false, 3).scale == 1);
  CHECK(nn::next_loss_scale(1.5, 0, false, 3).scale == 1);
  // Counts finite steps, doubles on the growth_steps-th one (which is applied).
  s = nn::next_loss_scale(16384, 0, true, 3);
  CHECK(s.scale == 16384);
  CHECK(s.good_steps == 1);
  CHECK(s.apply);
  s = nn::next_loss_scale(16384, 2, true, 3);
  CHECK(s.scale == 32768);
  CHECK(s.good_steps == 0);
  CHECK(s.apply);
  // float32's largest power of two does not double into infinity.
  CHECK(nn::next_loss_scale(0x1p127, 2, true, 3).scale == 0x1p127);
}

TEST_CASE("LossScaleOptimizer: skips a step with an infinite gradient, halves, recovers and grows") {
  Variable w(Tensor::from_vector<float>({1.0f, 2.0f}), "w");
  auto sgd = std::make_shared<nn::SGD>(0.5f);
  nn::LossScaleOptimizer opt(sgd, true, 8.0, 2);
  CHECK(opt.name() == "sgd");
  CHECK(opt.loss_scale() == 8.0);  // before build: the initial scale
  opt.build({{"w", w}});
  CHECK(opt.loss_scale() == 8.0);
  CHECK(opt.get_scaled_loss(Tensor::scalar<float>(0.25f)).item<float>() == 2.0f);
  CHECK(opt.get_unscaled_gradients({Tensor::from_vector<float>({8.0f, -4.0f})})[0].to_vector<float>() ==
        std::vector<float>{1.0f, -0.5f});

  // Step 1: infinite gradient: skipped, scale halved, iterations still advance (as in Keras).
  opt.apply_gradients({{Tensor::from_vector<float>({kInf, 1.0f}), w}});
  CHECK(w.value().to_vector<float>() == std::vector<float>{1.0f, 2.0f});
  CHECK(opt.loss_scale() == 4.0);
  CHECK(opt.dynamic_counter() == 0);
  CHECK(opt.iterations().value().item<std::int64_t>() == 1);
  // Step 2: NaN: the same.
  opt.apply_gradients({{Tensor::from_vector<float>({1.0f, kNaN}), w}});
  CHECK(w.value().to_vector<float>() == std::vector<float>{1.0f, 2.0f});
  CHECK(opt.loss_scale() == 2.0);
  // Step 3: finite: applied, counted.
  opt.apply_gradients({{Tensor::from_vector<float>({1.0f, 2.0f}), w}});
  CHECK(w.value().to_vector<float>() == std::vector<float>{0.5f, 1.0f});
  CHECK(opt.loss_scale() == 2.0);
  CHECK(opt.dynamic_counter() == 1);
  // Step 4: the second finite step in a row: applied, and the scale doubles.
  opt.apply_gradients({{Tensor::from_vector<float>({1.0f, 2.0f}), w}});
  CHECK(w.value().to_vector<float>() == std::vector<float>{0.0f, 0.0f});
  CHECK(opt.loss_scale() == 4.0);
  CHECK(opt.dynamic_counter() == 0);
  CHECK(opt.iterations().value().item<std::int64_t>() == 4);
  // Its state is among the variables a checkpoint saves.
  const auto vars = opt.variables();
  CHECK(vars.count("sgd/loss_scale/current_loss_scale") == 1);
  CHECK(vars.count("sgd/loss_scale/good_steps") == 1);
  CHECK(vars.count("sgd/iterations") == 1);
  // The learning rate reaches the inner optimizer.
  opt.set_learning_rate(0.25f);
  CHECK(sgd->learning_rate() == 0.25f);
  CHECK(opt.learning_rate() == 0.25f);

  // A fixed scale never changes and never skips.
  Variable u(Tensor::from_vector<float>({1.0f}), "u");
  nn::LossScaleOptimizer fixed(std::make_shared<nn::SGD>(1.0f), false, 128.0);
  fixed.apply_gradients({{Tensor::from_vector<float>({0.5f}), u}});
  CHECK(u.value().to_vector<float>() == std::vector<float>{0.5f});
  CHECK(fixed.loss_scale() == 128.0);
}

TEST_CASE("LossScaleOptimizer: bad arguments are refused with what to fix") {
  CHECK(message_of([] { nn::LossScaleOptimizer(nullptr); }) == "LossScaleOptimizer: the inner optimizer is null");
  auto inner = std::make_shared<nn::LossScaleOptimizer>(std::make_shared<nn::SGD>());
  CHECK(contains(message_of([&] { nn::LossScaleOptimizer{inner}; }), "already a LossScaleOptimizer"));
  CHECK(contains(message_of([] { nn::LossScaleOptimizer(std::make_shared<nn::SGD>(), true, 0.5); }),
                 "initial_scale is 0.5"));
  CHECK(contains(message_of([] { nn::LossScaleOptimizer(std::make_shared<nn::SGD>(), true, 1e300); }),
                 "expected a finite float32 >= 1"));
  CHECK(contains(message_of([] { nn::LossScaleOptimizer(std::make_shared<nn::SGD>(), true, 2.0, 0); }),
                 "dynamic_growth_steps is 0 (expected >= 1)"));
}

TEST_CASE("LossScaleOptimizer under MirroredStrategy: one replica's overflow makes every replica skip") {
  Runtime rt;
  MirroredStrategy strategy(rt, troupe::testing::cpus(2));
  auto scope = strategy.scope();
  Variable w(Tensor::from_vector<float>({1.0f, 1.0f}), "w");
  auto opt = std::make_shared<nn::LossScaleOptimizer>(std::make_shared<nn::SGD>(1.0f), true, 64.0, 2000);
  opt->build({{"w", w}});
  strategy.run([&] {
    // Replica 1 alone overflows; the all-reduced gradient is infinite on both.
    const float g = get_replica_context()->replica_id_in_sync_group() == 1 ? kInf : 0.25f;
    opt->apply_gradients({{Tensor::from_vector<float>({g, 0.25f}), w}});
    return 0;
  });
  for (const Tensor& c : w.components()) CHECK(c.to_vector<float>() == std::vector<float>{1.0f, 1.0f});
  CHECK(opt->loss_scale() == 32.0);
  strategy.run([&] {
    opt->apply_gradients({{Tensor::from_vector<float>({0.25f, 0.125f}), w}});
    return 0;
  });
  for (const Tensor& c : w.components()) CHECK(c.to_vector<float>() == std::vector<float>{0.5f, 0.75f});
  CHECK(opt->loss_scale() == 32.0);
  CHECK(opt->dynamic_counter() == 1);
}

namespace {

// make_blobs' default problem, a two-hidden-layer MLP built under `policy`, fitted for 3 epochs
// on two CPU replicas; returns the model's training accuracy.
struct Fitted {
  double accuracy = 0;
  double first_loss = 0;
  double last_loss = 0;
  std::shared_ptr<nn::Optimizer> optimizer;
};

Fitted fit_blobs(const char* policy, std::shared_ptr<nn::Optimizer> optimizer) {
  policy_guard guard;
  Runtime rt;
  MirroredStrategy strategy(rt, troupe::testing::cpus(2));
  auto scope = strategy.scope();
  nn::BlobOptions blobs;
  blobs.samples = 4096;
  const nn::ClassificationData set = nn::make_blobs(blobs);
  mp::set_global_policy(policy);
  nn::Model model(nn::Sequential({nn::Dense(32, 64, nn::Activation::relu, 1), nn::Dense(64, 64, nn::Activation::relu, 2),
                                  nn::Dense(64, 4, nn::Activation::none, 3)}));
  mp::set_global_policy("float32");
  model.compile(std::move(optimizer), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
  nn::FitOptions options;
  options.verbose = 0;
  const data::Dataset examples = data::Dataset::from_tensor_slices({set.features, set.labels});
  const nn::History h = model.fit(examples.shuffle(4096, 1).batch(64), 3, -1, options);
  Fitted out;
  out.accuracy = model.evaluate(examples.batch(512)).accuracy;
  out.first_loss = h.loss.front();
  out.last_loss = h.loss.back();
  out.optimizer = model.optimizer();
  CHECK(model.predict(set.features.slice(0, 4)).dtype() == DType::f32);
  for (const Variable& v : model.trainable_variables()) CHECK(v.dtype() == DType::f32);
  return out;
}

}  // namespace

TEST_CASE("Model::fit converges on blobs under mixed_bfloat16 and mixed_float16 as under float32") {
  const Fitted f32 = fit_blobs("float32", std::make_shared<nn::Adam>(0.005f));
  const Fitted bf16 = fit_blobs("mixed_bfloat16", std::make_shared<nn::Adam>(0.005f));
  const Fitted f16 = fit_blobs("mixed_float16", std::make_shared<nn::Adam>(0.005f));
  CAPTURE(f32.accuracy);
  CAPTURE(bf16.accuracy);
  CAPTURE(f16.accuracy);
  CHECK(f32.accuracy > 0.9);
  CHECK(bf16.accuracy > 0.9);
  CHECK(f16.accuracy > 0.9);
  CHECK(bf16.last_loss < bf16.first_loss);
  CHECK(f16.last_loss < f16.first_loss);
  // Only float16 needs loss scaling: compile wrapped its optimizer, as Keras does.
  CHECK(dynamic_cast<nn::LossScaleOptimizer*>(bf16.optimizer.get()) == nullptr);
  const auto* lso = dynamic_cast<nn::LossScaleOptimizer*>(f16.optimizer.get());
  REQUIRE(lso != nullptr);
  CHECK(lso->loss_scale() == 32768.0);  // no overflow at 2^15 on this problem, and 192 steps < 2000
  CHECK(lso->dynamic_counter() == 192);
}

TEST_CASE("Model::fit under mixed_float16 recovers from a loss scale that overflows float16") {
  // 2^40 times the gradients is far beyond float16's 65504: the first steps overflow, are
  // skipped and halve the scale until the gradients fit, then training proceeds.
  const Fitted f16 = fit_blobs(
      "mixed_float16", std::make_shared<nn::LossScaleOptimizer>(std::make_shared<nn::Adam>(0.005f), true, 0x1p40, 2000));
  const auto* lso = dynamic_cast<nn::LossScaleOptimizer*>(f16.optimizer.get());
  REQUIRE(lso != nullptr);
  CAPTURE(lso->loss_scale());
  CHECK(lso->loss_scale() < 0x1p40);
  CHECK(lso->loss_scale() >= 1.0);
  // Every halving was a skipped step; the count restarts at each, and the run's last part had none.
  const std::int64_t skipped = static_cast<std::int64_t>(std::log2(0x1p40 / lso->loss_scale()));
  CHECK(skipped >= 10);
  CHECK(lso->dynamic_counter() <= 192 - skipped);
  CHECK(lso->dynamic_counter() >= 96);
  CHECK(lso->iterations().value().item<std::int64_t>() == 192);  // skipped steps count, as in Keras
  CHECK(f16.accuracy > 0.9);
}

TEST_CASE("a checkpoint of a mixed_float16 model saves and restores the loss scale and its count") {
  policy_guard guard;
  troupe::testing::temp_dir dir;
  const auto make = [] {
    mp::set_global_policy("mixed_float16");
    nn::Model model(nn::Sequential({nn::Dense(3, 2, nn::Activation::none, 1)}));
    mp::set_global_policy("float32");
    model.compile(std::make_shared<nn::SGD>(0.1f), nn::Loss::mean_squared_error());
    return model;
  };
  nn::Model model = make();
  auto* lso = dynamic_cast<nn::LossScaleOptimizer*>(model.optimizer().get());
  REQUIRE(lso != nullptr);
  const std::vector<Variable> vars = model.trainable_variables();
  const auto grads = [&](float v) {
    return std::vector<Tensor>{Tensor::full({3, 2}, v), Tensor::full({2}, v)};
  };
  lso->apply_gradients(nn::zip(grads(kInf), vars));  // skipped: 2^14
  lso->apply_gradients(nn::zip(grads(0.5f), vars));   // applied: count 1
  CHECK(lso->loss_scale() == 16384.0);
  CHECK(lso->dynamic_counter() == 1);
  const std::string file = Checkpoint(model.variables()).write(dir.file("model"));

  nn::Model fresh = make();
  const auto* restored = dynamic_cast<const nn::LossScaleOptimizer*>(fresh.optimizer().get());
  REQUIRE(restored != nullptr);
  CHECK(restored->loss_scale() == 32768.0);
  Checkpoint(fresh.variables()).restore(file);
  CHECK(restored->loss_scale() == 16384.0);
  CHECK(restored->dynamic_counter() == 1);
  CHECK(restored->iterations().value().item<std::int64_t>() == 2);
  CHECK(fresh.trainable_variables()[0].value().equals(vars[0].value()));
}

}  // namespace TROUPE_TEST_FILE
