// The element vocabulary: names, sizes, and the one message for participants that disagree.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/base/elements.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::base;

TEST_CASE("every element type has TensorFlow's name and its size") {
  CHECK(std::string(scalar_name(scalar_type::f32)) == "float32");
  CHECK(std::string(scalar_name(scalar_type::f64)) == "float64");
  CHECK(std::string(scalar_name(scalar_type::i32)) == "int32");
  CHECK(std::string(scalar_name(scalar_type::i64)) == "int64");
  CHECK(scalar_size(scalar_type::f32) == 4);
  CHECK(scalar_size(scalar_type::f64) == 8);
  CHECK(scalar_size(scalar_type::i32) == 4);
  CHECK(scalar_size(scalar_type::i64) == 8);
  CHECK(std::string(reduce_name(reduce_kind::sum)) == "SUM");
  CHECK(std::string(reduce_name(reduce_kind::mean)) == "MEAN");
  CHECK(shape_string({}) == "[]");
  CHECK(shape_string({4, 2}) == "[4, 2]");
}

TEST_CASE("check_agree accepts agreeing tensors and names both sides of a disagreement") {
  const std::vector<std::int64_t> a{4, 2}, b{4, 3}, c{4};
  check_agree("all_reduce", {"replica 0", scalar_type::f32, a}, {"replica 3", scalar_type::f32, a}, -1, "");
  check_agree("all_gather", {"replica 0", scalar_type::f32, a}, {"replica 3", scalar_type::f32, b}, 1, "");
  CHECK_THROWS_WITH_AS(
      check_agree("all_reduce", {"replica 0", scalar_type::f32, a}, {"replica 3", scalar_type::f32, c}, -1, "!"),
      "all_reduce: replica 0 sent float32 tensor of shape [4, 2], replica 3 sent float32 tensor of shape [4]!",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      check_agree("gather", {"replica 0", scalar_type::f32, a}, {"replica 1", scalar_type::i64, a}, 0, "; axis 0"),
      "gather: replica 0 sent float32 tensor of shape [4, 2], replica 1 sent int64 tensor of shape [4, 2]; axis 0",
      std::invalid_argument);
  // Only the free axis may differ.
  CHECK_THROWS_AS(check_agree("g", {"x", scalar_type::f32, a}, {"y", scalar_type::f32, b}, 0, ""), std::invalid_argument);
  CHECK_THROWS_WITH_AS(check_agree("concat", {"part 0", scalar_type::i32, a, "is"}, {"part 2", scalar_type::i32, c, "is"},
                                   0, ""),
                       "concat: part 0 is int32 tensor of shape [4, 2], part 2 is int32 tensor of shape [4]",
                       std::invalid_argument);
}

}  // namespace TROUPE_TEST_FILE
