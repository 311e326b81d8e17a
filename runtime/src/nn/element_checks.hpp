#pragma once

// What Model's methods check and read of a dataset element {features, targets}.

#include <cstdint>
#include <stdexcept>
#include <string>

#include "troupe/data/dataset.hpp"
#include "troupe/tensor.hpp"

namespace troupe::nn::detail {

/// Throws std::invalid_argument, naming `op`, unless `e` has {features, targets}.
inline void check_element(const data::Element& e, const char* op) {
  if (e.size() < 2) {
    throw std::invalid_argument(std::string(op) + ": a dataset element has " + std::to_string(e.size()) +
                                " component(s) (expected {features, targets})");
  }
}

/// The rows (examples) of an element's features.
inline std::int64_t rows_of(const data::Element& e) { return e[0].rank() > 0 ? e[0].shape()[0] : 0; }

/// A scalar tensor's value as a double.
inline double as_double(const Tensor& scalar) { return scalar.cast(DType::f64).item<double>(); }

}  // namespace troupe::nn::detail
