#include "troupe/kernels/half_kernels.hpp"

#include <stdexcept>
#include <string>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TROUPE_HAVE_F16C_PATH 1
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
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

#if defined(__SSE2__)
// bfloat16 four at a time with SSE2 (every x86-64 has it): the same integer steps as
// float_to_bf16, with the NaN case chosen by mask.
std::int64_t compress_bf16_sse2(const float* in, std::uint16_t* out, std::int64_t count) {
  const __m128i abs_mask = _mm_set1_epi32(0x7fffffff);
  const __m128i inf = _mm_set1_epi32(0x7f800000);
  const __m128i bias = _mm_set1_epi32(0x7fff);
  const __m128i one = _mm_set1_epi32(1);
  const __m128i quiet = _mm_set1_epi32(0x0040);
  auto narrow4 = [&](__m128i u) {
    const __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(u, abs_mask), inf);
    const __m128i rounded = _mm_srli_epi32(_mm_add_epi32(_mm_add_epi32(u, bias), _mm_and_si128(_mm_srli_epi32(u, 16), one)), 16);
    const __m128i quieted = _mm_or_si128(_mm_srli_epi32(u, 16), quiet);
    const __m128i h = _mm_or_si128(_mm_and_si128(nan, quieted), _mm_andnot_si128(nan, rounded));
    return _mm_srai_epi32(_mm_slli_epi32(h, 16), 16);  // sign-extended: the signed pack keeps the bits
  };
  std::int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i lo = narrow4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    const __m128i hi = narrow4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 4)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_packs_epi32(lo, hi));
  }
  return i;
}

std::int64_t decompress_bf16_sse2(const std::uint16_t* in, float* out, std::int64_t count) {
  const __m128i zero = _mm_setzero_si128();
  std::int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_unpacklo_epi16(zero, h));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 4), _mm_unpackhi_epi16(zero, h));
  }
  return i;
}
#endif

#if defined(TROUPE_HAVE_F16C_PATH)
// The same eight at a time with AVX2, where the CPU has it.
bool have_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

__attribute__((target("avx2"), always_inline)) inline __m256i narrow_bf16_avx2(__m256i u) {
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
  const __m256i quieted = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
  const __m256i h = _mm256_blendv_epi8(rounded, quieted, nan);
  return _mm256_srai_epi32(_mm256_slli_epi32(h, 16), 16);  // sign-extended: the signed pack keeps the bits
}

__attribute__((target("avx2"))) std::int64_t compress_bf16_avx2(const float* in, std::uint16_t* out,
                                                                 std::int64_t count) {
  std::int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m256i lo = narrow_bf16_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    const __m256i hi = narrow_bf16_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i + 8)));
    // packs works within 128-bit lanes: put the four 64-bit quarters back in element order.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xd8));
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
    std::int64_t i = 0;
#if defined(TROUPE_HAVE_F16C_PATH)
    if (have_avx2()) i = compress_bf16_avx2(in, out, count);
#endif
#if defined(__SSE2__)
    i += compress_bf16_sse2(in + i, out + i, count - i);
#endif
    for (; i < count; ++i) out[i] = float_to_bf16(in[i]);
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
    std::int64_t i = 0;
#if defined(__SSE2__)
    i = decompress_bf16_sse2(in, out, count);
#endif
    for (; i < count; ++i) out[i] = bf16_to_float(in[i]);
  } else {
    not_16_bit("decompress_range", type);
  }
}

}  // namespace troupe::kernels
