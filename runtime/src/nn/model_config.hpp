#pragma once

// Private to runtime/src/nn: a model's architecture, loss and metrics as JSON text, and the model
// rebuilt from it (saving.cpp, in model.json's words). What the chief sends a worker under
// ParameterServerStrategy's fit, so that the worker trains the same model.

#include <memory>
#include <string>

#include "troupe/nn/model.hpp"
#include "troupe/nn/optimizers.hpp"

namespace troupe::nn::detail {

/// {"model_config": <as model.json>, "loss": {...}, "metrics": [...]}; the layers must be built.
std::string training_config(const Model& model);
/// The model of training_config's text, rebuilt in the current scope by troupe's layer factories,
/// built and compiled with `optimizer`. A problem is SavedModelError naming `where` and the field.
Model model_from_training_config(const std::string& text, std::shared_ptr<Optimizer> optimizer,
                                 const std::string& where);

}  // namespace troupe::nn::detail
