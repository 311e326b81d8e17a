#include "troupe/kernels/half_kernels.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "troupe/kernels/reduce_kernels.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::kernels;

namespace {

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::uint32_t to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

bool f16_is_nan(std::uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0; }
bool bf16_is_nan(std::uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x007fu) != 0; }

}  // namespace

TEST_CASE("float16 conversion gives the known bits of exact and rounded values") {
  CHECK(float_to_f16(1.0f) == 0x3c00);
  CHECK(float_to_f16(-2.0f) == 0xc000);
  CHECK(float_to_f16(0.0f) == 0x0000);
  CHECK(float_to_f16(-0.0f) == 0x8000);
  CHECK(float_to_f16(0.1f) == 0x2e66);
  CHECK(float_to_f16(1.0f / 3.0f) == 0x3555);
  CHECK(float_to_f16(65504.0f) == 0x7bff);        // the largest finite f16
  CHECK(float_to_f16(0x1p-14f) == 0x0400);        // the smallest normal
  CHECK(f16_to_float(0x3555) == 0.333251953125f);
  CHECK(f16_to_float(0x7bff) == 65504.0f);
  CHECK(f16_to_float(0xc000) == -2.0f);
  CHECK(f16_to_float(0x2e66) == 0.0999755859375f);
}

TEST_CASE("float16 conversion rounds ties to even") {
  // 1 + 2^-11 lies halfway between 1 (even) and 1 + 2^-10 (odd): down.
  CHECK(float_to_f16(1.0f + 0x1p-11f) == 0x3c00);
  // 1 + 3*2^-11 lies halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even): up.
  CHECK(float_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02);
  // Just past a tie rounds up, just before it down.
  CHECK(float_to_f16(std::nextafter(1.0f + 0x1p-11f, 2.0f)) == 0x3c01);
  CHECK(float_to_f16(std::nextafter(1.0f + 3 * 0x1p-11f, 0.0f)) == 0x3c01);
  // A carry out of the mantissa moves into the exponent: 2 - 2^-12 rounds to 2.
  CHECK(float_to_f16(2.0f - 0x1p-12f) == 0x4000);
}

TEST_CASE("float16 conversion overflows to infinity and keeps NaN and infinities") {
  CHECK(float_to_f16(65519.996f) == 0x7bff);      // below the halfway point to 65536
  CHECK(float_to_f16(65520.0f) == 0x7c00);        // the tie goes to the even "65536": infinity
  CHECK(float_to_f16(-1e6f) == 0xfc00);
  CHECK(float_to_f16(std::numeric_limits<float>::max()) == 0x7c00);
  CHECK(float_to_f16(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(float_to_f16(-std::numeric_limits<float>::infinity()) == 0xfc00);
  CHECK(f16_is_nan(float_to_f16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(f16_is_nan(float_to_f16(from_bits(0x7f800001u))));   // a signalling NaN whose payload is all low bits
  CHECK(float_to_f16(from_bits(0xffc00000u)) == 0xfe00);     // sign kept, quiet
  CHECK(std::isinf(f16_to_float(0x7c00)));
  CHECK(std::isnan(f16_to_float(0x7e00)));
  CHECK(std::signbit(f16_to_float(0xfc00)));
}

TEST_CASE("float16 conversion makes denormals and rounds them to nearest even") {
  CHECK(float_to_f16(0x1p-24f) == 0x0001);        // the smallest denormal
  CHECK(float_to_f16(1023 * 0x1p-24f) == 0x03ff);  // the largest denormal
  CHECK(float_to_f16(0x1p-25f) == 0x0000);        // halfway between 0 (even) and 2^-24: 0
  CHECK(float_to_f16(std::nextafter(0x1p-25f, 1.0f)) == 0x0001);
  CHECK(float_to_f16(3 * 0x1p-25f) == 0x0002);    // halfway between 1 and 2 (even)
  CHECK(float_to_f16(5 * 0x1p-25f) == 0x0002);    // halfway between 2 (even) and 3
  CHECK(float_to_f16(-3 * 0x1p-25f) == 0x8002);
  CHECK(float_to_f16(0x1p-14f - 0x1p-26f) == 0x0400);  // rounds up into the smallest normal
  CHECK(float_to_f16(1e-40f) == 0x0000);          // a float32 denormal
  CHECK(float_to_f16(-1e-40f) == 0x8000);
  CHECK(f16_to_float(0x0001) == 0x1p-24f);
  CHECK(f16_to_float(0x03ff) == 1023 * 0x1p-24f);
  CHECK(f16_to_float(0x8001) == -0x1p-24f);
}

TEST_CASE("float16: every finite value survives a round trip, and conversion matches the compiler's") {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    if (f16_is_nan(bits)) {
      CHECK(std::isnan(f16_to_float(bits)));
      continue;
    }
    REQUIRE(float_to_f16(f16_to_float(bits)) == bits);
  }
#if defined(__FLT16_MAX__)
  // GCC's _Float16 conversion (F16C or libgcc's soft-float) is an independent round-to-nearest-even.
  int mismatches = 0;
  for (std::uint64_t u = 0; u <= 0xffffffffu; u += 4093) {
    const float f = from_bits(static_cast<std::uint32_t>(u));
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    std::uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, sizeof ref_bits);
    if (float_to_f16(f) != ref_bits) ++mismatches;
  }
  CHECK(mismatches == 0);
#endif
}

TEST_CASE("bfloat16 conversion gives known bits, rounds ties to even and keeps NaN, Inf and denormals") {
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(-2.0f) == 0xc000);
  CHECK(float_to_bf16(0.1f) == 0x3dcd);           // 0x3dcccccd rounds up
  CHECK(float_to_bf16(1.0f / 3.0f) == 0x3eab);    // 0x3eaaaaab rounds up
  CHECK(float_to_bf16(1.0f + 0x1p-8f) == 0x3f80);      // tie, even is down
  CHECK(float_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);  // tie, even is up
  CHECK(float_to_bf16(std::nextafter(1.0f + 0x1p-8f, 2.0f)) == 0x3f81);
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds past the largest: inf
  CHECK(float_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(float_to_bf16(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(bf16_is_nan(float_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(bf16_is_nan(float_to_bf16(from_bits(0x7f800001u))));  // would round to inf without the NaN check
  CHECK(float_to_bf16(from_bits(0x00010000u)) == 0x0001);     // denormals keep their bits
  CHECK(float_to_bf16(from_bits(0x00008000u)) == 0x0000);     // tie to even
  CHECK(float_to_bf16(from_bits(0x00018000u)) == 0x0002);     // tie to even
  CHECK(float_to_bf16(-0.0f) == 0x8000);
  CHECK(bf16_to_float(0x3eab) == 0.333984375f);
  CHECK(to_bits(bf16_to_float(0x0001)) == 0x00010000u);
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    if (bf16_is_nan(bits)) continue;
    REQUIRE(float_to_bf16(bf16_to_float(bits)) == bits);
  }
}

TEST_CASE("compress_range and decompress_range convert whole buffers and refuse other types") {
  const std::vector<float> in = {1.0f, 0.1f, -65520.0f, 1e-40f, 3 * 0x1p-25f};
  std::vector<std::uint16_t> half(in.size());
  std::vector<float> back(in.size());
  compress_range(in.data(), half.data(), 5, scalar_type::f16);
  CHECK(half == std::vector<std::uint16_t>{0x3c00, 0x2e66, 0xfc00, 0x0000, 0x0002});
  decompress_range(half.data(), back.data(), 5, scalar_type::f16);
  CHECK(back[1] == 0.0999755859375f);
  compress_range(in.data(), half.data(), 5, scalar_type::bf16);
  CHECK(half[1] == 0x3dcd);
  decompress_range(half.data(), back.data(), 5, scalar_type::bf16);
  CHECK(back[0] == 1.0f);
  CHECK_THROWS_WITH_AS(compress_range(in.data(), half.data(), 5, scalar_type::f32),
                       "compress_range: element type float32 is not a 16-bit wire format (expected float16 or bfloat16)",
                       std::invalid_argument);
}

TEST_CASE("reduce_range sums f16 and bf16 in float32 in input order and rounds once") {
  for (const scalar_type type : {scalar_type::f16, scalar_type::bf16}) {
    CAPTURE(troupe::base::scalar_name(type));
    const auto narrow = type == scalar_type::f16 ? float_to_f16 : float_to_bf16;
    const auto widen = type == scalar_type::f16 ? f16_to_float : bf16_to_float;
    // 5000 elements: more than one block of the kernel.
    const std::int64_t count = 5000;
    std::vector<std::vector<std::uint16_t>> ins(3, std::vector<std::uint16_t>(count));
    for (std::int64_t i = 0; i < count; ++i) {
      for (int r = 0; r < 3; ++r) ins[r][i] = narrow(0.37f * static_cast<float>(i % 97 - 48) + 0.011f * static_cast<float>(r));
    }
    const void* ptrs[3] = {ins[0].data(), ins[1].data(), ins[2].data()};
    std::vector<std::uint16_t> sum(count), mean(count);
    void* out_sum = sum.data();
    void* out_mean = mean.data();
    reduce_range(ptrs, 3, &out_sum, 1, 0, count, type, reduce_kind::sum);
    reduce_range(ptrs, 3, &out_mean, 1, 0, count, type, reduce_kind::mean);
    for (std::int64_t i = 0; i < count; ++i) {
      const float s = (widen(ins[0][i]) + widen(ins[1][i])) + widen(ins[2][i]);
      REQUIRE(sum[i] == narrow(s));
      REQUIRE(mean[i] == narrow(s / 3.0f));
    }
    std::vector<std::uint16_t> scaled = sum;
    scale_range(scaled.data(), count, type, 4);
    for (std::int64_t i = 0; i < count; ++i) REQUIRE(scaled[i] == narrow(widen(sum[i]) / 4.0f));
  }
  // 1 + 2^-11 is a tie in f16: the float32 sum rounds once, to 1.
  const std::uint16_t one = 0x3c00, tiny = float_to_f16(0x1p-11f);
  const void* ptrs[2] = {&one, &tiny};
  std::uint16_t out = 0;
  void* outp = &out;
  reduce_range(ptrs, 2, &outp, 1, 0, 1, scalar_type::f16, reduce_kind::sum);
  CHECK(out == 0x3c00);
}

TEST_CASE("compress_range and decompress_range give the scalar conversions' bits on every path (F16C where present)") {
  // Every 16-bit pattern widens the same; a sweep over float32 (every class: zeros, denormals,
  // normals, overflow, infinities, NaNs) narrows the same, at every offset of an 8-wide block.
  for (const scalar_type type : {scalar_type::f16, scalar_type::bf16}) {
    CAPTURE(troupe::base::scalar_name(type));
    const auto narrow = type == scalar_type::f16 ? float_to_f16 : float_to_bf16;
    const auto widen = type == scalar_type::f16 ? f16_to_float : bf16_to_float;
    std::vector<std::uint16_t> all(0x10000);
    for (std::uint32_t h = 0; h < 0x10000u; ++h) all[h] = static_cast<std::uint16_t>(h);
    std::vector<float> wide(all.size());
    decompress_range(all.data(), wide.data(), static_cast<std::int64_t>(all.size()), type);
    for (std::uint32_t h = 0; h < 0x10000u; ++h) REQUIRE(to_bits(wide[h]) == to_bits(widen(all[h])));
    std::vector<float> floats;
    for (std::uint64_t u = 0; u <= 0xffffffffu; u += 65521) floats.push_back(from_bits(static_cast<std::uint32_t>(u)));
    for (const std::uint32_t u : {0x00000001u, 0x33000000u, 0x33000001u, 0x387fe000u, 0x477ff000u, 0x477fefffu,
                                  0x7f800000u, 0xff800000u, 0x7f800001u, 0xffc00000u, 0x7fffffffu, 0x80000000u}) {
      floats.push_back(from_bits(u));
    }
    std::vector<std::uint16_t> packed(floats.size());
    compress_range(floats.data(), packed.data(), static_cast<std::int64_t>(floats.size()), type);
    for (std::size_t i = 0; i < floats.size(); ++i) {
      CAPTURE(to_bits(floats[i]));
      REQUIRE(packed[i] == narrow(floats[i]));
    }
  }
}

}  // namespace TROUPE_TEST_FILE
