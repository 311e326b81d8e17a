#include "troupe/nn/flatten.hpp"

#include <stdexcept>

#include "nn/layer_checks.hpp"

namespace troupe::nn {

Shape Flatten::output_shape(const Shape& input_shape) const {
  if (input_shape.empty()) {
    throw std::invalid_argument(who() + ": input of shape [] (expected a batch: [batch, ...])");
  }
  std::int64_t features = 1;
  for (std::size_t d = 1; d < input_shape.size(); ++d) {
    if (input_shape[d] < 0) return {input_shape[0], -1};
    features *= input_shape[d];
  }
  return {input_shape[0], features};
}

Tensor Flatten::call(const Tensor& x, const CallContext&) const { return x.reshape(output_shape(x.shape())); }

LayerGradients Flatten::gradients(const Tensor& x, const Tensor& output, const Tensor& grad_output, const CallContext&,
                                  bool need_input) const {
  detail::check_grad_output(who(), grad_output, output);
  if (output.num_elements() != x.num_elements()) {
    throw std::invalid_argument(who() + ": output of shape " + shape_to_string(output.shape()) + " for input " +
                                shape_to_string(x.shape()) + " (expected " + shape_to_string(output_shape(x.shape())) +
                                ", what forward gives)");
  }
  LayerGradients out;
  if (need_input) out.input = grad_output.reshape(x.shape());
  return out;
}

}  // namespace troupe::nn
