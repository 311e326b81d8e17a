// The conversions behind troupe::float16_t and troupe::bfloat16_t: kernels/half_kernels' bit
// exact float32 conversions, with float64 and integers rounded to odd in float32 first, so that
// every conversion rounds once.
#include "troupe/half.hpp"

#include "troupe/kernels/half_kernels.hpp"

namespace troupe::detail {

std::uint16_t float16_bits_of(float v) noexcept { return kernels::float_to_f16(v); }
std::uint16_t float16_bits_of(double v) noexcept { return kernels::float_to_f16(kernels::float_round_to_odd(v)); }
std::uint16_t float16_bits_of(std::int64_t v) noexcept { return kernels::float_to_f16(kernels::float_round_to_odd(v)); }
std::uint16_t float16_bits_of(std::uint64_t v) noexcept { return kernels::float_to_f16(kernels::float_round_to_odd(v)); }
float float16_value(std::uint16_t bits) noexcept { return kernels::f16_to_float(bits); }

std::uint16_t bfloat16_bits_of(float v) noexcept { return kernels::float_to_bf16(v); }
std::uint16_t bfloat16_bits_of(double v) noexcept { return kernels::float_to_bf16(kernels::float_round_to_odd(v)); }
std::uint16_t bfloat16_bits_of(std::int64_t v) noexcept {
  return kernels::float_to_bf16(kernels::float_round_to_odd(v));
}
std::uint16_t bfloat16_bits_of(std::uint64_t v) noexcept {
  return kernels::float_to_bf16(kernels::float_round_to_odd(v));
}
float bfloat16_value(std::uint16_t bits) noexcept { return kernels::bf16_to_float(bits); }

}  // namespace troupe::detail
