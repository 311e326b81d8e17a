#include "troupe/nn/layer.hpp"

#include <nlohmann/json.hpp>

namespace troupe::nn {

Layer::~Layer() = default;

std::vector<Variable> Layer::trainable_variables() const {
  std::vector<Variable> out;
  for (auto& [name, variable] : weights()) out.push_back(variable);
  return out;
}

std::int64_t Layer::count_params() const {
  std::int64_t n = 0;
  for (auto& [name, variable] : weights()) n += variable.value().num_elements();
  return n;
}

std::string Layer::config() const {
  nlohmann::json config = nlohmann::json::parse(config_json());
  config["name"] = name_;
  return nlohmann::json{{"class_name", class_name()}, {"config", std::move(config)}}.dump();
}

std::string Layer::who() const {
  return name_.empty() ? std::string(class_name()) : std::string(class_name()) + " '" + name_ + "'";
}

const char* padding_name(Padding padding) {
  switch (padding) {
    case Padding::valid: return "valid";
    case Padding::same: return "same";
  }
  return "?";
}

}  // namespace troupe::nn
