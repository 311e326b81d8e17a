#pragma once

namespace troupe::detail {

/// Checks `axis` against a tensor of rank `rank` and returns it in 0..rank-1 (negative counts
/// from the end); otherwise std::invalid_argument naming `op`, e.g.
/// "gather: axis 3 out of range for rank-2 tensor (expected 0..1)".
int checked_axis(const char* op, int axis, int rank);

}  // namespace troupe::detail
