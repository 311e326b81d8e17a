// One side of the save/load round trip, run as two processes by saved_model_check.sh:
//
//   saved_model_program save DIR OUT [cnn|transformer]
//       trains a small model under MirroredStrategy on 2 CPU replicas: a CNN with Dropout (Adam),
//       or a character transformer of two Residual blocks (LayerNormalization and causal
//       MultiHeadAttention with attention dropout; LayerNormalization, Dense, GELU, Dense) and
//       AdamW; saves it into
//       DIR, writes its predictions to OUT/saved.bin, trains one more epoch and writes the
//       predictions and weights to OUT/resumed.bin;
//   saved_model_program load DIR OUT [cnn|transformer]
//       rebuilds the model with nn::load_model(DIR) (no code here names a layer), and exits 0
//       only when its predictions are OUT/saved.bin's bits and one more epoch of fit ends with
//       OUT/resumed.bin's bits.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "troupe/data/dataset.hpp"
#include "troupe/distribute/mirrored_strategy.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/attention.hpp"
#include "troupe/nn/conv.hpp"
#include "troupe/nn/dense.hpp"
#include "troupe/nn/dropout.hpp"
#include "troupe/nn/flatten.hpp"
#include "troupe/nn/model.hpp"
#include "troupe/nn/ops.hpp"
#include "troupe/nn/normalization.hpp"
#include "troupe/nn/pooling.hpp"
#include "troupe/nn/position_embedding.hpp"
#include "troupe/nn/residual.hpp"
#include "troupe/nn/saving.hpp"
#include "troupe/runtime.hpp"

using namespace troupe;

namespace {

// 96 images 8x8x1 and labels 0..3 (a fixed function of the pixels), the same in both processes.
data::Element images() {
  const std::int64_t n = 96;
  const Tensor pixels = nn::glorot_uniform(n * 64, 1, 11).reshape({n, 8, 8, 1});
  const auto values = pixels.to_vector<float>();
  std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    float top = 0, left = 0;
    for (int p = 0; p < 32; ++p) top += values[static_cast<std::size_t>(i * 64 + p)];
    for (int r = 0; r < 8; ++r) left += values[static_cast<std::size_t>(i * 64 + r * 8)];
    labels[static_cast<std::size_t>(i)] = (top > 0 ? 2 : 0) + (left > 0 ? 1 : 0);
  }
  return {pixels, Tensor::from_vector(labels, {n})};
}

// 48 windows of 6 character ids (0..9) and the ids that follow each, the same in both processes.
data::Element windows() {
  const std::int64_t n = 48, length = 6;
  std::vector<std::int32_t> ids, next;
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t t = 0; t < length; ++t) {
      ids.push_back(static_cast<std::int32_t>((i * 7 + t * t) % 10));
      next.push_back(static_cast<std::int32_t>((i * 7 + (t + 1) * (t + 1)) % 10));
    }
  }
  return {Tensor::from_vector(ids, {n, length}), Tensor::from_vector(next, {n, length})};
}

nn::Model transformer() {
  nn::Sequential layers;
  layers.add(nn::TokenAndPositionEmbedding(10, 6, 8, 1));
  layers.add(nn::Residual({nn::LayerNormalization(), nn::MultiHeadAttention(2, 4, true, 2, "", -1, DType::f32, 0.1)},
                          "attention"));
  layers.add(nn::Residual({nn::LayerNormalization(), nn::Dense(8, 16, nn::Activation::none, 6),
                           nn::ActivationLayer("gelu"), nn::Dense(16, 8, nn::Activation::none, 7)}));
  layers.add(nn::LayerNormalization());
  layers.add(nn::Dense(8, 10, nn::Activation::none, 8));
  nn::Model model(std::move(layers));
  model.build({-1, 6});
  model.compile(std::make_shared<nn::AdamW>(0.01f, 0.01f), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
  return model;
}

nn::Model cnn() {
  nn::Sequential layers;
  layers.add(nn::Conv2D(6, 3, 1, nn::Padding::same, nn::Activation::relu, 1));
  layers.add(nn::MaxPooling2D(2));
  layers.add(nn::Flatten());
  layers.add(nn::Dropout(0.25, 2));
  layers.add(nn::Dense(4 * 4 * 6, 4, nn::Activation::none, 3));
  nn::Model model(std::move(layers));
  model.build({-1, 8, 8, 1});
  model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
  return model;
}

// The bytes of the predictions, then of every weight and optimizer variable by name.
std::string state_bytes(const nn::Model& model, const Tensor& x, bool with_variables) {
  std::string out;
  const Tensor p = model.predict(x).to(Device());
  out.append(static_cast<const char*>(p.raw_data()), p.nbytes());
  if (with_variables) {
    for (const auto& [name, variable] : model.variables()) {
      const Tensor v = variable.value().to(Device());
      out += name;
      out.append(static_cast<const char*>(v.raw_data()), v.nbytes());
    }
  }
  return out;
}

void write(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

int main(int argc, char** argv) {
  const std::string kind = argc == 5 ? argv[4] : "cnn";
  if (argc < 4 || argc > 5 || (std::string(argv[1]) != "save" && std::string(argv[1]) != "load") ||
      (kind != "cnn" && kind != "transformer")) {
    std::cerr << "usage: saved_model_program save|load DIR OUT [cnn|transformer]\n";
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  const std::filesystem::path out = argv[3];
  Runtime rt;
  distribute::MirroredStrategy strategy(rt, {"CPU:0", "CPU:1"});
  auto scope = strategy.scope();
  const data::Element all = kind == "cnn" ? images() : windows();
  const Tensor x = all[0];
  const auto batches = [&] { return data::Dataset::from_tensor_slices(all).batch(16); };
  nn::FitOptions quiet;
  quiet.verbose = 0;
  if (mode == "save") {
    nn::Model model = kind == "cnn" ? cnn() : transformer();
    model.fit(batches(), 2, -1, quiet);
    model.save(dir);
    write(out / "saved.bin", state_bytes(model, x, false));
    model.fit(batches(), 1, -1, quiet);
    write(out / "resumed.bin", state_bytes(model, x, true));
    std::cout << "saved " << dir << "\n";
    return 0;
  }
  nn::Model model = nn::load_model(dir);
  if (state_bytes(model, x, false) != read(out / "saved.bin")) {
    std::cerr << "FAILED: the loaded model's predictions differ from the saved model's\n";
    return 1;
  }
  model.fit(batches(), 1, -1, quiet);
  if (state_bytes(model, x, true) != read(out / "resumed.bin")) {
    std::cerr << "FAILED: one epoch of fit after load_model does not end with the weights and predictions of the "
                 "saving process's next epoch\n";
    return 1;
  }
  std::cout << "loaded " << dir << ": predictions bit-identical, fit resumed identically\n";
  return 0;
}
