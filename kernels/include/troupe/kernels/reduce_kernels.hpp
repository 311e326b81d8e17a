#pragma once

#include <cstdint>

#include "troupe/base/elements.hpp"

namespace troupe::kernels {

using base::reduce_kind;
using base::scalar_type;

/// Elements [begin, end) of the reduction over `n` inputs, summed in input order 0..n-1 (the
/// fixed order that makes results bit-identical everywhere), divided by n for mean, and written
/// to each of the `num_outs` outputs. f16 and bf16 elements are summed (and divided) in float32
/// and rounded once to their format (half_kernels.hpp). `streaming` writes the outputs around the cache (for
/// results too large to stay in it) and fences the stores before returning.
void reduce_range(const void* const* ins, int n, void* const* outs, int num_outs, std::int64_t begin,
                  std::int64_t end, scalar_type type, reduce_kind op, bool streaming = false);

/// Divides `count` elements at `data` by `divisor` in place (integer types truncate; f16 and bf16
/// divide in float32 and round to nearest even).
void scale_range(void* data, std::int64_t count, scalar_type type, int divisor);

}  // namespace troupe::kernels
