#include "troupe/nn/layer.hpp"

#include <stdexcept>

#include <nlohmann/json.hpp>

#include "tape.hpp"

namespace troupe::nn {

Layer::~Layer() = default;

Tensor Layer::forward(const Tensor& x, const CallContext& ctx) const {
  namespace tape = troupe::detail;
  if (!built()) build(x.shape());
  if (!tape::tape_active() || records_itself()) return call(x, ctx);
  // The input and the variables' values as read now (watched reads while a tape records).
  std::vector<Tensor> inputs{x};
  for (auto& [name, variable] : weights()) inputs.push_back(variable.value());
  if (!tape::recording(inputs)) return call(x, ctx);
  Tensor out;
  {
    // The layer is one node: what call() does inside is not recorded.
    tape::PauseRecording pause;
    out = call(tape::untaped(x), ctx);
  }
  tape::record(out, inputs,
               [this, px = tape::untaped(x), po = tape::untaped(out), ctx](const Tensor& g) -> std::vector<Tensor> {
                 LayerGradients d = gradients(px, po, g, ctx, true);
                 std::vector<Tensor> grads;
                 grads.reserve(d.variables.size() + 1);
                 grads.push_back(std::move(d.input));  // empty for ids: no gradient
                 for (Tensor& v : d.variables) grads.push_back(std::move(v));
                 return grads;
               });
  return out;
}

std::vector<Variable> Layer::trainable_variables() const {
  std::vector<Variable> out;
  for (auto& [name, variable] : weights()) out.push_back(variable);
  return out;
}

std::int64_t Layer::count_params() const {
  std::int64_t n = 0;
  for (auto& [name, variable] : weights()) n += variable.value().num_elements();
  for (auto& [name, variable] : non_trainable_weights()) n += variable.value().num_elements();
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

Padding padding_from_name(const std::string& name, const char* who) {
  if (name == "valid") return Padding::valid;
  if (name == "same") return Padding::same;
  throw std::invalid_argument(std::string(who) + ": padding \"" + name + "\" (expected \"valid\" or \"same\")");
}

const char* padding_name(Padding padding) {
  switch (padding) {
    case Padding::valid: return "valid";
    case Padding::same: return "same";
  }
  return "?";
}

}  // namespace troupe::nn
