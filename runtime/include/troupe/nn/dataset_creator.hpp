#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace troupe::nn {

/// The input of Model::fit under ParameterServerStrategy (tf.keras.utils.experimental
/// .DatasetCreator): every worker makes its own dataset by calling the dataset function registered
/// under this name in its FunctionRegistry (FunctionRegistry::add_dataset), since a C++ closure
/// cannot travel. The dataset yields batches {features, targets}; it should repeat(), since fit
/// takes steps_per_epoch batches per epoch from each worker's iterator, continued across epochs.
struct DatasetCreator {
  /// An empty name is std::invalid_argument.
  explicit DatasetCreator(std::string dataset_function) : dataset_function(std::move(dataset_function)) {
    if (this->dataset_function.empty()) {
      throw std::invalid_argument("DatasetCreator: the dataset function's name is empty (expected the name the "
                                  "workers registered with FunctionRegistry::add_dataset)");
    }
  }
  /// The name the workers' registries know the dataset function by.
  std::string dataset_function;
};

}  // namespace troupe::nn
