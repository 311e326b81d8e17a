#include "troupe/distribute/reduce_op.hpp"

#include <cctype>
#include <stdexcept>
#include <string>

namespace troupe::distribute {

ReduceOp parse_reduce_op(std::string_view name) {
  std::string upper(name);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (upper == "SUM") return ReduceOp::sum;
  if (upper == "MEAN") return ReduceOp::mean;
  throw std::invalid_argument("reduce op \"" + std::string(name) + "\" is not known (expected \"SUM\" or \"MEAN\")");
}

std::string_view reduce_op_name(ReduceOp op) { return op == ReduceOp::sum ? "SUM" : "MEAN"; }

}  // namespace troupe::distribute
