#pragma once

// Private to runtime/src/nn: the factories that rebuild troupe's layers from their saved configs
// (load_model's table; see layer_registry.cpp for how a layer class registers).

#include <map>
#include <string>

#include "troupe/nn/saving.hpp"

namespace troupe::nn::detail {

/// troupe's layer factories by class_name.
const std::map<std::string, LayerFactory>& layer_factories();

}  // namespace troupe::nn::detail
