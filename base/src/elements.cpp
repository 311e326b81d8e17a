#include "troupe/base/elements.hpp"

#include <stdexcept>

namespace troupe::base {

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

void check_agree(std::string_view op, const sent_tensor& first, const sent_tensor& other, int free_axis,
                 std::string_view hint) {
  bool same = first.type == other.type && first.shape.size() == other.shape.size();
  for (std::size_t d = 0; same && d < first.shape.size(); ++d) {
    same = static_cast<int>(d) == free_axis || first.shape[d] == other.shape[d];
  }
  if (same) return;
  std::string message(op);
  message += ": ";
  message += first.who;
  message += " sent ";
  message += scalar_name(first.type);
  message += " tensor of shape " + shape_string(first.shape) + ", ";
  message += other.who;
  message += " sent ";
  message += scalar_name(other.type);
  message += " tensor of shape " + shape_string(other.shape);
  message += hint;
  throw std::invalid_argument(message);
}

}  // namespace troupe::base
