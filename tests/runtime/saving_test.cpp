#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "../common/temp_dir.hpp"
#include "test_util.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/attention.hpp"
#include "troupe/nn/batch_normalization.hpp"
#include "troupe/nn/conv.hpp"
#include "troupe/nn/dropout.hpp"
#include "troupe/nn/flatten.hpp"
#include "troupe/nn/model.hpp"
#include "troupe/nn/normalization.hpp"
#include "troupe/nn/pooling.hpp"
#include "troupe/nn/position_embedding.hpp"
#include "troupe/nn/residual.hpp"
#include "troupe/nn/saving.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using troupe::testing::contains;
using troupe::testing::message_of;
namespace fs = std::filesystem;

namespace {

nn::Model saved_cnn(const std::string& dir) {
  nn::Sequential layers;
  layers.add(nn::Conv2D(4, 3, 1, nn::Padding::same, nn::Activation::relu, 1));
  layers.add(nn::AveragePooling2D(2));
  layers.add(nn::MaxPooling2D({2, 2}, nn::Size2(1, 1), nn::Padding::same));
  layers.add(nn::LayerNormalization(1e-3));
  layers.add(nn::Flatten());
  layers.add(nn::Dropout(0.5, 2));
  layers.add(nn::Dense(4 * 4 * 4, 3, nn::Activation::none, 3));
  nn::Model model(std::move(layers));
  model.build({-1, 8, 8, 1});
  model.compile(std::make_shared<nn::SGD>(0.05f, 0.9f, true), nn::Loss::sparse_categorical_crossentropy(),
                {"accuracy"});
  const Tensor x = nn::glorot_uniform(8 * 64, 1, 4).reshape({8, 8, 8, 1});
  const Tensor y = Tensor::from_vector<std::int32_t>({0, 1, 2, 0, 1, 2, 0, 1}, {8});
  nn::FitOptions quiet;
  quiet.verbose = 0;
  model.fit(data::Dataset::from_tensor_slices({x, y}).batch(4), 1, -1, quiet);
  model.save(dir);
  return model;
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spill(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary | std::ios::trunc) << text; }

// Edits model.json's JSON with `edit` and returns load_model's message.
template <class Edit>
std::string load_edited(const fs::path& dir, Edit edit) {
  nlohmann::json doc = nlohmann::json::parse(slurp(dir / "model.json"));
  edit(doc);
  spill(dir / "model.json", doc.dump());
  return message_of([&] { nn::load_model(dir.string()); });
}

}  // namespace

TEST_CASE("load_model rebuilds every layer kind, the compiled loss, optimizer and metrics, and the same predictions") {
  testing::temp_dir tmp("saving");
  const fs::path dir = tmp.path / "cnn";
  const nn::Model saved = saved_cnn(dir.string());
  const nn::Model loaded = nn::load_model(dir.string());
  CHECK(loaded.layers().config() == saved.layers().config());
  CHECK(loaded.layers().layer_names() == saved.layers().layer_names());
  CHECK(loaded.loss().name == "sparse_categorical_crossentropy");
  CHECK(loaded.metrics() == std::vector<std::string>{"accuracy"});
  REQUIRE(loaded.optimizer() != nullptr);
  const auto* sgd = dynamic_cast<const nn::SGD*>(loaded.optimizer().get());
  REQUIRE(sgd != nullptr);
  CHECK(sgd->momentum() == 0.9f);
  CHECK(sgd->nesterov());
  CHECK(loaded.optimizer()->iterations().value().item<std::int64_t>() == 2);
  const Tensor x = nn::glorot_uniform(5 * 64, 1, 9).reshape({5, 8, 8, 1});
  CHECK(loaded.predict(x).to_vector<float>() == saved.predict(x).to_vector<float>());
  for (const auto& [name, variable] : saved.variables()) {
    CAPTURE(name);
    REQUIRE(loaded.variables().count(name) == 1);
    const Tensor mine = loaded.variables().at(name).value(), theirs = variable.value();
    REQUIRE(mine.nbytes() == theirs.nbytes());
    CHECK(std::memcmp(mine.raw_data(), theirs.raw_data(), mine.nbytes()) == 0);
  }
  CHECK(nn::known_layer_classes() ==
        std::vector<std::string>{"Activation", "AveragePooling2D", "BatchNormalization", "Conv2D", "Dense", "Dropout",
                                 "Embedding", "Flatten", "LayerNormalization", "MaxPooling2D", "MultiHeadAttention", "Residual",
                                 "SyncBatchNormalization", "TokenAndPositionEmbedding"});
  // Without compile: the layers and their weights only.
  nn::LoadOptions layers_only;
  layers_only.compile = false;
  const nn::Model bare = nn::load_model(dir.string(), layers_only);
  CHECK(bare.optimizer() == nullptr);
  CHECK(bare.predict(x).to_vector<float>() == saved.predict(x).to_vector<float>());
}

TEST_CASE("Model::save replaces an earlier save whole, refuses a directory that is not a saved model, and needs a built model") {
  testing::temp_dir tmp("saving");
  const fs::path dir = tmp.path / "cnn";
  saved_cnn(dir.string());
  const std::string first = slurp(dir / "variables.ckpt");
  // A save killed mid-way leaves only its temporary directory beside the real one.
  fs::create_directory(tmp.path / "cnn.tmp-999999999-0");
  spill(tmp.path / "cnn.tmp-999999999-0" / "model.json", "{\"trunc");
  CHECK_NOTHROW(nn::load_model(dir.string()));
  saved_cnn(dir.string());  // trains again from the same start: the same bits, written anew
  CHECK(slurp(dir / "variables.ckpt") == first);
  std::vector<std::string> beside;
  for (const auto& e : fs::directory_iterator(tmp.path)) beside.push_back(e.path().filename().string());
  CHECK(beside == std::vector<std::string>{"cnn"});  // no temporary left, the dead one removed

  fs::create_directory(tmp.path / "notes");
  spill(tmp.path / "notes" / "todo.txt", "keep me");
  nn::Model model(nn::Sequential({nn::Dense(2, 2)}));
  CHECK(contains(message_of([&] { model.save((tmp.path / "notes").string()); }), "is not a saved model (no model.json)"));
  CHECK(slurp(tmp.path / "notes" / "todo.txt") == "keep me");
  nn::Model unbuilt(nn::Sequential({nn::Conv2D(2, 3), nn::Flatten()}));
  CHECK(contains(message_of([&] { unbuilt.save((tmp.path / "u").string()); }), "Model::save: the model is not built"));
}

TEST_CASE("a malformed saved model is a SavedModelError naming the file and the field") {
  testing::temp_dir tmp("saving");
  const fs::path dir = tmp.path / "cnn";
  saved_cnn(dir.string());
  const std::string good = slurp(dir / "model.json");
  const std::string file = (dir / "model.json").string();
  const auto restore = [&] { spill(dir / "model.json", good); };

  SUBCASE("truncated") {
    spill(dir / "model.json", good.substr(0, good.size() / 2));
    const std::string m = message_of([&] { nn::load_model(dir.string()); });
    CHECK(contains(m, "load_model: " + file + " is not valid JSON (truncated or corrupted?)"));
    CHECK_THROWS_AS(nn::load_model(dir.string()), nn::SavedModelError);
  }
  SUBCASE("an unknown class_name") {
    const std::string m = load_edited(dir, [](nlohmann::json& d) { d["model_config"]["config"]["layers"][1]["class_name"] = "Conv3D"; });
    CHECK(contains(m, file + ": field \"model_config.config.layers[1].class_name\" \"Conv3D\" is no layer troupe knows"));
    CHECK(contains(m, "LoadOptions::custom_objects"));
  }
  SUBCASE("a missing field") {
    const std::string m = load_edited(dir, [](nlohmann::json& d) { d["model_config"]["config"]["layers"][0]["config"].erase("filters"); });
    CHECK(contains(m, file + ": model_config.config.layers[0].config (Conv2D): field \"filters\" is missing"));
  }
  SUBCASE("an ill-typed field") {
    std::string m = load_edited(dir, [](nlohmann::json& d) { d["model_config"]["config"]["layers"][0]["config"]["filters"] = "4"; });
    CHECK(contains(m, "(Conv2D): field \"filters\" is \"4\" (expected an integer)"));
    restore();
    m = load_edited(dir, [](nlohmann::json& d) { d["model_config"]["config"]["layers"][0]["config"]["kernel_size"] = {3, 0}; });
    CHECK(contains(m, "(Conv2D): field \"kernel_size\" is [3,0] (expected [height, width], positive integers)"));
    restore();
    m = load_edited(dir, [](nlohmann::json& d) { d["compile_config"]["optimizer"]["config"]["momentum"] = true; });
    CHECK(contains(m, file + ": field \"compile_config.optimizer.config.momentum\" is true (expected a number)"));
    restore();
    m = load_edited(dir, [](nlohmann::json& d) { d["model_config"]["config"]["layers"][5]["config"]["rate"] = 1.5; });
    CHECK(contains(m, "(Dropout): Dropout: rate is 1.5"));
    restore();
    m = load_edited(dir, [](nlohmann::json& d) { d["format_version"] = 7; });
    CHECK(contains(m, file + ": field \"format_version\" is 7 (this troupe reads 1)"));
  }
  SUBCASE("weights missing or of another shape") {
    fs::rename(dir / "variables.ckpt", tmp.path / "kept.ckpt");
    CHECK(contains(message_of([&] { nn::load_model(dir.string()); }),
                   "load_model: " + (dir / "variables.ckpt").string() + " is missing"));
    fs::rename(tmp.path / "kept.ckpt", dir / "variables.ckpt");
    const std::string m = load_edited(dir, [](nlohmann::json& d) { d["model_config"]["config"]["layers"][6]["config"]["units"] = 5; });
    CHECK(contains(m, "load_model: the weights do not fit the model of " + file));
    CHECK(contains(m, "variable 'dense_0/bias' is float32 [5], the file holds it as float32 [3]"));
  }
  SUBCASE("not a directory") {
    CHECK(contains(message_of([&] { nn::load_model((tmp.path / "nothing").string()); }), "is not a directory"));
  }
}

TEST_CASE("load_model takes an application's own layers through LoadOptions::custom_objects") {
  testing::temp_dir tmp("saving");
  const fs::path dir = tmp.path / "cnn";
  const nn::Model saved = saved_cnn(dir.string());
  nn::LoadOptions options;
  int made = 0;
  options.custom_objects["Flatten"] = [&](const nn::LayerConfig& config) -> std::shared_ptr<nn::Layer> {
    ++made;
    return std::make_shared<nn::Flatten>(config.name());
  };
  const nn::Model loaded = nn::load_model(dir.string(), options);
  CHECK(made == 1);
  const Tensor x = nn::glorot_uniform(64, 1, 9).reshape({1, 8, 8, 1});
  CHECK(loaded.predict(x).to_vector<float>() == saved.predict(x).to_vector<float>());
}

TEST_CASE("load_model rebuilds batch normalization (moving statistics included), GELU, attention and AdamW") {
  testing::temp_dir tmp("saving-more");
  const auto same_bits = [](const Tensor& a, const Tensor& b) {
    return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
  };
  {
    nn::Sequential layers;
    layers.add(nn::Dense(6, 8, nn::Activation::none, 1));
    layers.add(nn::BatchNormalization(0.9));
    layers.add(nn::ActivationLayer("gelu"));
    layers.add(nn::SyncBatchNormalization());
    layers.add(nn::Dense(8, 3, nn::Activation::none, 2));
    nn::Model model(std::move(layers));
    model.build({-1, 6});
    model.compile(std::make_shared<nn::AdamW>(0.01f, 0.02f), nn::Loss::sparse_categorical_crossentropy());
    const Tensor x = nn::glorot_uniform(16 * 6, 1, 4).reshape({16, 6});
    const Tensor y = Tensor::from_vector<std::int32_t>({0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0}, {16});
    nn::FitOptions quiet;
    quiet.verbose = 0;
    model.fit(data::Dataset::from_tensor_slices({x, y}).batch(8), 2, -1, quiet);
    const fs::path dir = tmp.path / "bn";
    model.save(dir.string());
    const nn::Model loaded = nn::load_model(dir.string());
    CHECK(loaded.layers().config() == model.layers().config());
    const auto* adamw = dynamic_cast<const nn::AdamW*>(loaded.optimizer().get());
    REQUIRE(adamw != nullptr);
    CHECK(adamw->weight_decay() == 0.02f);
    CHECK(same_bits(loaded.predict(x), model.predict(x)));
    const auto moving = model.layers().named_non_trainable_variables();
    REQUIRE(moving.size() == 4);
    for (const auto& [name, variable] : moving) {
      CAPTURE(name);
      REQUIRE(loaded.variables().count(name) == 1);
      CHECK(same_bits(loaded.variables().at(name).value(), variable.value()));
      CHECK_FALSE(variable.value().equals(name.find("mean") != std::string::npos ? Tensor::zeros({8}) : Tensor::full({8}, 1.0)));
    }
  }
  {
    nn::Sequential layers;
    layers.add(nn::TokenAndPositionEmbedding(11, 5, 8, 3));
    layers.add(nn::MultiHeadAttention(2, 4, true, 4));
    layers.add(nn::Dense(8, 11, nn::Activation::none, 5));
    nn::Model model(std::move(layers));
    model.build({-1, 5});
    const Tensor ids = Tensor::from_vector<std::int32_t>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {2, 5});
    const fs::path dir = tmp.path / "attention";
    model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
    model.save(dir.string());
    const nn::Model loaded = nn::load_model(dir.string());
    CHECK(loaded.layers().config() == model.layers().config());
    CHECK(same_bits(loaded.predict(ids), model.predict(ids)));
  }
}

namespace {

// A small pre-norm transformer of two Residual blocks, trained a few steps and saved into `dir`.
nn::Model saved_transformer(const std::string& dir, const Tensor& ids, const Tensor& next) {
  nn::Sequential layers;
  layers.add(nn::TokenAndPositionEmbedding(11, 5, 8, 3));
  layers.add(nn::Residual({nn::LayerNormalization(), nn::MultiHeadAttention(2, 4, true, 4, "", -1, DType::f32, 0.2)}));
  layers.add(nn::Residual({nn::LayerNormalization(), nn::Dense(8, 16, nn::Activation::none, 8),
                           nn::ActivationLayer("gelu"), nn::Dense(16, 8, nn::Activation::none, 9)},
                          "feed_forward"));
  layers.add(nn::LayerNormalization());
  layers.add(nn::Dense(8, 11, nn::Activation::none, 5));
  nn::Model model(std::move(layers));
  model.build({-1, 5});
  model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
  nn::FitOptions quiet;
  quiet.verbose = 0;
  model.fit(data::Dataset::from_tensor_slices({ids, next}).batch(2), 1, -1, quiet);
  model.save(dir);
  return model;
}

}  // namespace

TEST_CASE("load_model rebuilds Residual blocks from their nested configs, and a malformed nested config names the file and the nested field") {
  testing::temp_dir tmp("saving-residual");
  const fs::path dir = tmp.path / "transformer";
  const Tensor x = Tensor::from_vector<std::int32_t>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {2, 5});
  const Tensor y = Tensor::from_vector<std::int32_t>({2, 3, 4, 5, 6, 7, 8, 9, 10, 0}, {2, 5});
  const nn::Model saved = saved_transformer(dir.string(), x, y);
  const std::string file = (dir / "model.json").string();
  const std::string good = slurp(dir / "model.json");
  const auto restore = [&] { spill(dir / "model.json", good); };

  SUBCASE("the same blocks, names, weights and predictions") {
    const nn::Model loaded = nn::load_model(dir.string());
    CHECK(loaded.layers().config() == saved.layers().config());
    const Tensor a = loaded.predict(x), b = saved.predict(x);
    CHECK(a.nbytes() == b.nbytes());
    CHECK(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
    CHECK(loaded.variables().count("residual_0/multi_head_attention_0/query/kernel") == 1);
    CHECK(loaded.variables().count("feed_forward/dense_1/bias") == 1);
    CHECK(loaded.variables().size() == saved.variables().size());
    const auto& block = dynamic_cast<const nn::Residual&>(*loaded.layers().layers()[1]);
    CHECK(dynamic_cast<const nn::MultiHeadAttention&>(*block.layers()[1]).dropout() == 0.2);
  }
  SUBCASE("an application's factory is used inside a block too") {
    nn::LoadOptions options;
    int made = 0;
    options.custom_objects["LayerNormalization"] = [&](const nn::LayerConfig& config) -> std::shared_ptr<nn::Layer> {
      ++made;
      return std::make_shared<nn::LayerNormalization>(config.get_double("epsilon"), config.name());
    };
    const nn::Model loaded = nn::load_model(dir.string(), options);
    CHECK(made == 3);  // one in each block, one after them
    CHECK(loaded.predict(x).to_vector<float>() == saved.predict(x).to_vector<float>());
  }
  const std::string block = file + ": model_config.config.layers[1].config (Residual)";
  SUBCASE("a nested layer of an unknown class") {
    const std::string m = load_edited(dir, [](nlohmann::json& d) {
      d["model_config"]["config"]["layers"][1]["config"]["layers"][1]["class_name"] = "Conv3D";
    });
    CHECK(contains(m, block + ": field \"layers[1].class_name\" \"Conv3D\" is no layer troupe knows"));
    CHECK(contains(m, "Residual"));  // among the known
  }
  SUBCASE("a nested field missing or ill-typed") {
    std::string m = load_edited(dir, [](nlohmann::json& d) {
      d["model_config"]["config"]["layers"][1]["config"]["layers"][1]["config"].erase("num_heads");
    });
    CHECK(contains(m, block + ": layers[1].config (MultiHeadAttention): field \"num_heads\" is missing"));
    restore();
    m = load_edited(dir, [](nlohmann::json& d) {
      d["model_config"]["config"]["layers"][2]["config"]["layers"][3]["config"]["units"] = "8";
    });
    CHECK(contains(m, file + ": model_config.config.layers[2].config (Residual): layers[3].config (Dense): field "
                             "\"units\" is \"8\" (expected an integer)"));
    restore();
    m = load_edited(dir, [](nlohmann::json& d) {
      d["model_config"]["config"]["layers"][1]["config"]["layers"][1]["config"]["dropout"] = 1.5;
    });
    CHECK(contains(m, block + ": layers[1].config (MultiHeadAttention): field \"dropout\" is 1.500000 (expected 0 <= "
                              "dropout < 1)"));
  }
  SUBCASE("the block's list malformed") {
    std::string m = load_edited(dir, [](nlohmann::json& d) { d["model_config"]["config"]["layers"][1]["config"]["layers"] = 3; });
    CHECK(contains(m, block + ": field \"layers\" is 3 (expected an array of {\"class_name\", \"config\"})"));
    restore();
    m = load_edited(dir, [](nlohmann::json& d) { d["model_config"]["config"]["layers"][1]["config"].erase("layers"); });
    CHECK(contains(m, block + ": field \"layers\" is missing"));
    restore();
    m = load_edited(dir, [](nlohmann::json& d) { d["model_config"]["config"]["layers"][1]["config"]["layers"][0] = "LayerNormalization"; });
    CHECK(contains(m, block + ": field \"layers[0]\" is \"LayerNormalization\" (expected {\"class_name\", \"config\"})"));
    restore();
    m = load_edited(dir, [](nlohmann::json& d) { d["model_config"]["config"]["layers"][1]["config"]["layers"][0].erase("config"); });
    CHECK(contains(m, block + ": field \"layers[0].config\" is missing"));
    restore();
    m = load_edited(dir, [](nlohmann::json& d) { d["model_config"]["config"]["layers"][1]["config"]["layers"][0]["class_name"] = 7; });
    CHECK(contains(m, block + ": field \"layers[0].class_name\" is 7 (expected a string)"));
    restore();
    m = load_edited(dir, [](nlohmann::json& d) { d["model_config"]["config"]["layers"][1]["config"]["layers"] = nlohmann::json::array(); });
    CHECK(contains(m, block + ": Residual: no layers"));
    restore();
    // Two layers of one name in a block: their variables would collide.
    m = load_edited(dir, [](nlohmann::json& d) {
      auto& inner = d["model_config"]["config"]["layers"][2]["config"]["layers"];
      inner[3]["config"]["name"] = inner[1]["config"]["name"];
    });
    CHECK(contains(m, "(Residual): Residual: two layers named 'dense_0'"));
    restore();
    // The block's output no longer has its input's shape.
    m = load_edited(dir, [](nlohmann::json& d) {
      d["model_config"]["config"]["layers"][2]["config"]["layers"][3]["config"]["units"] = 9;
    });
    CHECK(contains(m, file + ": model_config.config.layers[2].config (Residual): Sequential::add: layer 2: Residual "
                             "'feed_forward': its layers map [-1, -1, 8] to [-1, -1, 9] (expected the input's shape"));
  }
  SUBCASE("blocks nested beyond the bound") {
    const std::string m = load_edited(dir, [](nlohmann::json& d) {
      nlohmann::json inner = d["model_config"]["config"]["layers"][1];
      for (int i = 0; i < nn::LayerConfig::max_nesting + 2; ++i) {
        nlohmann::json outer = {{"class_name", "Residual"},
                                {"config", {{"name", "r" + std::to_string(i)}, {"layers", nlohmann::json::array({inner})}}}};
        inner = std::move(outer);
      }
      d["model_config"]["config"]["layers"][1] = inner;
    });
    CHECK(contains(m, "field \"layers\" nests layers 33 deep (at most 32)"));
    CHECK(contains(m, file));
  }
}

}  // namespace TROUPE_TEST_FILE
