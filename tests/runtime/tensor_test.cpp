#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "troupe/tensor.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using troupe::testing::contains;
using troupe::testing::message_of;

TEST_CASE("from_vector keeps values, shape and dtype") {
  Tensor t = Tensor::from_vector<int>({1, 2, 3, 4}, {2, 2});
  CHECK(t.dtype() == DType::i32);
  CHECK(t.shape() == Shape{2, 2});
  CHECK(t.rank() == 2);
  CHECK(t.num_elements() == 4);
  CHECK(t.nbytes() == 16);
  CHECK(t.to_vector<int>() == std::vector<int>{1, 2, 3, 4});
  CHECK(t.to_string() == "[[1, 2], [3, 4]]");
  CHECK(t.device().to_string() == "CPU:0");
}

TEST_CASE("every dtype maps from its C++ type") {
  CHECK(Tensor::scalar<float>(1.5f).dtype() == DType::f32);
  CHECK(Tensor::scalar<double>(1.5).dtype() == DType::f64);
  CHECK(Tensor::scalar<std::int32_t>(1).dtype() == DType::i32);
  CHECK(Tensor::scalar<std::int64_t>(1).dtype() == DType::i64);
  CHECK(Tensor::scalar<long long>(1).dtype() == DType::i64);
  CHECK(dtype_name(DType::f64) == "float64");
  CHECK(dtype_size(DType::i64) == 8);
}

TEST_CASE("from_vector with a wrong element count names both") {
  auto msg = message_of([] { Tensor::from_vector<float>({1, 2, 3}, {2, 2}); });
  CHECK(msg.find("3 values") != std::string::npos);
  CHECK(msg.find("[2, 2]") != std::string::npos);
  CHECK_THROWS_AS(Tensor::from_vector<float>({1, 2, 3}, {2, 2}), std::invalid_argument);
}

TEST_CASE("zeros, full and range") {
  CHECK(Tensor::zeros({3}, DType::f64).to_vector<double>() == std::vector<double>{0, 0, 0});
  CHECK(Tensor::full({2}, 7, DType::i32).to_vector<int>() == std::vector<int>{7, 7});
  CHECK(Tensor::range(4).to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2, 3});
  CHECK(Tensor::range(3, DType::f32).to_string() == "[0.0, 1.0, 2.0]");
  CHECK(Tensor::range(0).num_elements() == 0);
  CHECK(Tensor::range(0).to_string() == "[]");
  CHECK_THROWS_AS(Tensor::range(-1), std::invalid_argument);
}

TEST_CASE("a shape whose element count overflows 64 bits is refused wherever a tensor is made") {
  const std::int64_t big = std::int64_t{1} << 40;
  const std::string overflow =
      "shape [1099511627776, 1099511627776] has too many elements (its product overflows 64 bits; at most "
      "9223372036854775807)";
  CHECK(message_of([&] { Tensor::zeros({big, big}); }) == overflow);
  CHECK(message_of([&] { Tensor::empty({big, big}, DType::i32); }) == overflow);
  CHECK(message_of([&] { Tensor::full({big, big}, 1); }) == overflow);
  CHECK_THROWS_AS(Tensor::zeros({big, big}), std::invalid_argument);
  CHECK(message_of([&] { shape_num_elements({big, big}); }) == overflow);
  // 2^64 + 4 wrapped to 4 elements before.
  const std::int64_t wraps = (std::int64_t{1} << 62) + 1;
  CHECK(message_of([&] { Tensor::zeros({wraps, 4}); }) ==
        "shape [4611686018427387905, 4] has too many elements (its product overflows 64 bits; at most "
        "9223372036854775807)");
  const std::vector<float> four{1, 2, 3, 4};
  CHECK(message_of([&] { Tensor::from_vector<float>(four, {wraps, 4}); }) ==
        "shape [4611686018427387905, 4] has too many elements (its product overflows 64 bits; at most "
        "9223372036854775807)");
}

TEST_CASE("an element count that fits but whose bytes do not is refused with the dtype named") {
  const std::int64_t n = std::int64_t{1} << 62;
  CHECK(message_of([&] { Tensor::zeros({n}, DType::f64); }) ==
        "Tensor of shape [4611686018427387904] and dtype float64: 4611686018427387904 elements need more bytes "
        "than an address space holds");
  // 2^61 float32 elements are 2^63 bytes: one more than ptrdiff_t holds.
  CHECK_THROWS_AS(Tensor::zeros({std::int64_t{1} << 61}, DType::f32), std::invalid_argument);
}

TEST_CASE("a shape with a zero dimension is empty however large the others are") {
  const std::int64_t big = std::int64_t{1} << 40;
  CHECK(shape_num_elements({big, big, 0}) == 0);
  Tensor t = Tensor::zeros({0, big, big});
  CHECK(t.num_elements() == 0);
  CHECK(t.nbytes() == 0);
  CHECK(t.reshape({big, 0, big}).num_elements() == 0);
}

TEST_CASE("reshape refuses a target shape whose element count overflows") {
  const std::int64_t big = std::int64_t{1} << 40;
  Tensor t = Tensor::range(4, DType::i32);
  CHECK(message_of([&] { t.reshape({big, big}); }) ==
        "reshape: shape [1099511627776, 1099511627776] has too many elements (its product overflows 64 bits)");
  CHECK(message_of([&] { t.reshape({(std::int64_t{1} << 62) + 1, 4}); }) ==
        "reshape: shape [4611686018427387905, 4] has too many elements (its product overflows 64 bits)");
  CHECK(message_of([&] { t.reshape({big, big, -1}); }) ==
        "reshape: shape [1099511627776, 1099511627776, -1] has too many elements (its product overflows 64 bits)");
}

TEST_CASE("reshape shares storage and checks the element count") {
  Tensor t = Tensor::range(6, DType::i32);
  Tensor r = t.reshape({1, 2, 3});
  CHECK(r.shape() == Shape{1, 2, 3});
  CHECK(r.shares_storage_with(t));
  CHECK(t.reshape({3, -1}).shape() == Shape{3, 2});
  auto msg = message_of([&] { t.reshape({4, 2}); });
  CHECK(msg.find("[6]") != std::string::npos);
  CHECK(msg.find("[4, 2]") != std::string::npos);
  CHECK_THROWS_AS(t.reshape({4, 2}), std::invalid_argument);
  CHECK_THROWS_AS(t.reshape({4, -1}), std::invalid_argument);
}

TEST_CASE("to_vector, data and item check the dtype") {
  Tensor t = Tensor::from_vector<float>({1, 2});
  CHECK_THROWS_AS(t.to_vector<int>(), std::invalid_argument);
  CHECK_THROWS_AS(t.item<float>(), std::invalid_argument);
  CHECK(Tensor::scalar<int>(5).item<int>() == 5);
  CHECK(message_of([&] { t.to_vector<double>(); }).find("float32") != std::string::npos);
}

TEST_CASE("to_string prints floats with a decimal point and nests by shape") {
  CHECK(Tensor::scalar<float>(6.0f).to_string() == "6.0");
  CHECK(Tensor::scalar<double>(2.5).to_string() == "2.5");
  CHECK(Tensor::scalar<int>(-3).to_string() == "-3");
  CHECK(Tensor::from_vector<float>({0.1f}).to_string() == "[0.1]");
  CHECK(Tensor::range(6, DType::i64).reshape({1, 2, 3}).to_string() == "[[[0, 1, 2], [3, 4, 5]]]");
  CHECK(Tensor::zeros({2, 0}).to_string() == "[[], []]");
}

TEST_CASE("elementwise operators work for every dtype") {
  CHECK((Tensor::from_vector<float>({1, 2}) + Tensor::from_vector<float>({3, 4})).to_vector<float>() ==
        std::vector<float>{4, 6});
  CHECK((Tensor::from_vector<double>({5, 2}) - Tensor::from_vector<double>({3, 4})).to_vector<double>() ==
        std::vector<double>{2, -2});
  CHECK((Tensor::from_vector<int>({1, 2}) * Tensor::from_vector<int>({3, 4})).to_vector<int>() ==
        std::vector<int>{3, 8});
  CHECK((Tensor::from_vector<std::int64_t>({7, -7}) / Tensor::from_vector<std::int64_t>({2, 2}))
            .to_vector<std::int64_t>() == std::vector<std::int64_t>{3, -3});
  CHECK((Tensor::scalar<float>(3.0f) * 2.0f).item<float>() == 6.0f);
  CHECK((Tensor::scalar<int>(4) * 2).item<int>() == 8);
  CHECK((Tensor::scalar<float>(3.0f) * 2).item<float>() == 6.0f);
  CHECK((10 - Tensor::scalar<int>(4)).item<int>() == 6);
  CHECK((1.0 / Tensor::scalar<double>(4.0)).item<double>() == 0.25);
  CHECK((-Tensor::scalar<int>(4)).item<int>() == -4);
  CHECK((Tensor::scalar<int>(4) * 2.0).item<int>() == 8);
}

TEST_CASE("elementwise mismatches and lossy scalars are clear errors") {
  auto msg = message_of([] { Tensor::zeros({4, 2}) + Tensor::zeros({4}); });
  CHECK(msg.find("[4, 2]") != std::string::npos);
  CHECK(msg.find("[4]") != std::string::npos);
  CHECK_THROWS_AS(Tensor::zeros({2}) * Tensor::zeros({2}, DType::f64), std::invalid_argument);
  CHECK_THROWS_AS(Tensor::scalar<int>(1) * 2.5, std::invalid_argument);
  CHECK_THROWS_AS(Tensor::scalar<int>(1) / 0, std::invalid_argument);
  CHECK_THROWS_AS(Tensor::scalar<int>(1) / Tensor::scalar<int>(0), std::invalid_argument);
}

TEST_CASE("operations never change their operands") {
  Tensor a = Tensor::from_vector<float>({1, 2});
  Tensor b = a * 3.0f;
  CHECK(a.to_vector<float>() == std::vector<float>{1, 2});
  CHECK(!b.shares_storage_with(a));
}

TEST_CASE("concat and reduce_sum along an axis") {
  Tensor a = Tensor::range(6, DType::i32).reshape({2, 3});
  CHECK(concat({a, a}, 0).shape() == Shape{4, 3});
  CHECK(concat({a, a}, 1).to_string() == "[[0, 1, 2, 0, 1, 2], [3, 4, 5, 3, 4, 5]]");
  CHECK(reduce_sum(a, 0).to_vector<int>() == std::vector<int>{3, 5, 7});
  CHECK(reduce_sum(a, 1).to_vector<int>() == std::vector<int>{3, 12});
  CHECK(reduce_sum(a, -1).to_vector<int>() == std::vector<int>{3, 12});
  CHECK_THROWS_AS(reduce_sum(a, 2), std::invalid_argument);
  CHECK_THROWS_AS(concat({a, Tensor::zeros({2, 2}, DType::i32)}, 0), std::invalid_argument);
  CHECK(message_of([&] { reduce_sum(a, 3); }).find("axis 3 out of range for rank-2 tensor") != std::string::npos);
}

TEST_CASE("cast converts every element") {
  CHECK(Tensor::from_vector<float>({1.5f, -2.5f}).cast(DType::i32).to_vector<int>() == std::vector<int>{1, -2});
  CHECK(Tensor::range(3).cast(DType::f64).to_vector<double>() == std::vector<double>{0, 1, 2});
}

TEST_CASE("equals compares dtype, shape and bytes") {
  CHECK(Tensor::range(3).equals(Tensor::range(3)));
  CHECK(!Tensor::range(3).equals(Tensor::range(3, DType::i32)));
  CHECK(!Tensor::range(4).equals(Tensor::range(4).reshape({2, 2})));
}

TEST_CASE("slice shares rows of the storage and checks its bounds") {
  Tensor t = Tensor::range(12, DType::i32).reshape({4, 3});
  Tensor mid = t.slice(1, 3);
  CHECK(mid.shape() == Shape{2, 3});
  CHECK(mid.shares_storage_with(t));
  CHECK(mid.to_vector<int>() == std::vector<int>{3, 4, 5, 6, 7, 8});
  CHECK(mid.slice(1, 2).to_vector<int>() == std::vector<int>{6, 7, 8});
  CHECK(mid.reshape({6}).to_vector<int>()[0] == 3);
  CHECK(t.slice(4, 4).num_elements() == 0);
  CHECK((mid * 2).to_vector<int>()[0] == 6);
  CHECK_THROWS_AS(t.slice(3, 5), std::out_of_range);
  CHECK_THROWS_AS(t.slice(2, 1), std::out_of_range);
  CHECK_THROWS_AS(Tensor::scalar<int>(1).slice(0, 1), std::out_of_range);
}

TEST_CASE("stack adds a leading axis") {
  Tensor s = stack({Tensor::scalar<std::int64_t>(1), Tensor::scalar<std::int64_t>(2)});
  CHECK(s.shape() == Shape{2});
  CHECK(s.to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 2});
  Tensor m = stack({Tensor::range(3, DType::f32), Tensor::range(3, DType::f32)});
  CHECK(m.shape() == Shape{2, 3});
  CHECK_THROWS_AS(stack({Tensor::range(3), Tensor::range(2)}), std::invalid_argument);
}

TEST_CASE("a tensor on a GPU the machine does not have is a clear error") {
  // One past the machine's GPUs, whatever their number (GPU:0 on a machine without any).
  const int n = Runtime::gpu_count();
  const Device gpu(Device::Type::gpu, n);
  const std::string name = "GPU:" + std::to_string(n);
  std::string msg = message_of([&] { (void)Tensor::zeros({2}, DType::f32, gpu); });
  CHECK(contains(msg, name));
  if (n == 0) {
    CHECK((contains(msg, "this machine has no GPU") || contains(msg, "built without CUDA")));
  } else {
    CHECK(contains(msg, "only " + std::to_string(n) + " GPU(s) exist"));
  }
  CHECK(contains(message_of([&] { (void)Tensor::from_vector<float>({1.0f}).to(gpu); }), name));
  CHECK_FALSE(Tensor::from_vector<float>({1.0f}).is_gpu());
}

TEST_CASE("a tensor too large for memory is a std::bad_alloc naming its shape, dtype and bytes") {
  try {
    troupe::Tensor t = troupe::Tensor::empty(troupe::Shape{1 << 20, 1 << 20}, troupe::DType::f32);
    FAIL("a 4 TiB tensor was allocated");
  } catch (const std::bad_alloc& e) {
    const std::string what = e.what();
    CHECK(what.find("Tensor of shape [1048576, 1048576] and dtype float32") == 0);
    CHECK(what.find("cannot allocate 4398046511104 bytes (out of memory") != std::string::npos);
  }
}

}  // namespace TROUPE_TEST_FILE
