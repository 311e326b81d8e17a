#include "troupe/nn/datasets.hpp"

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::nn {

namespace {

// Uniform in [0, 1) from the top 53 bits: mt19937_64's output is fixed by the standard, the
// library distributions' are not.
double unit(std::mt19937_64& engine) { return static_cast<double>(engine() >> 11) * 0x1.0p-53; }

constexpr double kPi = 3.14159265358979323846;

}  // namespace

ClassificationData make_blobs(const BlobOptions& o) {
  if (o.samples < 0 || o.features <= 0 || o.classes <= 0 || o.clusters_per_class <= 0 || !(o.stddev >= 0.0f) ||
      !(o.center_range >= 0.0f)) {
    throw std::invalid_argument("make_blobs: samples " + std::to_string(o.samples) + ", features " +
                                std::to_string(o.features) + ", classes " + std::to_string(o.classes) +
                                ", clusters_per_class " + std::to_string(o.clusters_per_class) + ", stddev " +
                                std::to_string(o.stddev) +
                                " (expected samples >= 0, positive counts and a non-negative stddev and range)");
  }
  std::mt19937_64 engine(o.seed);
  const int clusters = o.classes * o.clusters_per_class;
  std::vector<double> centers(static_cast<std::size_t>(clusters) * static_cast<std::size_t>(o.features));
  for (double& c : centers) c = (2.0 * unit(engine) - 1.0) * o.center_range;

  Tensor features = Tensor::empty({o.samples, o.features}, DType::f32);
  Tensor labels = Tensor::empty({o.samples}, DType::i64);
  float* x = features.mutable_data<float>();
  std::int64_t* y = labels.mutable_data<std::int64_t>();
  for (std::int64_t i = 0; i < o.samples; ++i) {
    const int label = static_cast<int>(i % o.classes);
    const int which = static_cast<int>(unit(engine) * o.clusters_per_class);
    const double* center = &centers[static_cast<std::size_t>(label * o.clusters_per_class + which) *
                                    static_cast<std::size_t>(o.features)];
    for (int f = 0; f < o.features; ++f) {
      // Box-Muller; 1 - unit is in (0, 1], so the log is finite.
      const double r = std::sqrt(-2.0 * std::log(1.0 - unit(engine)));
      const double normal = r * std::cos(2.0 * kPi * unit(engine));
      x[i * o.features + f] = static_cast<float>(center[f] + o.stddev * normal);
    }
    y[i] = label;
  }
  return {features, labels};
}

}  // namespace troupe::nn
