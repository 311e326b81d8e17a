// The layers of a small decoder-only transformer: Activation (GELU), TokenAndPositionEmbedding,
// MultiHeadAttention with its causal mask, Residual blocks, Dense over sequences and the
// sequence loss, then such a transformer trained by fit under MirroredStrategy.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/temp_dir.hpp"
#include "gradient_check.hpp"
#include "test_util.hpp"
#include "troupe/checkpoint.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/attention.hpp"
#include "troupe/nn/backup_and_restore.hpp"
#include "troupe/nn/batch_normalization.hpp"
#include "troupe/nn/dropout.hpp"
#include "troupe/nn/normalization.hpp"
#include "troupe/nn/position_embedding.hpp"
#include "troupe/nn/residual.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::cpus;
using troupe::testing::message_of;

using troupe::testing::check_gradients;
using troupe::testing::max_abs_diff;
using troupe::testing::numeric_gradient;
using troupe::testing::pseudo_random;
using troupe::testing::weighted_sum;

namespace {

// Gives every variable of `layer` deterministic values away from its initial ones (biases not zero).
void randomise(const nn::Layer& layer, std::uint64_t seed) {
  for (auto& [name, variable] : layer.weights()) {
    Variable(variable).assign(pseudo_random(variable.shape(), seed++, variable.dtype()));
  }
}

nn::FitOptions quiet() {
  nn::FitOptions o;
  o.verbose = 0;
  return o;
}

nlohmann::json config_of(const nn::Layer& layer) { return nlohmann::json::parse(layer.config()); }

}  // namespace

TEST_CASE("Activation: GELU's erf form, relu, tanh, sigmoid and softmax, with finite-difference gradients") {
  const Tensor x = Tensor::from_vector<double>({-1.0, 0.0, 1.0, 2.5}, {2, 2});
  const auto g = nn::ActivationLayer("gelu").forward(x).to_vector<double>();
  // x · Φ(x): Φ(1) = 0.841344746068543, Φ(2.5) = 0.993790334674224.
  CHECK(g[0] == doctest::Approx(-1.0 * (1 - 0.841344746068543)).epsilon(1e-12));
  CHECK(g[1] == 0.0);
  CHECK(g[2] == doctest::Approx(0.841344746068543).epsilon(1e-12));
  CHECK(g[3] == doctest::Approx(2.5 * 0.993790334674224).epsilon(1e-12));
  CHECK(nn::gelu(x).to_vector<double>() == g);
  const auto s = nn::ActivationLayer("softmax").forward(x).to_vector<double>();
  CHECK(s[0] == doctest::Approx(1.0 / (1.0 + std::exp(1.0))));
  CHECK(s[0] + s[1] == doctest::Approx(1.0));
  CHECK(s[2] + s[3] == doctest::Approx(1.0));
  CHECK(nn::ActivationLayer("relu").forward(x).to_vector<double>() == std::vector<double>{0, 0, 1, 2.5});
  CHECK(nn::ActivationLayer("tanh").forward(x).to_vector<double>()[3] == doctest::Approx(std::tanh(2.5)));
  CHECK(nn::ActivationLayer("linear").forward(x).to_vector<double>() == x.to_vector<double>());
  // float32 too.
  CHECK(nn::ActivationLayer("gelu").forward(x.cast(DType::f32)).dtype() == DType::f32);
  const Tensor y = pseudo_random({2, 3, 5}, 4);
  for (const char* kind : {"gelu", "tanh", "sigmoid", "softmax", "linear"}) {
    CAPTURE(kind);
    check_gradients(nn::ActivationLayer(kind), y, {});
  }
  // relu away from its kink.
  check_gradients(nn::ActivationLayer("relu"), y + 0.01, {});
  CHECK(config_of(nn::ActivationLayer("gelu", "act")) ==
        nlohmann::json::parse(R"({"class_name": "Activation", "config": {"name": "act", "activation": "gelu"}})"));
  CHECK(message_of([] { nn::ActivationLayer("swish"); }) ==
        "Activation: activation \"swish\" (expected \"linear\", \"relu\", \"gelu\", \"tanh\", \"sigmoid\" or \"softmax\")");
  CHECK(message_of([&] { nn::ActivationLayer("gelu").forward(Tensor::zeros({2}, DType::i32)); }) ==
        "Activation: input is int32 (expected float32 or float64)");
}

TEST_CASE("TokenAndPositionEmbedding adds each position's vector to its token's, with gradients for both tables") {
  nn::TokenAndPositionEmbedding layer(5, 4, 3, 7, "", DType::f64);
  REQUIRE(layer.weights().size() == 2);
  CHECK(layer.weights()[0].first == "token_embedding/embeddings");
  CHECK(layer.weights()[1].first == "position_embedding/embeddings");
  CHECK(layer.token_embeddings().shape() == Shape{5, 3});
  CHECK(layer.position_embeddings().shape() == Shape{4, 3});
  const Tensor ids = Tensor::from_vector<std::int64_t>({4, 0, 4, 1, 2, 3}, {2, 3});
  const Tensor out = layer.forward(ids);
  REQUIRE(out.shape() == Shape{2, 3, 3});
  const auto o = out.to_vector<double>();
  const auto tok = layer.token_embeddings().value().to_vector<double>();
  const auto pos = layer.position_embeddings().value().to_vector<double>();
  // [1, 2] is token 3 at position 2.
  for (int k = 0; k < 3; ++k) CHECK(o[(1 * 3 + 2) * 3 + k] == tok[3 * 3 + k] + pos[2 * 3 + k]);
  check_gradients(layer, ids, {}, false);
  // The position table's gradient sums over the batch; rows past the sequence get none.
  const auto g = layer.backward(ids, out, Tensor::full(out.shape(), 1.0, DType::f64), {}).variables;
  CHECK(g[1].to_vector<double>() == std::vector<double>{2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0});
  CHECK(g[0].to_vector<double>()[4 * 3] == 2.0);  // token 4, twice
  CHECK(layer.output_shape({-1, 4}) == Shape{-1, 4, 3});
  CHECK(message_of([&] { layer.forward(Tensor::zeros({1, 5}, DType::i32)); }) ==
        "TokenAndPositionEmbedding: ids of shape [1, 5] (expected [batch, sequence] with sequence 1..4, the "
        "sequence_length)");
  CHECK(contains(message_of([&] { layer.forward(Tensor::from_vector<std::int32_t>({0, 5}, {1, 2})); }),
                 "id 5 at position 1"));
  CHECK(message_of([] { nn::TokenAndPositionEmbedding(5, 0, 3); }) ==
        "TokenAndPositionEmbedding: sequence_length is 0 (expected a positive number)");
  CHECK(config_of(layer)["class_name"] == "TokenAndPositionEmbedding");
  CHECK(config_of(layer)["config"]["sequence_length"] == 4);
  CHECK(config_of(layer)["config"]["vocabulary_size"] == 5);
  CHECK(config_of(layer)["config"]["embedding_dim"] == 3);
}

// The attention of `mha` computed naively from its variables, element by element; with `mask`
// (over [batch, heads, length, length]) each probability is multiplied by its entry.
std::vector<double> reference_attention(const nn::MultiHeadAttention& mha, const Tensor& x,
                                        const std::vector<double>* mask = nullptr) {
  const auto w = mha.weights();
  std::vector<std::vector<double>> v;
  for (const auto& [name, variable] : w) v.push_back(variable.value().to_vector<double>());
  const auto xs = x.to_vector<double>();
  const std::int64_t B = x.shape()[0], L = x.shape()[1], D = x.shape()[2];
  const int H = mha.num_heads(), K = mha.key_dim(), V = mha.value_dim();
  std::vector<double> out(static_cast<std::size_t>(B * L * D));
  const auto proj = [&](int which, std::int64_t b, std::int64_t t, int h, int k, int width) {
    double s = v[static_cast<std::size_t>(which + 1)][static_cast<std::size_t>(h * width + k)];
    for (std::int64_t d = 0; d < D; ++d) {
      s += xs[static_cast<std::size_t>((b * L + t) * D + d)] *
           v[static_cast<std::size_t>(which)][static_cast<std::size_t>((d * H + h) * width + k)];
    }
    return s;
  };
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t i = 0; i < L; ++i) {
      std::vector<double> concat(static_cast<std::size_t>(H * V), 0.0);
      for (int h = 0; h < H; ++h) {
        std::vector<double> score;
        const std::int64_t seen = mha.use_causal_mask() ? i + 1 : L;
        for (std::int64_t j = 0; j < seen; ++j) {
          double s = 0;
          for (int k = 0; k < K; ++k) s += proj(0, b, i, h, k, K) * proj(2, b, j, h, k, K);
          score.push_back(s / std::sqrt(static_cast<double>(K)));
        }
        const double max = *std::max_element(score.begin(), score.end());
        double sum = 0;
        for (double& s : score) sum += (s = std::exp(s - max));
        for (std::int64_t j = 0; j < seen; ++j) {
          for (int k = 0; k < V; ++k) {
            const double kept = mask ? (*mask)[static_cast<std::size_t>(((b * H + h) * L + i) * L + j)] : 1.0;
            concat[static_cast<std::size_t>(h * V + k)] +=
                score[static_cast<std::size_t>(j)] / sum * kept * proj(4, b, j, h, k, V);
          }
        }
      }
      for (std::int64_t d = 0; d < D; ++d) {
        double s = v[7][static_cast<std::size_t>(d)];
        for (int c = 0; c < H * V; ++c) s += concat[static_cast<std::size_t>(c)] * v[6][static_cast<std::size_t>(c * D + d)];
        out[static_cast<std::size_t>((b * L + i) * D + d)] = s;
      }
    }
  }
  return out;
}

TEST_CASE("MultiHeadAttention: Keras's variables, scaled dot-product attention, and finite-difference gradients") {
  for (const bool causal : {false, true}) {
    CAPTURE(causal);
    nn::MultiHeadAttention mha(2, 3, causal, 5, "", 4, DType::f64);
    CHECK_FALSE(mha.built());
    const Tensor x = pseudo_random({2, 4, 6}, 11);
    mha.build(x.shape());
    const auto w = mha.weights();
    REQUIRE(w.size() == 8);
    const std::vector<std::pair<std::string, Shape>> expected{
        {"query/kernel", {6, 2, 3}}, {"query/bias", {2, 3}},  {"key/kernel", {6, 2, 3}},
        {"key/bias", {2, 3}},        {"value/kernel", {6, 2, 4}}, {"value/bias", {2, 4}},
        {"attention_output/kernel", {2, 4, 6}}, {"attention_output/bias", {6}}};
    for (std::size_t i = 0; i < w.size(); ++i) {
      CHECK(w[i].first == expected[i].first);
      CHECK(w[i].second.shape() == expected[i].second);
    }
    randomise(mha, 20);
    const Tensor out = mha.forward(x);
    REQUIRE(out.shape() == x.shape());
    const auto ref = reference_attention(mha, x);
    CHECK(max_abs_diff(out, Tensor::from_vector(ref, x.shape())) < 1e-12);
    check_gradients(mha, x, {});
  }
  // float32 agrees with float64 on the same values.
  nn::MultiHeadAttention m32(2, 4, true, 3);
  nn::MultiHeadAttention m64(2, 4, true, 3, "", -1, DType::f64);
  const Tensor x = pseudo_random({3, 5, 8}, 2);
  m32.build(x.shape());
  m64.build(x.shape());
  for (std::size_t i = 0; i < 8; ++i) CHECK(max_abs_diff(m32.weights()[i].second.value(), m64.weights()[i].second.value()) < 1e-7);
  CHECK(max_abs_diff(m32.forward(x.cast(DType::f32)), m64.forward(x)) < 1e-5);
  CHECK(m32.count_params() == 3 * (8 * 8 + 8) + 8 * 8 + 8);
  CHECK(message_of([&] { m32.forward(Tensor::zeros({3, 5, 7})); }) ==
        "MultiHeadAttention: input of shape [3, 5, 7] (expected [batch, sequence, 8])");
  CHECK(message_of([&] { m32.forward(Tensor::zeros({3, 8})); }) ==
        "MultiHeadAttention: input of shape [3, 8] (expected [batch, sequence, 8])");
  CHECK(message_of([] { nn::MultiHeadAttention(0, 4); }) ==
        "MultiHeadAttention: num_heads is 0 (expected a positive number)");
  const auto c = config_of(m32);
  CHECK(c["class_name"] == "MultiHeadAttention");
  CHECK(c["config"]["num_heads"] == 2);
  CHECK(c["config"]["key_dim"] == 4);
  CHECK(c["config"]["value_dim"] == 4);
  CHECK(c["config"]["use_causal_mask"] == true);
}

TEST_CASE("the causal mask: the output at position t does not change when inputs after t do") {
  const Tensor x = pseudo_random({2, 6, 4}, 8);
  std::vector<double> changed = x.to_vector<double>();
  // Change positions 3..5 of both sequences.
  for (std::size_t b = 0; b < 2; ++b) {
    for (std::size_t i = 3 * 4; i < 6 * 4; ++i) changed[b * 24 + i] += 0.5 + 0.1 * static_cast<double>(i);
  }
  const Tensor x2 = Tensor::from_vector(changed, x.shape());
  for (const bool causal : {true, false}) {
    CAPTURE(causal);
    nn::MultiHeadAttention mha(2, 2, causal, 1, "", -1, DType::f64);
    mha.build(x.shape());
    randomise(mha, 3);
    const auto a = mha.forward(x).to_vector<double>();
    const auto b = mha.forward(x2).to_vector<double>();
    double before = 0, after = 0;  // the largest change at positions 0..2 and 3..5
    for (std::size_t s = 0; s < 2; ++s) {
      for (std::size_t i = 0; i < 24; ++i) {
        const double d = std::abs(a[s * 24 + i] - b[s * 24 + i]);
        (i < 12 ? before : after) = std::max(i < 12 ? before : after, d);
      }
    }
    CHECK(after > 1e-3);
    if (causal) {
      CHECK(before == 0.0);
    } else {
      CHECK(before > 1e-3);
    }
  }
  // The gradient of position 0's output reaches only position 0's input.
  nn::MultiHeadAttention mha(1, 3, true, 2, "", -1, DType::f64);
  const Tensor out = mha.forward(x);
  std::vector<double> g(static_cast<std::size_t>(out.num_elements()), 0.0);
  for (std::size_t i = 0; i < 4; ++i) g[i] = 1.0;
  const auto dx = mha.backward(x, out, Tensor::from_vector(g, out.shape()), {}).input.to_vector<double>();
  for (std::size_t i = 4; i < dx.size(); ++i) CHECK(dx[i] == 0.0);
  CHECK(std::abs(dx[0]) + std::abs(dx[1]) > 0);
}

TEST_CASE("Dense maps the last axis of [batch, ..., input_dim] as rows, and the sequence loss averages positions") {
  nn::Dense dense(6, 3, nn::Activation::relu, 4);
  const Tensor x = pseudo_random({2, 4, 6}, 3, DType::f32);
  const Tensor y = dense.forward(x);
  REQUIRE(y.shape() == Shape{2, 4, 3});
  const Tensor rows = dense.forward(x.reshape({8, 6}));
  CHECK(y.reshape({8, 3}).to_vector<float>() == rows.to_vector<float>());
  const Tensor g = pseudo_random({2, 4, 3}, 5, DType::f32);
  const nn::LayerGradients d3 = dense.backward(x, y, g, {}, true);
  const nn::DenseGradients d2 = dense.backward(x.reshape({8, 6}), rows, g.reshape({8, 3}));
  CHECK(d3.input.shape() == x.shape());
  CHECK(d3.input.reshape({8, 6}).to_vector<float>() == d2.input.to_vector<float>());
  CHECK(d3.variables[0].to_vector<float>() == d2.kernel.to_vector<float>());
  CHECK(dense.output_shape({-1, -1, 6}) == Shape{-1, -1, 3});
  CHECK(message_of([&] { dense.forward(Tensor::zeros({2, 4, 5})); }) == "Dense: input of shape [2, 4, 5] (expected [batch, ..., 6])");
  // Logits [2, 3, 4] with labels [2, 3]: the mean over the 6 positions, as rows [6, 4] give it.
  const Tensor logits = pseudo_random({2, 3, 4}, 6);
  const Tensor labels = Tensor::from_vector<std::int32_t>({0, 3, 1, 2, 2, 0}, {2, 3});
  const nn::LossAndGradient seq = nn::sparse_softmax_cross_entropy(logits, labels, 2);
  const nn::LossAndGradient flat = nn::sparse_softmax_cross_entropy(logits.reshape({6, 4}), labels.reshape({6}));
  CHECK(seq.loss.to_vector<double>()[0] == doctest::Approx(flat.loss.to_vector<double>()[0]).epsilon(1e-14));
  CHECK(seq.gradient.shape() == logits.shape());
  CHECK(max_abs_diff(seq.gradient.reshape({6, 4}), flat.gradient) < 1e-15);
  CHECK(max_abs_diff(nn::sparse_softmax_cross_entropy(logits, labels).gradient, seq.gradient) < 1e-15);
  CHECK(nn::accuracy(logits, labels) == doctest::Approx(nn::accuracy(logits.reshape({6, 4}), labels.reshape({6}))));
  CHECK(message_of([&] { nn::sparse_softmax_cross_entropy(logits, labels.reshape({6}), 2); }) ==
        "sparse_softmax_cross_entropy: labels are int32 [6] for logits [2, 3, 4] (expected int32 or int64 [2, 3]: a "
        "label for each position)");
}

TEST_CASE("Residual: x + f(x) with its layers' gradients, nested checkpoint names, and GradientTape's agreement") {
  nn::Residual block({nn::LayerNormalization(1e-3, "", DType::f64), nn::MultiHeadAttention(2, 3, true, 1, "", -1, DType::f64),
                      nn::ActivationLayer("gelu")});
  CHECK(block.layer_names() == std::vector<std::string>{"layer_normalization_0", "multi_head_attention_0", "activation_0"});
  const Tensor x = pseudo_random({2, 4, 6}, 12);
  const Tensor out = block.forward(x);
  REQUIRE(block.built());
  // x + gelu(mha(norm(x))), by the layers one at a time.
  const Tensor layer_by_layer =
      x + block.layers()[2]->forward(block.layers()[1]->forward(block.layers()[0]->forward(x)));
  CHECK(max_abs_diff(out, layer_by_layer) == 0.0);
  randomise(block, 40);
  check_gradients(block, x, {});
  const auto w = block.weights();
  REQUIRE(w.size() == 10);
  CHECK(w[0].first == "layer_normalization_0/gamma");
  CHECK(w[2].first == "multi_head_attention_0/query/kernel");
  CHECK(message_of([] { nn::Residual({nn::Dense(4, 3)}, "b").output_shape({-1, 4}); }) ==
        "Residual 'b': its layers map [-1, 4] to [-1, 3] (expected the input's shape: the block adds its input to its "
        "layers' output)");
  CHECK(contains(message_of([] { nn::Residual({nn::Dense(4, 4), nn::Dense(5, 4)}).output_shape({-1, 4}); }),
                 "Residual: layer 1: "));
  CHECK(message_of([] { nn::Residual({nn::Dense(4, 4, nn::Activation::none, 0, "d"), nn::Dense(4, 4, nn::Activation::none, 0, "d")}); }) ==
        "Residual: two layers named 'd' (names must be unique in a block: they name the variables in checkpoints)");

  // In a Sequential: names nest, and a GradientTape over the model gives backward's gradients.
  nn::Sequential model;
  model.add(nn::TokenAndPositionEmbedding(7, 5, 6, 1, "", DType::f64));
  model.add(nn::Residual({nn::LayerNormalization(1e-3, "", DType::f64),
                          nn::MultiHeadAttention(2, 3, true, 2, "attention", -1, DType::f64)},
                         "block_0"));
  model.add(nn::Residual({nn::LayerNormalization(1e-3, "", DType::f64), nn::ActivationLayer("gelu")}));
  CHECK(model.layer_names() == std::vector<std::string>{"token_and_position_embedding_0", "block_0", "residual_1"});
  const auto vars = model.variables();
  CHECK(vars.count("token_and_position_embedding_0/position_embedding/embeddings") == 1);
  CHECK(vars.count("block_0/attention/query/kernel") == 1);
  CHECK(vars.count("block_0/layer_normalization_0/beta") == 1);
  CHECK(vars.count("residual_1/layer_normalization_0/gamma") == 1);
  CHECK(vars.size() == 2 + 2 + 8 + 2);
  const auto config = nlohmann::json::parse(model.config());
  CHECK(config["config"]["layers"][1]["class_name"] == "Residual");
  CHECK(config["config"]["layers"][1]["config"]["name"] == "block_0");
  CHECK(config["config"]["layers"][1]["config"]["layers"][1]["class_name"] == "MultiHeadAttention");
  CHECK(config["config"]["layers"][1]["config"]["layers"][1]["config"]["name"] == "attention");

  const Tensor ids = Tensor::from_vector<std::int32_t>({1, 2, 3, 4, 5, 6, 0, 1, 2, 3}, {2, 5});
  const Tensor target = pseudo_random({2, 5, 6}, 13);
  std::vector<Tensor> by_tape;
  {
    GradientTape tape;
    const Tensor y = model.forward(ids);
    REQUIRE(y.shape() == Shape{2, 5, 6});
    by_tape = tape.gradient(nn::compute_average_loss(nn::mean_squared_error_per_example(y.reshape({2, 30}), target.reshape({2, 30})), 2),
                            model.trainable_variables());
  }
  std::vector<Tensor> activations;
  nn::CallContext inference;
  const Tensor y = model.forward(ids, activations, inference);
  const nn::LossAndGradient lg = nn::mean_squared_error(y.reshape({2, 30}), target.reshape({2, 30}), 2);
  const std::vector<Tensor> by_hand = model.backward(activations, lg.gradient.reshape(y.shape()), nullptr, inference);
  REQUIRE(by_tape.size() == 14);
  REQUIRE(by_hand.size() == 14);
  for (std::size_t i = 0; i < by_tape.size(); ++i) {
    CAPTURE(i);
    CHECK(max_abs_diff(by_tape[i], by_hand[i]) < 1e-12);
    CHECK(max_abs_diff(by_tape[i], Tensor::zeros(by_tape[i].shape(), DType::f64)) > 0);
  }
}

TEST_CASE("a tiny character transformer trained by fit on 2 replicas predicts a repeated text far below unigram entropy") {
  const std::string text = [] {
    std::string t;
    for (int i = 0; i < 12; ++i) t += "the quick brown fox jumps over the lazy dog. ";
    return t;
  }();
  std::string vocab = text;
  std::sort(vocab.begin(), vocab.end());
  vocab.erase(std::unique(vocab.begin(), vocab.end()), vocab.end());
  const int v = static_cast<int>(vocab.size());
  // The unigram model's loss: the entropy of the characters' frequencies, in nats.
  double unigram = 0;
  for (char c : vocab) {
    const double p = static_cast<double>(std::count(text.begin(), text.end(), c)) / static_cast<double>(text.size());
    unigram -= p * std::log(p);
  }
  const std::int64_t length = 16;
  const std::int64_t windows = static_cast<std::int64_t>(text.size()) - length - 1;
  std::vector<std::int32_t> xs, ys;
  for (std::int64_t w = 0; w < windows; ++w) {
    for (std::int64_t t = 0; t < length; ++t) {
      xs.push_back(static_cast<std::int32_t>(vocab.find(text[static_cast<std::size_t>(w + t)])));
      ys.push_back(static_cast<std::int32_t>(vocab.find(text[static_cast<std::size_t>(w + t + 1)])));
    }
  }
  const Tensor x = Tensor::from_vector(xs, {windows, length});
  const Tensor y = Tensor::from_vector(ys, {windows, length});

  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  const int d = 32;
  const auto transformer = [&](std::uint64_t seed) {
    nn::Sequential layers;
    layers.add(nn::TokenAndPositionEmbedding(v, static_cast<int>(length), d, seed));
    layers.add(nn::Residual({nn::LayerNormalization(), nn::MultiHeadAttention(2, 16, true, seed + 1)}, "block_0"));
    layers.add(nn::Residual({nn::LayerNormalization(), nn::Dense(d, 64, nn::Activation::none, seed + 2),
                             nn::ActivationLayer("gelu"), nn::Dense(64, d, nn::Activation::none, seed + 3)},
                            "block_1"));
    layers.add(nn::LayerNormalization());
    layers.add(nn::Dense(d, v, nn::Activation::none, seed + 4));
    return layers;
  };
  nn::Sequential layers = transformer(1);
  CHECK(layers.output_shapes().back() == Shape{-1, -1, v});
  nn::Model model(layers);
  model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
  const auto before = model.evaluate(x, y);
  CHECK(before.loss > 0.9 * std::log(static_cast<double>(v)));
  const nn::History h = model.fit(data::Dataset::from_tensor_slices({x, y}).shuffle(windows, 1).repeat().batch(32), 3, 100, quiet());
  const auto after = model.evaluate(x, y);
  CAPTURE(unigram);
  CAPTURE(before.loss);
  CAPTURE(h.loss.back());
  CAPTURE(after.loss);
  CAPTURE(after.accuracy);
  CHECK(h.steps == 300);
  CHECK(after.loss < 0.15 * unigram);
  CHECK(after.accuracy > 0.85);
  // The replicas' copies of the attention's variables agree.
  const Variable& kernel = model.variables().at("block_0/multi_head_attention_0/query/kernel");
  REQUIRE(kernel.components().size() == 2);
  CHECK(kernel.components()[0].to_vector<float>() == kernel.components()[1].to_vector<float>());
  // A checkpoint by the nested names restores into a model made with other seeds: the same outputs.
  troupe::testing::temp_dir dir("transformer");
  const std::string file = Checkpoint(model.variables()).save(dir.file("model"));
  nn::Sequential other = transformer(100);
  other.build({-1, length});
  const Tensor probe = Tensor::from_vector(std::vector<std::int32_t>(xs.begin(), xs.begin() + 4 * length), {4, length});
  CHECK(other.forward(probe).to_vector<float>() != layers.forward(probe).to_vector<float>());
  Checkpoint(other.variables()).restore(file);
  CHECK(other.forward(probe).to_vector<float>() == layers.forward(probe).to_vector<float>());
}

TEST_CASE("a Residual transformer trained by a custom loop: GradientTape in strategy.run on 2 replicas, mean all-reduce") {
  std::string text;
  for (int i = 0; i < 8; ++i) text += "pack my box with five dozen liquor jugs. ";
  std::string vocab = text;
  std::sort(vocab.begin(), vocab.end());
  vocab.erase(std::unique(vocab.begin(), vocab.end()), vocab.end());
  const int v = static_cast<int>(vocab.size());
  const std::int64_t length = 12;
  const std::int64_t windows = static_cast<std::int64_t>(text.size()) - length - 1;
  std::vector<std::int32_t> xs, ys;
  for (std::int64_t w = 0; w < windows; ++w) {
    for (std::int64_t t = 0; t < length; ++t) {
      xs.push_back(static_cast<std::int32_t>(vocab.find(text[static_cast<std::size_t>(w + t)])));
      ys.push_back(static_cast<std::int32_t>(vocab.find(text[static_cast<std::size_t>(w + t + 1)])));
    }
  }
  const Tensor x = Tensor::from_vector(xs, {windows, length});
  const Tensor y = Tensor::from_vector(ys, {windows, length});

  Runtime rt;
  MirroredStrategy strategy(rt, cpus(2));
  auto scope = strategy.scope();
  nn::Sequential model;
  model.add(nn::TokenAndPositionEmbedding(v, static_cast<int>(length), 16, 1));
  model.add(nn::Residual({nn::LayerNormalization(), nn::MultiHeadAttention(2, 8, true, 2)}));
  model.add(nn::Residual({nn::LayerNormalization(), nn::Dense(16, 32, nn::Activation::none, 3), nn::ActivationLayer("gelu"),
                          nn::Dense(32, 16, nn::Activation::none, 4)}));
  model.add(nn::Dense(16, v, nn::Activation::none, 5));
  nn::Adam optimizer(0.02f);
  const std::int64_t global_batch = 16;
  auto batches = strategy.distribute_datasets_from_function([&](const InputContext& ctx) {
    return data::Dataset::from_tensor_slices({x, y}).shuffle(windows, 3).repeat().batch(
        ctx.get_per_replica_batch_size(global_batch), true);
  });
  DistributedIterator it = batches.make_iterator();
  const auto step_fn = [&](const data::Element& e) {
    GradientTape tape;
    const Tensor logits = model.forward(e[0]);  // [batch, length, v]
    const std::int64_t rows = e[0].num_elements();
    const Tensor per_position = nn::sparse_softmax_cross_entropy_per_example(logits.reshape({rows, v}), e[1].reshape({rows}));
    const Tensor loss = nn::compute_average_loss(per_position, rows);
    std::vector<Tensor> grads = tape.gradient(loss, model.trainable_variables());
    grads = get_replica_context()->all_reduce(ReduceOp::mean, grads);
    optimizer.apply_gradients(nn::zip(grads, model.trainable_variables()), std::nullopt);
    return loss;
  };
  std::vector<float> losses;
  for (int step = 0; step < 150; ++step) {
    losses.push_back(strategy.reduce(ReduceOp::mean, strategy.run(step_fn, it.get_next()), std::nullopt).item<float>());
  }
  CAPTURE(losses.front());
  CAPTURE(losses.back());
  CHECK(losses.front() > 0.8f * std::log(static_cast<float>(v)));
  CHECK(losses.back() < 0.25f * losses.front());
  for (const Variable& var : model.trainable_variables()) {
    const std::vector<Tensor> parts = strategy.experimental_local_results(var);
    REQUIRE(parts.size() == 2);
    CHECK(parts[1].equals(parts[0]));
  }
}

TEST_CASE("Residual with a BatchNormalization: its moving statistics are named, saved and updated once per training call") {
  nn::Residual block({nn::Dense(3, 3, nn::Activation::none, 7), nn::BatchNormalization(0.9, 1e-3, true, true)},
                     "block");
  nn::Sequential model;
  model.add(block);
  const Tensor x = pseudo_random({8, 3}, 5, DType::f32);
  std::vector<Tensor> activations;
  nn::CallContext training;
  training.training = true;
  const Tensor y = model.forward(x, activations, training);
  const auto named = model.named_non_trainable_variables();
  REQUIRE(named.size() == 2);
  CHECK(named[0].first == "block/batch_normalization_0/moving_mean");
  CHECK(named[1].first == "block/batch_normalization_0/moving_variance");
  const Tensor after_forward = named[0].second.value();
  const Tensor variance_after_forward = named[1].second.value();
  // The backward pass recomputes the block's activations without updating the statistics again.
  model.backward(activations, Tensor::full(y.shape(), 1.0, DType::f32), [](std::size_t, const Tensor&) {}, training);
  CHECK(named[0].second.value().equals(after_forward));
  CHECK(named[1].second.value().equals(variance_after_forward));
  // One update from zeros: 0.1 x the batch mean of the Dense's output.
  const Tensor h = block.layers()[0]->forward(x);
  const auto hv = h.to_vector<float>();
  for (int k = 0; k < 3; ++k) {
    double mean = 0;
    for (int r = 0; r < 8; ++r) mean += hv[static_cast<std::size_t>(r * 3 + k)];
    mean /= 8;
    CHECK(after_forward.to_vector<float>()[static_cast<std::size_t>(k)] == doctest::Approx(0.1 * mean).epsilon(1e-5));
  }
}

TEST_CASE("MultiHeadAttention dropout: none at inference, at training Dropout's mask from (seed, step, replica, layer) on the probabilities, finite-difference gradients with the mask fixed") {
  const Tensor x = pseudo_random({2, 4, 6}, 11);
  for (const bool causal : {false, true}) {
    CAPTURE(causal);
    nn::MultiHeadAttention mha(2, 3, causal, 5, "", 4, DType::f64, 0.3);
    nn::MultiHeadAttention plain(2, 3, causal, 5, "", 4, DType::f64);
    CHECK(mha.uses_random_stream());
    CHECK_FALSE(plain.uses_random_stream());
    mha.build(x.shape());
    plain.build(x.shape());
    randomise(mha, 20);
    randomise(plain, 20);
    // Inference: exactly the attention without dropout.
    CHECK(mha.forward(x).to_vector<double>() == plain.forward(x).to_vector<double>());
    nn::CallContext ctx;
    ctx.training = true;
    ctx.step = 7;
    ctx.replica = 1;
    ctx.layer = 2;
    // Training: the probabilities times Dropout(0.3, seed + 4)'s mask of this context.
    const std::vector<double> mask = nn::Dropout(0.3, 5 + 4).mask(2 * 2 * 4 * 4, ctx).to_vector<double>();
    const auto dropped = std::count(mask.begin(), mask.end(), 0.0);
    CHECK(dropped > 0);
    CHECK(dropped < static_cast<long>(mask.size()));
    const Tensor out = mha.forward(x, ctx);
    CHECK(max_abs_diff(out, Tensor::from_vector(reference_attention(mha, x, &mask), x.shape())) < 1e-12);
    CHECK(max_abs_diff(out, plain.forward(x)) > 1e-3);
    // The same context draws the same mask; another step, replica or layer another.
    CHECK(mha.forward(x, ctx).to_vector<double>() == out.to_vector<double>());
    for (auto other : {&nn::CallContext::step, &nn::CallContext::replica, &nn::CallContext::layer}) {
      nn::CallContext changed = ctx;
      changed.*other += 1;
      CHECK(mha.forward(x, changed).to_vector<double>() != out.to_vector<double>());
    }
    check_gradients(mha, x, ctx);
  }
  CHECK(config_of(nn::MultiHeadAttention(2, 3, true, 1, "", -1, DType::f32, 0.25))["config"]["dropout"] == 0.25);
  CHECK(message_of([] { nn::MultiHeadAttention(2, 3, true, 1, "", -1, DType::f32, 1.0); }) ==
        "MultiHeadAttention: dropout is 1.000000 (expected 0 <= dropout < 1)");
  CHECK_THROWS_AS(nn::MultiHeadAttention(2, 3, true, 1, "", -1, DType::f32, -0.1), std::invalid_argument);
}

TEST_CASE("a transformer with attention dropout: fit interrupted and resumed by BackupAndRestore ends bit-identical to one run on 2 replicas") {
  const std::int64_t n = 64, length = 6;
  std::vector<std::int32_t> ids, next;
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t t = 0; t < length; ++t) {
      ids.push_back(static_cast<std::int32_t>((i * 5 + t * 3) % 9));
      next.push_back(static_cast<std::int32_t>((i * 5 + (t + 1) * 3) % 9));
    }
  }
  const Tensor x = Tensor::from_vector(ids, {n, length});
  const Tensor y = Tensor::from_vector(next, {n, length});
  const auto training_set = [&] { return data::Dataset::from_tensor_slices({x, y}).shuffle(n, 3).repeat().batch(8); };
  const auto transformer = [](double dropout) {
    nn::Sequential layers;
    layers.add(nn::TokenAndPositionEmbedding(9, 6, 8, 1));
    layers.add(nn::Residual({nn::LayerNormalization(), nn::MultiHeadAttention(2, 4, true, 2, "", -1, DType::f32, dropout)}));
    layers.add(nn::Dense(8, 9, nn::Activation::none, 7));
    nn::Model model(std::move(layers));
    model.build({-1, 6});
    model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
    return model;
  };
  const auto bits = [](const std::map<std::string, Variable>& vars) {  // every variable's bytes, by name
    std::map<std::string, std::string> out;
    for (const auto& [name, v] : vars) {
      const Tensor t = v.value().to(Device());
      out[name].assign(static_cast<const char*>(t.raw_data()), t.nbytes());
    }
    return out;
  };
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  nn::Model reference = transformer(0.3);
  reference.fit(training_set(), 3, 6, quiet());
  const auto expected = bits(reference.variables());
  nn::Model without = transformer(0.0);
  without.fit(training_set(), 3, 6, quiet());
  CHECK(bits(without.variables()).at("dense_0/kernel") != expected.at("dense_0/kernel"));  // the mask matters

  struct interrupted {};
  troupe::testing::temp_dir dir("attention-backup");
  nn::BackupOptions every_4;
  every_4.save_freq = 4;
  for (int attempt = 0; attempt < 2; ++attempt) {
    CAPTURE(attempt);
    nn::Model model = transformer(0.3);
    nn::BackupAndRestore backup(dir.path.string(), every_4);
    nn::FitOptions options = quiet();
    options.backup_and_restore = &backup;
    if (attempt == 0) {
      options.on_step_end = [](std::int64_t step, double) {
        if (step == 10) throw interrupted{};
      };
      CHECK_THROWS_AS(model.fit(training_set(), 3, 6, options), interrupted);
    } else {
      model.fit(training_set(), 3, 6, options);
      CHECK(bits(model.variables()) == expected);
    }
  }
}

}  // namespace TROUPE_TEST_FILE
