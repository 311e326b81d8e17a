#include "troupe/kernels/half_kernels.hpp"

#include <stdexcept>
#include <string>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TROUPE_HAVE_F16C_PATH 1
#endif

namespace troupe::kernels {
namespace {

[[noreturn]] void not_16_bit(const char* op, scalar_type type) {
  throw std::invalid_argument(std::string(op) + ": element type " + base::scalar_name(type) +
                              " is not a 16-bit wire format (expected float16 or bfloat16)");
}

#if defined(TROUPE_HAVE_F16C_PATH)
// F16C converts 8 elements per instruction. Its conversion is IEEE's, with the rounding given in
// the instruction (nearest even, whatever MXCSR says) and NaNs quieted the same way as
// float_to_f16, so it gives the same bits as the portable code (tested on every float32 class). The
// library is built for the x86-64 baseline, hence the target attribute and the check at run time.
bool have_f16c() {
  static const bool yes = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return yes;
}

__attribute__((target("avx,f16c"))) std::int64_t compress_f16c(const float* in, std::uint16_t* out,
                                                                 std::int64_t count) {
  std::int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  return i;
}

__attribute__((target("avx,f16c"))) std::int64_t decompress_f16c(const std::uint16_t* in, float* out,
                                                                   std::int64_t count) {
  std::int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
  return i;
}
#endif

}  // namespace

void compress_range(const float* in, std::uint16_t* out, std::int64_t count, scalar_type type) {
  if (type == scalar_type::f16) {
    std::int64_t i = 0;
#if defined(TROUPE_HAVE_F16C_PATH)
    if (have_f16c()) i = compress_f16c(in, out, count);
#endif
    for (; i < count; ++i) out[i] = float_to_f16(in[i]);
  } else if (type == scalar_type::bf16) {
    for (std::int64_t i = 0; i < count; ++i) out[i] = float_to_bf16(in[i]);
  } else {
    not_16_bit("compress_range", type);
  }
}

void decompress_range(const std::uint16_t* in, float* out, std::int64_t count, scalar_type type) {
  if (type == scalar_type::f16) {
    std::int64_t i = 0;
#if defined(TROUPE_HAVE_F16C_PATH)
    if (have_f16c()) i = decompress_f16c(in, out, count);
#endif
    for (; i < count; ++i) out[i] = f16_to_float(in[i]);
  } else if (type == scalar_type::bf16) {
    for (std::int64_t i = 0; i < count; ++i) out[i] = bf16_to_float(in[i]);
  } else {
    not_16_bit("decompress_range", type);
  }
}

}  // namespace troupe::kernels
