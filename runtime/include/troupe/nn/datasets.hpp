#pragma once

#include <cstdint>

#include "troupe/tensor.hpp"

namespace troupe::nn {

/// A labelled classification set held in memory.
struct ClassificationData {
  Tensor features;  ///< float32 [samples, features]
  Tensor labels;    ///< int64 [samples], 0..classes-1
};

/// How make_blobs draws its set.
/// The defaults are mlp_classifier's generated set: classes overlap enough that a linear model
/// stays below 90% training accuracy while a 2-hidden-layer MLP passes 97% in two epochs.
struct BlobOptions {
  std::int64_t samples = 16384;
  int features = 32;
  int classes = 4;
  /// Gaussian clusters per class: with more than one, no linear model separates the classes.
  int clusters_per_class = 2;
  /// Cluster centres are uniform in [-center_range, center_range] per feature.
  float center_range = 1.25f;
  /// Standard deviation of every feature around its cluster's centre.
  float stddev = 1.0f;
  std::uint64_t seed = 42;
};

/// A generated set of Gaussian clusters (like scikit-learn's make_blobs): sample i has class
/// i % classes (so the classes are balanced) and a cluster of that class drawn at random. The
/// same options give the same bits everywhere (std::mt19937_64 and Box-Muller, no library
/// distributions). Bad options throw std::invalid_argument.
ClassificationData make_blobs(const BlobOptions& options = {});

}  // namespace troupe::nn
