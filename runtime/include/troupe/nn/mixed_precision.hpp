#pragma once

#include <string>
#include <string_view>

#include "troupe/dtype.hpp"

/// Keras's mixed precision (tf.keras.mixed_precision): layers keep float32 variables and compute
/// in a 16-bit type. A Dense layer takes the global policy current when it is constructed, as a
/// Keras layer does:
///
///     troupe::nn::mixed_precision::set_global_policy("mixed_bfloat16");
///     troupe::nn::Dense hidden(784, 256, troupe::nn::Activation::relu);  // bfloat16 compute
///     troupe::nn::mixed_precision::set_global_policy("float32");
///
/// Under "mixed_float16" Model::compile wraps the optimizer in a LossScaleOptimizer, as Keras
/// does (float16's range is narrow; bfloat16 has float32's and needs none).
namespace troupe::nn::mixed_precision {

/// A dtype policy (tf.keras.mixed_precision.Policy): "float32" (compute and variables in
/// float32), "mixed_float16" (compute in float16, variables in float32) or "mixed_bfloat16"
/// (compute in bfloat16, variables in float32).
class Policy {
 public:
  /// The policy named `name`; another name is std::invalid_argument listing the valid ones.
  explicit Policy(std::string_view name);

  /// "float32", "mixed_float16" or "mixed_bfloat16".
  const std::string& name() const noexcept { return name_; }
  /// The dtype layers compute in: float32, float16 or bfloat16.
  DType compute_dtype() const noexcept { return compute_; }
  /// The dtype of layers' variables: float32 under every policy here.
  DType variable_dtype() const noexcept { return DType::f32; }

  friend bool operator==(const Policy& a, const Policy& b) noexcept { return a.name_ == b.name_; }
  friend bool operator!=(const Policy& a, const Policy& b) noexcept { return a.name_ != b.name_; }

 private:
  std::string name_;
  DType compute_;
};

/// Sets the policy that layers constructed from now on take (tf.keras.mixed_precision.
/// set_global_policy). It is the process's one setting, as in Keras; layers already made keep
/// theirs. Set it before building a model, not while other threads construct layers.
void set_global_policy(const Policy& policy);
/// The same by name; an unknown name is std::invalid_argument listing the valid ones.
void set_global_policy(std::string_view name);
/// The current global policy ("float32" until set).
Policy global_policy();

}  // namespace troupe::nn::mixed_precision
