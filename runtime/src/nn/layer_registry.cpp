#include "nn/layer_registry.hpp"

#include <memory>
#include <optional>
#include <string>

#include "troupe/nn/activation.hpp"
#include "troupe/nn/attention.hpp"
#include "troupe/nn/batch_normalization.hpp"
#include "troupe/nn/conv.hpp"
#include "troupe/nn/dense.hpp"
#include "troupe/nn/dropout.hpp"
#include "troupe/nn/embedding.hpp"
#include "troupe/nn/flatten.hpp"
#include "troupe/nn/mixed_precision.hpp"
#include "troupe/nn/normalization.hpp"
#include "troupe/nn/pooling.hpp"
#include "troupe/nn/position_embedding.hpp"
#include "troupe/nn/residual.hpp"

// How a layer class registers for load_model: a function that makes the layer from a LayerConfig
// (the fields its config_json() writes, read with LayerConfig's getters, which name the file and
// the field when one is missing or ill-typed), and one line in the table at the end of this file:
//
//     {"Conv2D", conv2d_from_config},
//
// The name is the layer's class_name(). Nothing else knows the layers: a model saved with a class
// that has no line here (and no LoadOptions::custom_objects entry) is a SavedModelError naming it.

namespace troupe::nn::detail {

namespace {

Activation activation_of(const LayerConfig& config) {
  const std::string name = config.get_string("activation");
  for (Activation a : {Activation::none, Activation::relu}) {
    if (name == activation_name(a)) return a;
  }
  throw config.error("activation", "\"" + name + "\" (expected \"none\" or \"relu\")");
}

Padding padding_of(const LayerConfig& config) {
  const std::string name = config.get_string("padding");
  if (name == "valid") return Padding::valid;
  if (name == "same") return Padding::same;
  throw config.error("padding", "\"" + name + "\" (expected \"valid\" or \"same\")");
}

// Dense computes under the mixed-precision policy current at its construction, saved as "dtype".
std::shared_ptr<Layer> dense_from_config(const LayerConfig& config) {
  const mixed_precision::Policy saved_policy = [&] {
    if (!config.has("dtype")) return mixed_precision::Policy("float32");
    try {
      return mixed_precision::Policy(config.get_string("dtype"));
    } catch (const std::invalid_argument& e) {
      throw config.error("dtype", e.what());
    }
  }();
  const mixed_precision::Policy before = mixed_precision::global_policy();
  mixed_precision::set_global_policy(saved_policy);
  try {
    auto layer = std::make_shared<Dense>(config.get_int("input_dim"), config.get_int("units"), activation_of(config),
                                         config.get_uint64("seed"), config.name());
    mixed_precision::set_global_policy(before);
    return layer;
  } catch (...) {
    mixed_precision::set_global_policy(before);
    throw;
  }
}

std::shared_ptr<Layer> conv2d_from_config(const LayerConfig& config) {
  return std::make_shared<Conv2D>(config.get_int("filters"), config.get_size2("kernel_size"),
                                  config.get_size2("strides"), padding_of(config), activation_of(config),
                                  config.get_uint64("seed"), config.name(), config.get_dtype("dtype"));
}

std::shared_ptr<Layer> max_pooling2d_from_config(const LayerConfig& config) {
  return std::make_shared<MaxPooling2D>(config.get_size2("pool_size"), config.get_size2("strides"),
                                        padding_of(config), config.name());
}

std::shared_ptr<Layer> average_pooling2d_from_config(const LayerConfig& config) {
  return std::make_shared<AveragePooling2D>(config.get_size2("pool_size"), config.get_size2("strides"),
                                            padding_of(config), config.name());
}

std::shared_ptr<Layer> flatten_from_config(const LayerConfig& config) {
  return std::make_shared<Flatten>(config.name());
}

std::shared_ptr<Layer> embedding_from_config(const LayerConfig& config) {
  return std::make_shared<Embedding>(config.get_int("input_dim"), config.get_int("output_dim"),
                                     config.get_uint64("seed"), config.name(), config.get_dtype("dtype"));
}

std::shared_ptr<Layer> dropout_from_config(const LayerConfig& config) {
  return std::make_shared<Dropout>(config.get_double("rate"), config.get_uint64("seed"), config.name());
}

std::shared_ptr<Layer> layer_normalization_from_config(const LayerConfig& config) {
  if (config.has("axis") && config.get_int("axis") != -1) {
    throw config.error("axis", std::to_string(config.get_int("axis")) + " (expected -1: the last axis)");
  }
  return std::make_shared<LayerNormalization>(config.get_double("epsilon"), config.name(), config.get_dtype("dtype"));
}

// BatchNormalization and SyncBatchNormalization: the same fields ("synchronized" tells them apart
// in the config; the class name decides).
template <class Norm>
std::shared_ptr<Layer> batch_normalization_from_config(const LayerConfig& config) {
  if (config.has("axis") && config.get_int("axis") != -1) {
    throw config.error("axis", std::to_string(config.get_int("axis")) + " (expected -1: the last axis)");
  }
  return std::make_shared<Norm>(config.get_double("momentum"), config.get_double("epsilon"), config.get_bool("center"),
                                config.get_bool("scale"), config.name(), config.get_dtype("dtype"));
}

std::shared_ptr<Layer> activation_from_config(const LayerConfig& config) {
  try {
    return std::make_shared<ActivationLayer>(config.get_string("activation"), config.name());
  } catch (const std::invalid_argument& e) {
    throw config.error("activation", e.what());
  }
}

std::shared_ptr<Layer> multi_head_attention_from_config(const LayerConfig& config) {
  if (config.has("use_bias") && !config.get_bool("use_bias")) throw config.error("use_bias", "false (expected true)");
  const double dropout = config.has("dropout") ? config.get_double("dropout") : 0.0;
  if (!(dropout >= 0.0 && dropout < 1.0)) {
    throw config.error("dropout", "is " + std::to_string(dropout) + " (expected 0 <= dropout < 1)");
  }
  return std::make_shared<MultiHeadAttention>(config.get_int("num_heads"), config.get_int("key_dim"),
                                              config.get_bool("use_causal_mask"), config.get_uint64("seed"),
                                              config.name(), config.get_int("value_dim"), config.get_dtype("dtype"),
                                              dropout);
}

std::shared_ptr<Layer> token_and_position_embedding_from_config(const LayerConfig& config) {
  return std::make_shared<TokenAndPositionEmbedding>(config.get_int("vocabulary_size"), config.get_int("sequence_length"),
                                                     config.get_int("embedding_dim"), config.get_uint64("seed"),
                                                     config.name(), config.get_dtype("dtype"));
}

// A container: its layers are configs of their own, made by the same factories.
std::shared_ptr<Layer> residual_from_config(const LayerConfig& config) {
  return std::make_shared<Residual>(config.get_layers("layers"), config.name());
}

}  // namespace

const std::map<std::string, LayerFactory>& layer_factories() {
  static const std::map<std::string, LayerFactory> table{
      {"Activation", activation_from_config},
      {"AveragePooling2D", average_pooling2d_from_config},
      {"BatchNormalization", batch_normalization_from_config<BatchNormalization>},
      {"Conv2D", conv2d_from_config},
      {"Dense", dense_from_config},
      {"Dropout", dropout_from_config},
      {"Embedding", embedding_from_config},
      {"Flatten", flatten_from_config},
      {"LayerNormalization", layer_normalization_from_config},
      {"MaxPooling2D", max_pooling2d_from_config},
      {"MultiHeadAttention", multi_head_attention_from_config},
      {"Residual", residual_from_config},
      {"SyncBatchNormalization", batch_normalization_from_config<SyncBatchNormalization>},
      {"TokenAndPositionEmbedding", token_and_position_embedding_from_config},
  };
  return table;
}

}  // namespace troupe::nn::detail
