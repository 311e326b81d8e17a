#include "troupe/kernels/half_kernels.hpp"

#include <stdexcept>
#include <string>

namespace troupe::kernels {
namespace {

[[noreturn]] void not_16_bit(const char* op, scalar_type type) {
  throw std::invalid_argument(std::string(op) + ": element type " + base::scalar_name(type) +
                              " is not a 16-bit wire format (expected float16 or bfloat16)");
}

}  // namespace

void compress_range(const float* in, std::uint16_t* out, std::int64_t count, scalar_type type) {
  if (type == scalar_type::f16) {
    for (std::int64_t i = 0; i < count; ++i) out[i] = float_to_f16(in[i]);
  } else if (type == scalar_type::bf16) {
    for (std::int64_t i = 0; i < count; ++i) out[i] = float_to_bf16(in[i]);
  } else {
    not_16_bit("compress_range", type);
  }
}

void decompress_range(const std::uint16_t* in, float* out, std::int64_t count, scalar_type type) {
  if (type == scalar_type::f16) {
    for (std::int64_t i = 0; i < count; ++i) out[i] = f16_to_float(in[i]);
  } else if (type == scalar_type::bf16) {
    for (std::int64_t i = 0; i < count; ++i) out[i] = bf16_to_float(in[i]);
  } else {
    not_16_bit("decompress_range", type);
  }
}

}  // namespace troupe::kernels
