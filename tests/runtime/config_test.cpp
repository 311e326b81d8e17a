// troupe::config: the process-wide math settings, with tf.config's names and defaults.

#include <doctest/doctest.h>

#include <thread>

#include "troupe/config.hpp"
#include "troupe/nn/ops.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;

TEST_CASE("config: TensorFloat-32 is allowed by default, as in TensorFlow, and the setting is process-wide") {
  const bool before = config::tensor_float_32_execution_enabled();
  CHECK(before);
  config::enable_tensor_float_32_execution(false);
  bool seen_elsewhere = true;
  std::thread([&] { seen_elsewhere = config::tensor_float_32_execution_enabled(); }).join();
  CHECK_FALSE(seen_elsewhere);
  CHECK_FALSE(config::tensor_float_32_execution_enabled());
  config::enable_tensor_float_32_execution(true);
  CHECK(config::tensor_float_32_execution_enabled());
  config::enable_tensor_float_32_execution(before);
}

TEST_CASE("config: CPU products are exact float32 whatever the TensorFloat-32 setting") {
  // 1 + 2^-20 is not a TF32 number (10-bit mantissa): a TF32 product would round it to 1.
  const float x = 1.0f + 1.0f / 1048576.0f;
  const Tensor a = Tensor::from_vector<float>({x}, {1, 1});
  const Tensor b = Tensor::from_vector<float>({1.0f}, {1, 1});
  const bool before = config::tensor_float_32_execution_enabled();
  for (bool tf32 : {true, false}) {
    config::enable_tensor_float_32_execution(tf32);
    CHECK(nn::matmul(a, b).data<float>()[0] == x);
  }
  config::enable_tensor_float_32_execution(before);
}

}  // namespace TROUPE_TEST_FILE
