#pragma once

#include <cstdint>

#include "troupe/transport/shm_group.hpp"

namespace troupe::transport {

/// Elements [begin, end) of the reduction over `n` inputs, summed in input order 0..n-1 (the
/// fixed order that makes results bit-identical everywhere), divided by n for mean, and written
/// to each of the `num_outs` outputs.
void reduce_range(const void* const* ins, int n, void* const* outs, int num_outs, std::int64_t begin,
                  std::int64_t end, scalar_type type, reduce_kind op);

}  // namespace troupe::transport
