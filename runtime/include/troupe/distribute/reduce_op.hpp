#pragma once

#include <string_view>

namespace troupe::distribute {

/// How values from several replicas are combined.
enum class ReduceOp { sum, mean };

/// "SUM", "sum", "MEAN", "mean" (any case); anything else throws std::invalid_argument.
ReduceOp parse_reduce_op(std::string_view name);

/// "SUM" or "MEAN".
std::string_view reduce_op_name(ReduceOp op);

}  // namespace troupe::distribute
