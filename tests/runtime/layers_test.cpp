#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/temp_dir.hpp"
#include "gradient_check.hpp"
#include "test_util.hpp"
#include "troupe/nn/backup_and_restore.hpp"
#include "troupe/nn/normalization.hpp"

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

nn::FitOptions quiet() {
  nn::FitOptions o;
  o.verbose = 0;
  return o;
}

// Every variable's components, as bytes: equal maps are bit-identical runs.
std::map<std::string, std::vector<std::string>> bits(const std::map<std::string, Variable>& variables) {
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& [name, v] : variables) {
    for (const Tensor& c : v.components()) {
      const Tensor host = c.to(Device());
      out[name].emplace_back(static_cast<const char*>(host.raw_data()), host.nbytes());
    }
  }
  return out;
}

// 8x8 one-channel images of four classes: a horizontal bar, a vertical bar, a diagonal and a
// square outline, each at a random place, with noise. Features float32 [n, 8, 8, 1], labels int32 [n].
struct Images {
  Tensor features;
  Tensor labels;
};

Images bar_images(std::int64_t n, std::uint64_t seed) {
  std::vector<float> pixels(static_cast<std::size_t>(n * 64));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
  const auto noise = nn::glorot_uniform(n * 64, 1, seed).to_vector<float>();
  const auto where = nn::glorot_uniform(n * 2, 1, seed + 1).to_vector<float>();
  const float limit = std::sqrt(6.0f / static_cast<float>(n * 64 + 1));
  const float place_limit = std::sqrt(6.0f / static_cast<float>(n * 2 + 1));
  for (std::int64_t i = 0; i < n; ++i) {
    const int label = static_cast<int>(i % 4);
    labels[static_cast<std::size_t>(i)] = label;
    // A place in 1..4 from the uniform values.
    const auto place = [&](int k) {
      const float u = (where[static_cast<std::size_t>(i * 2 + k)] / place_limit + 1.0f) / 2.0f;
      return 1 + std::min(3, static_cast<int>(u * 4.0f));
    };
    const int r = place(0), c = place(1);
    float* img = pixels.data() + i * 64;
    for (int p = 0; p < 64; ++p) img[p] = 0.3f * noise[static_cast<std::size_t>(i * 64 + p)] / limit;
    for (int k = 0; k < 4; ++k) {
      if (label == 0) img[r * 8 + c + k - 1] += 1.0f;
      if (label == 1) img[(r + k - 1) * 8 + c] += 1.0f;
      if (label == 2) img[(r + k - 1) * 8 + c + k - 1] += 1.0f;
    }
    if (label == 3) {
      for (int k = 0; k < 3; ++k) {
        img[(r - 1) * 8 + c - 1 + k] += 1.0f;
        img[(r + 1) * 8 + c - 1 + k] += 1.0f;
      }
      img[r * 8 + c - 1] += 1.0f;
      img[r * 8 + c + 1] += 1.0f;
    }
  }
  return {Tensor::from_vector(pixels, {n, 8, 8, 1}), Tensor::from_vector(labels, {n})};
}

nn::Sequential small_cnn(std::uint64_t seed, double dropout = 0.0) {
  nn::Sequential model;
  model.add(nn::Conv2D(8, 3, {1, 1}, nn::Padding::valid, nn::Activation::relu, seed));
  model.add(nn::MaxPooling2D(2));
  model.add(nn::Flatten());
  if (dropout > 0) model.add(nn::Dropout(dropout, seed + 1));
  model.add(nn::Dense(3 * 3 * 8, 4, nn::Activation::none, seed + 2));
  return model;
}

}  // namespace

TEST_CASE("Conv2D's gradients match finite differences for valid and same padding, strides and 1x1 kernels") {
  struct Case {
    int in, filters;
    nn::Size2 kernel, strides;
    nn::Padding padding;
    nn::Activation activation;
    Shape input;
  };
  const std::vector<Case> cases = {
      {2, 3, 3, {1, 1}, nn::Padding::valid, nn::Activation::none, {2, 5, 4, 2}},
      {2, 3, {2, 3}, {2, 1}, nn::Padding::same, nn::Activation::none, {2, 5, 4, 2}},
      {1, 2, 3, {2, 2}, nn::Padding::same, nn::Activation::relu, {1, 6, 7, 1}},
      {3, 2, 1, {1, 1}, nn::Padding::valid, nn::Activation::none, {2, 3, 3, 3}},
      {2, 2, 2, {3, 2}, nn::Padding::valid, nn::Activation::none, {1, 7, 5, 2}},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(i);
    const Case& c = cases[i];
    nn::Conv2D layer(c.filters, c.kernel, c.strides, c.padding, c.activation, 10 + i, "conv", DType::f64);
    CHECK(!layer.built());
    layer.build(c.input);
    CHECK(layer.input_channels() == c.in);
    // A nonzero bias, so that the bias's gradient is checked away from 0 too.
    Variable(layer.bias()).assign(pseudo_random({c.filters}, 3 + i));
    check_gradients(layer, pseudo_random(c.input, 20 + i), nn::CallContext{true});
  }
}

TEST_CASE("Conv2D computes the hand-computed sums, with TensorFlow's output sizes and padding split") {
  // A 2x2 kernel of ones on a 3x3 image 1..9: valid sums of each 2x2 window.
  nn::Conv2D ones(1, 2, {1, 1}, nn::Padding::valid, nn::Activation::none, 0, "", DType::f64);
  ones.build({-1, 3, 3, 1});
  Variable(ones.kernel()).assign(Tensor::full({2, 2, 1, 1}, 1.0, DType::f64));
  const Tensor image = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 3, 3, 1});
  CHECK(ones.forward(image).to_vector<double>() == std::vector<double>{12, 16, 24, 28});
  // same with stride 2: ceil(3/2) = 2 outputs per axis, padding (1·2 + 2 - 3) = 1 after (none before).
  nn::Conv2D strided(1, 2, {2, 2}, "same", nn::Activation::none, 0, "", DType::f64);
  strided.build({-1, 3, 3, 1});
  Variable(strided.kernel()).assign(Tensor::full({2, 2, 1, 1}, 1.0, DType::f64));
  const Tensor s = strided.forward(image);
  CHECK(s.shape() == Shape{1, 2, 2, 1});
  CHECK(s.to_vector<double>() == std::vector<double>{12, 9, 15, 9});
  // Two channels in, two filters out: the kernel picks channel 0 for filter 0 and 2·channel 1 for filter 1.
  nn::Conv2D mix(2, 1, {1, 1}, nn::Padding::valid, nn::Activation::relu, 0, "", DType::f64);
  mix.build({-1, 1, 2, 2});
  Variable(mix.kernel()).assign(Tensor::from_vector<double>({1, 0, 0, 2}, {1, 1, 2, 2}));
  Variable(mix.bias()).assign(Tensor::from_vector<double>({0, -1}));
  CHECK(mix.forward(Tensor::from_vector<double>({3, -4, 5, 6}, {1, 1, 2, 2})).to_vector<double>() ==
        std::vector<double>{3, 0, 5, 11});
  // Output shapes: valid floor((in - k) / s) + 1, same ceil(in / s).
  nn::Conv2D shapes(4, 3, {2, 2}, nn::Padding::valid);
  CHECK(shapes.output_shape({-1, 7, 9, 3}) == Shape{-1, 3, 4, 4});
  nn::Conv2D same(4, 3, {2, 2}, nn::Padding::same);
  CHECK(same.output_shape({5, 7, 9, 3}) == Shape{5, 4, 5, 4});
  CHECK(same.count_params() == 0);  // built by its first input, as in Keras
  CHECK(contains(message_of([&] { same.kernel(); }), "Conv2D.kernel: the layer is not built yet"));
  CHECK(same.forward(Tensor::zeros({1, 7, 9, 3})).shape() == Shape{1, 4, 5, 4});
  CHECK(same.output_shape({-1, -1, -1, 3}) == Shape{-1, -1, -1, 4});
  CHECK(same.kernel().value().shape() == Shape{3, 3, 3, 4});
  CHECK(same.count_params() == 3 * 3 * 3 * 4 + 4);
}

TEST_CASE("Conv2D's kernel is Glorot-uniform from its seed and its float32 output agrees with float64") {
  nn::Conv2D a(4, 3, {1, 1}, nn::Padding::same, nn::Activation::relu, 5);
  nn::Conv2D b(4, 3, {1, 1}, nn::Padding::same, nn::Activation::relu, 5);
  nn::Conv2D c(4, 3, {1, 1}, nn::Padding::same, nn::Activation::relu, 6);
  for (const nn::Conv2D* l : {&a, &b, &c}) l->build({-1, 5, 5, 3});
  // Copies share what is built.
  nn::Conv2D copy = a;
  CHECK(copy.kernel().value().equals(a.kernel().value()));
  CHECK(a.kernel().value().equals(b.kernel().value()));
  CHECK(!a.kernel().value().equals(c.kernel().value()));
  const double limit = std::sqrt(6.0 / (27.0 + 36.0));
  for (float v : a.kernel().value().to_vector<float>()) CHECK(std::abs(v) <= limit);
  CHECK(a.bias().value().to_vector<float>() == std::vector<float>(4, 0.0f));
  nn::Conv2D wide(4, 3, {1, 1}, nn::Padding::same, nn::Activation::relu, 5, "", DType::f64);
  wide.build({-1, 5, 5, 3});
  Variable(wide.kernel()).assign(a.kernel().value().cast(DType::f64));
  const Tensor x = pseudo_random({2, 5, 5, 3}, 8);
  CHECK(max_abs_diff(a.forward(x.cast(DType::f32)), wide.forward(x)) < 1e-5);
}

TEST_CASE("MaxPooling2D and AveragePooling2D: hand-computed values and finite-difference gradients") {
  const Tensor image = Tensor::from_vector<double>({1, 5, 2, 0, 3, 4, 8, 1, 9, 7, 6, 2}, {1, 3, 4, 1});
  // 2x2 windows, valid: one row of two windows.
  CHECK(nn::MaxPooling2D().forward(image).to_vector<double>() == std::vector<double>{5, 8});
  CHECK(nn::AveragePooling2D().forward(image).to_vector<double>() == std::vector<double>{13.0 / 4, 11.0 / 4});
  // same: ceil(3/2) x ceil(4/2) windows; the bottom row's windows cover one image row, and the
  // average counts only the covered inputs.
  nn::MaxPooling2D max_same(2, std::nullopt, nn::Padding::same);
  nn::AveragePooling2D avg_same(2, std::nullopt, nn::Padding::same);
  CHECK(max_same.forward(image).to_vector<double>() == std::vector<double>{5, 8, 9, 6});
  CHECK(avg_same.forward(image).to_vector<double>() == std::vector<double>{13.0 / 4, 11.0 / 4, 8, 4});
  // The gradient of a max goes to the first largest input of its window.
  const Tensor tie = Tensor::from_vector<double>({2, 2, 1, 2}, {1, 2, 2, 1});
  nn::MaxPooling2D pool;
  const Tensor out = pool.forward(tie);
  CHECK(pool.backward(tie, out, Tensor::full({1, 1, 1, 1}, 3.0, DType::f64), {}).input.to_vector<double>() ==
        std::vector<double>{3, 0, 0, 0});

  // Finite differences on distinct values (no ties near the step), several channels.
  const Tensor x = pseudo_random({2, 5, 7, 3}, 4);
  for (nn::Padding padding : {nn::Padding::valid, nn::Padding::same}) {
    CAPTURE(nn::padding_name(padding));
    check_gradients(nn::MaxPooling2D(2, std::nullopt, padding), x, {});
    check_gradients(nn::MaxPooling2D({3, 2}, nn::Size2{2, 1}, padding), x, {});
    check_gradients(nn::AveragePooling2D(2, std::nullopt, padding), x, {});
    check_gradients(nn::AveragePooling2D(3, nn::Size2{2, 2}, padding), x, {});
  }
  CHECK(nn::MaxPooling2D(3, nn::Size2{2, 2}, nn::Padding::valid).output_shape({-1, 7, 8, 3}) == Shape{-1, 3, 3, 3});
  CHECK(nn::AveragePooling2D(3, nn::Size2{2, 2}, nn::Padding::same).output_shape({4, 7, 8, 3}) == Shape{4, 4, 4, 3});
  // float32 works the same.
  CHECK(nn::MaxPooling2D().forward(image.cast(DType::f32)).to_vector<float>() == std::vector<float>{5, 8});
}

TEST_CASE("Flatten keeps the batch and the row-major order, and its gradient is the reshaped gradient") {
  nn::Flatten flatten;
  const Tensor x = pseudo_random({2, 3, 2, 2}, 3);
  const Tensor y = flatten.forward(x);
  CHECK(y.shape() == Shape{2, 12});
  CHECK(y.to_vector<double>() == x.to_vector<double>());
  CHECK(flatten.output_shape({-1, 3, 2, 2}) == Shape{-1, 12});
  CHECK(flatten.output_shape({-1, -1, 2}) == Shape{-1, -1});
  CHECK(flatten.output_shape({5}) == Shape{5, 1});
  check_gradients(flatten, x, {});
  CHECK(contains(message_of([&] { flatten.forward(Tensor::scalar(1.0)); }),
                 "Flatten: input of shape [] (expected a batch: [batch, ...])"));
}

TEST_CASE("Embedding looks up rows for int32 and int64 ids, and its gradient adds the rows of repeated ids") {
  nn::Embedding layer(5, 3, 7, "", DType::f64);
  const Tensor table = layer.embeddings().value();
  CHECK(table.shape() == Shape{5, 3});
  for (double v : table.to_vector<double>()) CHECK(std::abs(v) <= 0.05);
  const auto t = table.to_vector<double>();
  for (DType dtype : {DType::i32, DType::i64}) {
    const Tensor ids = Tensor::from_vector<std::int64_t>({4, 0, 4, 2, 1, 4}, {2, 3}).cast(dtype);
    const Tensor out = layer.forward(ids);
    CHECK(out.shape() == Shape{2, 3, 3});
    const auto o = out.to_vector<double>();
    CHECK(std::vector<double>(o.begin(), o.begin() + 3) == std::vector<double>(t.begin() + 12, t.begin() + 15));
    CHECK(std::vector<double>(o.begin() + 9, o.begin() + 12) == std::vector<double>(t.begin() + 6, t.begin() + 9));
    check_gradients(layer, ids, {}, false);
    // Id 4 appears three times: its row's gradient is the sum of three output gradients.
    const Tensor w = pseudo_random({2, 3, 3}, 1);
    const auto g = layer.backward(ids, out, w, {}).variables.at(0).to_vector<double>();
    const auto wv = w.to_vector<double>();
    CHECK(g[12] == doctest::Approx(wv[0] + wv[6] + wv[15]));
    CHECK(g[9] == 0.0);  // id 3 is not looked up
  }
  CHECK(layer.output_shape({-1, 7}) == Shape{-1, 7, 3});
  CHECK(nn::Embedding(5, 3, 7).embeddings().value().equals(nn::Embedding(5, 3, 7).embeddings().value()));
}

TEST_CASE("Dropout: the identity at inference, and at training a mask from (seed, step, replica, layer) only") {
  nn::Dropout dropout(0.25, 3);
  const Tensor x = Tensor::full({40, 50}, 1.0, DType::f32);
  CHECK(dropout.forward(x).equals(x));
  nn::CallContext ctx{true, 7, 1, 2};
  const Tensor y = dropout.forward(x, ctx);
  const auto v = y.to_vector<float>();
  const auto zeros = std::count(v.begin(), v.end(), 0.0f);
  const auto kept = std::count(v.begin(), v.end(), 1.0f / 0.75f);
  CHECK(zeros + kept == 2000);
  CHECK(zeros > 400);  // about 500
  CHECK(zeros < 600);
  // The same context draws the same mask, in another layer object with the same seed too.
  CHECK(nn::Dropout(0.25, 3).forward(x, ctx).equals(y));
  // Another step, replica, layer position or seed draws another.
  for (const nn::CallContext& other : {nn::CallContext{true, 8, 1, 2}, nn::CallContext{true, 7, 0, 2},
                                       nn::CallContext{true, 7, 1, 3}}) {
    CHECK(!dropout.forward(x, other).equals(y));
  }
  CHECK(!nn::Dropout(0.25, 4).forward(x, ctx).equals(y));
  // The gradient passes where the mask kept the input, scaled the same way.
  check_gradients(nn::Dropout(0.4, 9), pseudo_random({6, 5}, 2), nn::CallContext{true, 3, 0, 0});
  const Tensor g = dropout.backward(x, y, x, ctx).input;
  CHECK(g.equals(y));
  CHECK(nn::Dropout(0.0).forward(x, ctx).equals(x));
}

TEST_CASE("layers refuse bad arguments and inputs with messages naming the layer, the shape and what was expected") {
  CHECK(message_of([] { nn::Conv2D(0, 3); }) == "Conv2D: filters is 0 (expected a positive number)");
  CHECK(message_of([] { nn::Conv2D(4, {3, 0}); }) == "Conv2D: kernel_size is 3x0 (expected positive sizes)");
  CHECK(message_of([] { nn::Conv2D(4, 3, {0, 1}); }) == "Conv2D: strides is 0x1 (expected positive sizes)");
  CHECK(message_of([] { nn::Conv2D(4, 3, 1, "full"); }) == "Conv2D: padding \"full\" (expected \"valid\" or \"same\")");
  CHECK(message_of([] { nn::Conv2D(4, 3, 1, nn::Padding::valid, nn::Activation::none, 0, "", DType::i32); }) ==
        "Conv2D: dtype int32 (expected float32 or float64)");
  nn::Conv2D conv(4, 3, 1, nn::Padding::valid, nn::Activation::none, 0, "conv");
  conv.build({-1, -1, -1, 3});
  CHECK(message_of([&] { conv.forward(Tensor::zeros({2, 5, 5, 2})); }) ==
        "Conv2D 'conv': input of shape [2, 5, 5, 2] (expected [batch, height, width, 3])");
  CHECK(message_of([&] { conv.forward(Tensor::zeros({2, 5, 3})); }) ==
        "Conv2D 'conv': input of shape [2, 5, 3] (expected [batch, height, width, 3])");
  CHECK(contains(message_of([&] { conv.forward(Tensor::zeros({2, 2, 5, 3})); }),
                 "Conv2D 'conv': input of shape [2, 2, 5, 3] is smaller than the 3x3 kernel"));
  CHECK(message_of([&] { conv.forward(Tensor::zeros({2, 5, 5, 3}, DType::f64)); }) ==
        "Conv2D 'conv': input is float64 but the layer's variables are float32 (expected one dtype: cast the input)");
  CHECK(message_of([&] { conv.forward(Tensor::zeros({2, 5, 5, 3}, DType::i32)); }) ==
        "Conv2D 'conv': input is int32 (expected float32 or float64)");
  const Tensor x = Tensor::zeros({1, 5, 5, 3});
  const Tensor out = conv.forward(x);
  CHECK(contains(message_of([&] { conv.backward(x, out, Tensor::zeros({1, 3, 3, 5}), {}); }),
                 "Conv2D 'conv': grad_output is float32 [1, 3, 3, 5] (expected the output's float32 [1, 3, 3, 4])"));

  CHECK(message_of([] { nn::MaxPooling2D(0); }) == "MaxPooling2D: pool_size is 0x0 (expected positive sizes)");
  CHECK(message_of([] { nn::AveragePooling2D(2, nn::Size2{1, -1}); }) ==
        "AveragePooling2D: strides is 1x-1 (expected positive sizes)");
  CHECK(message_of([] { nn::MaxPooling2D().forward(Tensor::zeros({4, 4})); }) ==
        "MaxPooling2D: input of shape [4, 4] (expected [batch, height, width, channels])");
  CHECK(contains(message_of([] { nn::AveragePooling2D(3).forward(Tensor::zeros({1, 2, 4, 1})); }),
                 "AveragePooling2D: input of shape [1, 2, 4, 1] is smaller than the 3x3 window"));

  nn::Embedding embedding(10, 4, 0, "words");
  CHECK(message_of([&] { embedding.forward(Tensor::from_vector<std::int32_t>({1, 12, 3}, {1, 3})); }) ==
        "Embedding 'words': id 12 at position 1 of the ids [1, 3] is out of range (expected 0..9: input_dim is 10)");
  CHECK(contains(message_of([&] { embedding.forward(Tensor::from_vector<std::int64_t>({-1})); }), "id -1 at position 0"));
  CHECK(message_of([&] { embedding.forward(Tensor::zeros({2, 3})); }) ==
        "Embedding 'words': ids are float32 [2, 3] (expected int32 or int64)");
  CHECK(message_of([] { nn::Embedding(0, 4); }) == "Embedding: input_dim is 0 (expected a positive number)");

  CHECK(message_of([] { nn::Dropout(1.0); }) == "Dropout: rate is 1.000000 (expected 0 <= rate < 1)");
  CHECK(message_of([] { nn::Dropout(-0.1); }) == "Dropout: rate is -0.100000 (expected 0 <= rate < 1)");
  CHECK(message_of([] { nn::Dropout(0.5).forward(Tensor::zeros({2}, DType::i64)); }) ==
        "Dropout: input is int64 (expected float32 or float64)");
}

TEST_CASE("Sequential names layers by kind, checks shapes as it adds them, and describes itself as JSON") {
  nn::Sequential model = small_cnn(1, 0.5);
  CHECK(model.layer_names() ==
        std::vector<std::string>{"conv2d_0", "max_pooling2d_0", "flatten_0", "dropout_0", "dense_0"});
  CHECK(model.layers()[0]->name() == "conv2d_0");
  CHECK(model.output_shapes() == std::vector<Shape>{{-1, -1, -1, 8}, {-1, -1, -1, 8}, {-1, -1}, {-1, -1}, {-1, 4}});
  CHECK(model.trainable_variables().size() == 2);  // the convolution takes its channels from the data
  model.build({-1, 8, 8, 1});
  std::vector<std::string> names;
  for (const auto& [name, v] : model.named_trainable_variables()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"conv2d_0/kernel", "conv2d_0/bias", "dense_0/kernel", "dense_0/bias"});
  CHECK(model.first_variable(4) == 2);
  CHECK(model.layer<nn::Conv2D>(0).filters() == 8);
  CHECK(contains(message_of([&] { model.layer<nn::Dense>(0); }), "layer 0 ('conv2d_0') is a Conv2D"));
  CHECK(model.uses_random_stream());

  // A second layer of a kind counts from the first; a named layer keeps its name.
  nn::Sequential two;
  two.build({-1, 9, 9, 1});
  two.add(nn::Conv2D(4, 3, 1, nn::Padding::same));
  two.add(nn::Conv2D(4, 3, 1, "same", nn::Activation::relu, 0, "features"));
  two.add(nn::Conv2D(2, 3));
  two.add(nn::LayerNormalization());
  CHECK(two.layer_names() == std::vector<std::string>{"conv2d_0", "features", "conv2d_2", "layer_normalization_0"});
  // Built as they were added: the channels were known.
  CHECK(two.built());
  CHECK(two.layer<nn::Conv2D>(1).input_channels() == 4);
  CHECK(two.layer<nn::LayerNormalization>(3).units() == 2);
  CHECK(two.output_shapes().back() == Shape{-1, 7, 7, 2});
  nn::Conv2D picky(2, 1);
  picky.build({-1, 1, 1, 3});
  CHECK(message_of([&] { two.add(picky); }) ==
        "Sequential::add: layer 4 ('conv2d_3', Conv2D) takes inputs of shape (None, None, None, 3), the previous layer "
        "('layer_normalization_0') outputs (None, 7, 7, 2)");
  // Dense maps the last axis (Keras's Dense on [batch, ..., units]): the width must agree.
  CHECK(contains(message_of([&] { two.add(nn::Dense(3, 2)); }), "Sequential::add: layer 4 ('dense_0', Dense) takes "
                                                               "inputs of shape (None, 3)"));
  CHECK(two.layers().size() == 4);
  // A braced list of layers of different kinds, Keras's argument order, built from the data.
  nn::Sequential listed({nn::Conv2D(4, 3, 1, "same", nn::Activation::relu), nn::MaxPooling2D(2), nn::Flatten(),
                         nn::Dropout(0.1f), nn::Dense(36, 3)});
  CHECK(!listed.built());
  CHECK(listed.trainable_variables().size() == 2);  // Dense's; the convolution's come with the data
  CHECK(listed.forward(Tensor::zeros({2, 6, 6, 1})).shape() == Shape{2, 3});
  CHECK(listed.built());
  CHECK(listed.first_variable(4) == 2);
  CHECK(listed.trainable_variables().size() == 4);

  // With the image size known (a Dense-only stack, or a first layer that fixes it) widths are checked.
  nn::Sequential mlp({nn::Dense(4, 3)});
  mlp.add(nn::Dropout(0.1));
  CHECK(message_of([&] { mlp.add(nn::Dense(4, 2)); }) ==
        "Sequential::add: layer 2 takes inputs of width 4, the previous layer ('dropout_0') outputs 3");

  // The JSON: Keras's shape, each layer under the model's name for it.
  const nlohmann::json config = nlohmann::json::parse(model.config());
  CHECK(config["class_name"] == "Sequential");
  const auto& layers = config["config"]["layers"];
  REQUIRE(layers.size() == 5);
  CHECK(layers[0]["class_name"] == "Conv2D");
  CHECK(layers[0]["config"]["name"] == "conv2d_0");
  CHECK(layers[0]["config"]["filters"] == 8);
  CHECK(layers[0]["config"]["kernel_size"] == nlohmann::json::array({3, 3}));
  CHECK(layers[0]["config"]["padding"] == "valid");
  CHECK(layers[0]["config"]["activation"] == "relu");
  CHECK(layers[1]["class_name"] == "MaxPooling2D");
  CHECK(layers[1]["config"]["pool_size"] == nlohmann::json::array({2, 2}));
  CHECK(layers[3]["config"]["rate"] == 0.5);
  CHECK(layers[4]["config"]["units"] == 4);
  CHECK(layers[4]["config"]["input_dim"] == 72);
}

TEST_CASE("Model::summary lists a CNN's layers with Keras's names, output shapes and parameter counts") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(1));
  auto scope = s.scope();
  nn::Model model(small_cnn(1));
  std::ostringstream out;
  model.summary(out);
  // Before its first batch the convolution has no variables yet, as Keras shows it.
  CHECK(contains(out.str(), " conv2d_0 (Conv2D)           (None, None, None, 8)     0 (unbuilt)\n"));
  CHECK(contains(out.str(), " max_pooling2d_0 (MaxPoolin  (None, None, None, 8)     0\n g2D)\n"));
  CHECK(contains(out.str(), " dense_0 (Dense)             (None, 4)                 292\n"));
  CHECK(contains(out.str(), "Total params: 292\n"));
  model.predict(Tensor::zeros({1, 8, 8, 1}));  // builds it, in the model's scope
  std::ostringstream built;
  model.summary(built);
  CHECK(contains(built.str(), " conv2d_0 (Conv2D)           (None, 6, 6, 8)           80\n"));
  CHECK(contains(built.str(), "Total params: 372\n"));
  CHECK(s.experimental_local_results(model.layers().layer<nn::Conv2D>(0).kernel()).size() == 1);
}

TEST_CASE("a small CNN trained by fit under MirroredStrategy on 2 replicas learns the bar images, the same bits twice") {
  const Images train = bar_images(512, 3);
  const Images test = bar_images(256, 99);
  const auto run = [&](std::map<std::string, std::vector<std::string>>& weights) {
    Runtime rt;
    MirroredStrategy s(rt, cpus(2));
    auto scope = s.scope();
    nn::Model model(small_cnn(5));
    model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
    const auto before = model.evaluate(test.features, test.labels);
    auto ds = data::Dataset::from_tensor_slices({train.features, train.labels}).shuffle(512, 1).repeat().batch(32);
    nn::History h = model.fit(ds, 6, 16, quiet());
    const auto after = model.evaluate(test.features, test.labels);
    CAPTURE(before.accuracy);
    CAPTURE(h.loss.front());
    CAPTURE(h.loss.back());
    CHECK(after.accuracy >= 0.95);
    CHECK(h.history.at("accuracy").back() >= 0.9);
    CHECK(after.loss < 0.5 * before.loss);
    // The replicas' copies agree, and predict takes the images as they are.
    for (const auto& [name, v] : model.variables()) {
      const auto components = bits({{name, v}}).at(name);
      for (const auto& c : components) CHECK(c == components.front());
    }
    CHECK(nn::accuracy(model.predict(test.features), test.labels) == doctest::Approx(after.accuracy));
    weights = bits(model.variables());
  };
  std::map<std::string, std::vector<std::string>> first, second;
  run(first);
  run(second);
  REQUIRE(first.count("conv2d_0/kernel") == 1);
  CHECK(first == second);
}

TEST_CASE("Dropout in a CNN: a fit interrupted and resumed by BackupAndRestore ends bit-identical to one run") {
  const Images train = bar_images(256, 4);
  const auto training_set = [&] {
    return data::Dataset::from_tensor_slices({train.features, train.labels}).shuffle(256, 2).repeat().batch(16);
  };
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  nn::Model reference(small_cnn(7, 0.3));
  reference.build({-1, 8, 8, 1});
  reference.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
  reference.fit(training_set(), 3, 8, quiet());
  const auto expected = bits(reference.variables());

  // Without dropout's mask the weights differ: the mask matters to the result.
  nn::Model no_dropout(small_cnn(7));
  no_dropout.build({-1, 8, 8, 1});
  no_dropout.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
  no_dropout.fit(training_set(), 3, 8, quiet());
  CHECK(bits(no_dropout.variables()).at("dense_0/kernel") != expected.at("dense_0/kernel"));

  struct interrupted {};
  troupe::testing::temp_dir dir("layers-backup");
  nn::BackupOptions every_3;
  every_3.save_freq = 3;
  for (int attempt = 0; attempt < 2; ++attempt) {
    CAPTURE(attempt);
    nn::Model model(small_cnn(7, 0.3));
    model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
    nn::BackupAndRestore backup(dir.path.string(), every_3);
    nn::FitOptions unbuilt = quiet();
    unbuilt.backup_and_restore = &backup;
    // The backup restores variables before the first batch could build the convolution.
    CHECK(contains(message_of([&] { model.fit(training_set(), 3, 8, unbuilt); }),
                   "Model::fit: BackupAndRestore restores the model's variables before training, but layers that take a "
                   "size from the data are not built yet: call model.build(input_shape) first"));
    model.build({-1, 8, 8, 1});
    nn::FitOptions options = quiet();
    options.backup_and_restore = &backup;
    if (attempt == 0) {
      options.on_step_end = [](std::int64_t step, double) {
        if (step == 11) throw interrupted{};
      };
      CHECK_THROWS_AS(model.fit(training_set(), 3, 8, options), interrupted);
    } else {
      model.fit(training_set(), 3, 8, options);
      CHECK(bits(model.variables()) == expected);
    }
  }
}

TEST_CASE("an Embedding model learns from int32 id sequences [batch, 4] fed by fit on 2 replicas") {
  // The label is the id at position 1 modulo 3; the other ids are noise.
  const std::int64_t n = 384;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n * 4));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
  const auto u = nn::glorot_uniform(n * 4, 1, 3).to_vector<float>();
  const float limit = std::sqrt(6.0f / static_cast<float>(n * 4 + 1));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = std::min(8, static_cast<int>((u[i] / limit + 1.0f) / 2.0f * 9.0f));
  }
  for (std::int64_t r = 0; r < n; ++r) labels[static_cast<std::size_t>(r)] = ids[static_cast<std::size_t>(r * 4 + 1)] % 3;
  const Tensor x = Tensor::from_vector(ids, {n, 4});
  const Tensor y = Tensor::from_vector(labels, {n});
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  nn::Sequential layers;
  layers.add(nn::Embedding(9, 4, 1));
  layers.add(nn::Flatten());
  layers.add(nn::Dense(16, 3, nn::Activation::none, 2));
  CHECK(layers.output_shapes() == std::vector<Shape>{{-1, -1, 4}, {-1, -1}, {-1, 3}});
  nn::Model model(layers);
  model.compile(std::make_shared<nn::Adam>(0.05f), nn::Loss::sparse_categorical_crossentropy());
  model.fit(data::Dataset::from_tensor_slices({x, y}).shuffle(n, 1).repeat().batch(32), 5, 12, quiet());
  CHECK(model.evaluate(x, y).accuracy >= 0.95);
  CHECK(contains(message_of([&] { model.predict(Tensor::from_vector<std::int32_t>({0, 9, 1, 2}, {1, 4})); }),
                 "Embedding 'embedding_0': id 9 at position 1"));
}

TEST_CASE("LayerNormalization normalises each row over its last axis, and its gradients match finite differences") {
  nn::LayerNormalization norm(1e-3, "", DType::f64);
  const Tensor x = Tensor::from_vector<double>({1, 2, 3, 6, -1, -1, -1, -1}, {2, 4});
  const auto y = norm.forward(x).to_vector<double>();
  // Row 0: mean 3, variance (4 + 1 + 0 + 9) / 4 = 3.5; row 1 is constant: all zeros.
  const double s = 1.0 / std::sqrt(3.5 + 1e-3);
  CHECK(y[0] == doctest::Approx(-2 * s));
  CHECK(y[3] == doctest::Approx(3 * s));
  CHECK(y[5] == 0.0);
  // gamma and beta away from their initial ones and zeros, inputs of rank 2 and 3.
  Variable(norm.gamma()).assign(pseudo_random({4}, 5));
  Variable(norm.beta()).assign(pseudo_random({4}, 6));
  check_gradients(norm, pseudo_random({3, 4}, 7), {});
  check_gradients(norm, pseudo_random({2, 3, 4}, 8), {});
  CHECK(norm.output_shape({-1, 7, 4}) == Shape{-1, 7, 4});
  CHECK(message_of([&] { norm.forward(Tensor::zeros({2, 5}, DType::f64)); }) ==
        "LayerNormalization: input of shape [2, 5] (expected [batch, ..., 4])");
  CHECK(message_of([] { nn::LayerNormalization(0.0); }) ==
        "LayerNormalization: epsilon is 0.000000 (expected a positive number)");
  // In a model after an Embedding: [batch, sequence, units].
  nn::Sequential model;
  model.add(nn::Embedding(6, 4, 1));
  model.add(nn::LayerNormalization());
  CHECK(model.layer_names() == std::vector<std::string>{"embedding_0", "layer_normalization_0"});
  CHECK(model.forward(Tensor::from_vector<std::int32_t>({1, 2, 3, 4, 5, 0}, {2, 3})).shape() == Shape{2, 3, 4});
  // Built when added after a layer of known width; the next layer is checked against it.
  nn::Sequential m;
  m.add(nn::Dense(2, 3));
  m.add(nn::LayerNormalization());
  CHECK(m.layer<nn::LayerNormalization>(1).units() == 3);
  CHECK(m.variables().count("layer_normalization_0/gamma") == 1);
  CHECK(message_of([&] { m.add(nn::Dense(4, 2)); }) ==
        "Sequential::add: layer 2 takes inputs of width 4, the previous layer ('layer_normalization_0') outputs 3");
}

TEST_CASE("GradientTape follows a CNN through every layer: its gradients are Sequential::backward's") {
  const Tensor x = pseudo_random({2, 4, 4, 2}, 3);
  nn::Sequential stack;
  stack.add(nn::Conv2D(3, 3, 1, nn::Padding::same, nn::Activation::relu, 1, "", DType::f64));
  stack.add(nn::AveragePooling2D(2));
  stack.add(nn::LayerNormalization(1e-3, "", DType::f64));
  stack.add(nn::MaxPooling2D(2, nn::Size2{1, 1}));
  stack.add(nn::Flatten());
  stack.add(nn::Dropout(0.3, 4));
  const Tensor w = pseudo_random({2, 3}, 9);
  std::vector<Tensor> by_tape;
  {
    GradientTape tape;
    const Tensor out = stack.forward(x);  // inference: Dropout passes the input
    REQUIRE(out.shape() == Shape{2, 3});
    const Tensor loss = nn::compute_average_loss(nn::mean_squared_error_per_example(out, w), 2);
    by_tape = tape.gradient(loss, stack.trainable_variables());
  }
  // By hand: the same loss's gradient through backward at inference.
  std::vector<Tensor> activations;
  nn::CallContext inference;
  const Tensor out = stack.forward(x, activations, inference);
  const nn::LossAndGradient lg = nn::mean_squared_error(out, w, 2);
  const std::vector<Tensor> by_hand = stack.backward(activations, lg.gradient, nullptr, inference);
  REQUIRE(by_tape.size() == by_hand.size());
  REQUIRE(by_tape.size() == 4);  // conv kernel, bias; gamma, beta
  for (std::size_t i = 0; i < by_tape.size(); ++i) {
    CAPTURE(i);
    CHECK(max_abs_diff(by_tape[i], by_hand[i]) < 1e-12);
    CHECK(max_abs_diff(by_tape[i], Tensor::zeros(by_tape[i].shape(), DType::f64)) > 0);
  }
  // An Embedding's table gets its gradient too; the ids get none.
  nn::Embedding embedding(4, 2, 1, "", DType::f64);
  const Tensor ids = Tensor::from_vector<std::int32_t>({3, 1, 3}, {3});
  GradientTape tape;
  const Tensor e = embedding.forward(ids);
  const Tensor table_grad = tape.gradient(nn::compute_average_loss(nn::mean_squared_error_per_example(e, Tensor::zeros({3, 2}, DType::f64)), 3),
                                          embedding.embeddings());
  const auto g = table_grad.to_vector<double>();
  const auto t = embedding.embeddings().value().to_vector<double>();
  CHECK(g[0] == 0.0);
  CHECK(g[6] == doctest::Approx(2.0 * 2.0 * t[6] / 2.0 / 3.0));  // id 3 twice: 2 · (2·t / 2 columns) / 3 rows
}

TEST_CASE("Sequential::build fixes the input shape: every output shape is known, checked and in the summary") {
  nn::Sequential model = small_cnn(1);
  model.build({-1, 8, 8, 1});
  CHECK(model.input_shape() == Shape{-1, 8, 8, 1});
  CHECK(model.output_shapes() == std::vector<Shape>{{-1, 6, 6, 8}, {-1, 3, 3, 8}, {-1, 72}, {-1, 4}});
  // An image too small for the layers, or of a size the Dense after Flatten does not take.
  CHECK(contains(message_of([&] { model.build({-1, 2, 2, 1}); }),
                 "Sequential::build: layer 0: Conv2D 'conv2d_0': input of shape [-1, 2, 2, 1] is smaller than the 3x3 kernel"));
  CHECK(message_of([&] { model.build({-1, 10, 10, 1}); }) ==
        "Sequential::build: layer 3 takes inputs of width 72, the previous layer ('flatten_0') outputs 128");
  CHECK(model.input_shape() == Shape{-1, 8, 8, 1});  // unchanged by a failed build
  // Layers added after build are checked against the known shape.
  nn::Sequential grown;
  grown.build({-1, 8, 8, 1});
  grown.add(nn::Conv2D(4, 3));
  grown.add(nn::Flatten());
  CHECK(message_of([&] { grown.add(nn::Dense(100, 2)); }) ==
        "Sequential::add: layer 2 takes inputs of width 100, the previous layer ('flatten_0') outputs 144");
  CHECK(contains(message_of([] {
                   nn::Sequential m;
                   m.build({-1, 5});
                   m.add(nn::Dense(4, 2));
                 }),
                 "Sequential::add: layer 0 takes inputs of width 4, the input outputs 5"));
  Runtime rt;
  MirroredStrategy s(rt, cpus(1));
  auto scope = s.scope();
  nn::Sequential built = small_cnn(1);
  built.build({-1, 8, 8, 1});
  nn::Model m(built);
  std::ostringstream out;
  m.summary(out);
  CHECK(contains(out.str(), " conv2d_0 (Conv2D)           (None, 6, 6, 8)           80\n"));
  CHECK(contains(out.str(), " flatten_0 (Flatten)         (None, 72)                0\n"));
}

TEST_CASE("softmax cross-entropy with one-hot targets: hand value, finite differences, and fit with accuracy") {
  const Tensor logits = Tensor::from_vector<double>({1, 2, 3, 0, 0, 0}, {2, 3});
  const Tensor targets = Tensor::from_vector<double>({0, 0, 1, 0.5, 0.5, 0}, {2, 3});
  const double lse0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  const auto per = nn::softmax_cross_entropy_per_example(logits, targets).to_vector<double>();
  CHECK(per[0] == doctest::Approx(lse0 - 3));
  CHECK(per[1] == doctest::Approx(std::log(3.0)));
  // The same as the sparse loss for one-hot rows.
  const Tensor one_hot = Tensor::from_vector<double>({0, 1, 0, 1, 0, 0}, {2, 3});
  CHECK(nn::softmax_cross_entropy(logits, one_hot).loss.item<double>() ==
        doctest::Approx(nn::sparse_softmax_cross_entropy(logits, Tensor::from_vector<std::int32_t>({1, 0})).loss.item<double>()));
  const Tensor z = pseudo_random({4, 5}, 1);
  const Tensor t = (pseudo_random({4, 5}, 2) * 0.5 + 0.5);  // any nonnegative targets
  const nn::LossAndGradient lg = nn::softmax_cross_entropy(z, t, 8);
  const Tensor num = numeric_gradient([&](const Tensor& v) { return nn::softmax_cross_entropy(v, t, 8).loss.item<double>(); },
                                      z, 1e-6);
  CHECK(max_abs_diff(lg.gradient, num) < 1e-8);
  CHECK(contains(message_of([&] { nn::softmax_cross_entropy(z, Tensor::from_vector<std::int32_t>({1, 2, 3, 4})); }),
                 "softmax_cross_entropy: targets are int32 [4] for logits [4, 5] (expected float one-hot rows"));
  CHECK(nn::accuracy(logits, Tensor::from_vector<float>({0, 0, 1, 0, 1, 0}, {2, 3})) == 0.5);

  // The bar images with one-hot labels, categorical_crossentropy and the accuracy metric.
  const Images train = bar_images(256, 5);
  std::vector<float> hot(256 * 4, 0.0f);
  const auto labels = train.labels.to_vector<std::int32_t>();
  for (std::size_t i = 0; i < labels.size(); ++i) hot[i * 4 + static_cast<std::size_t>(labels[i])] = 1.0f;
  const Tensor y = Tensor::from_vector(hot, {256, 4});
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  nn::Model model(small_cnn(3));
  model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::categorical_crossentropy(), {"accuracy"});
  nn::History h = model.fit(data::Dataset::from_tensor_slices({train.features, y}).shuffle(256, 1).repeat().batch(32), 10,
                            8, quiet());
  CHECK(h.history.at("accuracy").back() >= 0.9);
  const auto result = model.evaluate(train.features, y);
  CHECK(result.accuracy >= 0.9);
  CHECK(result.loss < h.loss.front());
}

TEST_CASE("categorical_crossentropy on probabilities: Keras's clipped value and its gradient") {
  const nn::Loss loss = nn::Loss::categorical_crossentropy(false);
  const Tensor p = Tensor::from_vector<double>({0.2, 0.5, 0.3, 0.0, 1.0, 0.0}, {2, 3});
  const Tensor t = Tensor::from_vector<double>({0, 1, 0, 1, 0, 0}, {2, 3});
  const nn::LossAndGradient lg = loss.fn(p, t, 2);
  // Row 0: -log 0.5; row 1: -log(1e-7) (clipped); over a global batch of 2.
  CHECK(lg.loss.item<double>() == doctest::Approx((-std::log(0.5) - std::log(1e-7)) / 2));
  const auto g = lg.gradient.to_vector<double>();
  CHECK(g[1] == doctest::Approx(-1.0 / 0.5 / 2));
  CHECK(g[3] == 0.0);  // clipped: no gradient
  CHECK(g[0] == 0.0);
  const Tensor q = pseudo_random({3, 4}, 1) * 0.4 + 0.5;
  const Tensor w = pseudo_random({3, 4}, 2) * 0.5 + 0.5;
  const Tensor num = numeric_gradient([&](const Tensor& v) { return loss.fn(v, w, 3).loss.item<double>(); }, q, 1e-6);
  CHECK(max_abs_diff(loss.fn(q, w, 3).gradient, num) < 1e-7);
}

TEST_CASE("a CNN with Dropout trained with gradient buckets ends with the bits of one all-reduce after backward") {
  // The bucketed backward walks any layers, each handing on its gradients as they exist; the
  // convolution is built from the first batch inside run (merge_call) in both runs.
  const Images train = bar_images(128, 6);
  const auto run = [&](int bucket_bytes) {
    RuntimeOptions options;
    options.gradient_bucket_bytes = bucket_bytes;
    Runtime rt(options);
    MirroredStrategy s(rt, cpus(2));
    auto scope = s.scope();
    nn::Model model(small_cnn(8, 0.2));
    model.compile(std::make_shared<nn::SGD>(0.05f, 0.9f), nn::Loss::sparse_categorical_crossentropy());
    model.fit(data::Dataset::from_tensor_slices({train.features, train.labels}).repeat().batch(16), 2, 4, quiet());
    CHECK(model.layers().built());
    return bits(model.variables());
  };
  const auto whole = run(0);
  REQUIRE(whole.count("conv2d_0/kernel") == 1);
  CHECK(run(64) == whole);    // a bucket per gradient, nearly
  CHECK(run(1024) == whole);  // the convolution's gradients together
}

TEST_CASE("a CNN built from its first batch trains under one replica and the default strategy too") {
  const Images train = bar_images(64, 7);
  const auto ds = data::Dataset::from_tensor_slices({train.features, train.labels}).repeat().batch(16);
  {
    Runtime rt;
    MirroredStrategy s(rt, cpus(1));
    auto scope = s.scope();
    nn::Model model(small_cnn(9));
    model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
    const nn::History h = model.fit(ds, 2, 4, quiet());
    CHECK(h.steps == 8);
    CHECK(s.experimental_local_results(model.layers().layer<nn::Conv2D>(0).kernel()).size() == 1);
    CHECK(model.optimizer()->variables().size() == 1 + 2 * 4);  // iterations; m and v of 4 variables
  }
  nn::Model model(small_cnn(9));
  model.compile(std::make_shared<nn::SGD>(0.05f), nn::Loss::sparse_categorical_crossentropy());
  const nn::History h = model.fit(ds, 2, 4, quiet());
  CHECK(h.loss.back() < h.loss.front());
  CHECK(model.layers().built());
}

}  // namespace TROUPE_TEST_FILE
