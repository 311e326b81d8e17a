#include "troupe/nn/conv.hpp"

#include <algorithm>
#include <mutex>
#include <optional>
#include <cmath>
#include <random>
#include <cstring>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "nn/eigen_maps.hpp"
#include "nn/layer_checks.hpp"

namespace troupe::nn {

namespace {

// Glorot-uniform as Keras draws a convolution's kernel: uniform in ±sqrt(6 / (fan_in + fan_out))
// with fan_in = kh·kw·in and fan_out = kh·kw·filters, from mt19937_64 (its sequence is fixed by the
// standard, so the bits are the same everywhere).
Tensor glorot_kernel(Size2 size, int in, int filters, std::uint64_t seed, DType dtype) {
  const std::int64_t area = std::int64_t{size.height} * size.width;
  const double limit = std::sqrt(6.0 / static_cast<double>(area * in + area * filters));
  std::mt19937_64 engine(seed);
  Tensor out = Tensor::empty({size.height, size.width, in, filters}, dtype);
  eigen::dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = out.mutable_data<T>();
    for (std::int64_t i = 0; i < out.num_elements(); ++i) {
      const double unit = static_cast<double>(engine() >> 11) * 0x1.0p-53;  // [0, 1)
      p[i] = static_cast<T>((2.0 * unit - 1.0) * limit);
    }
  });
  return out;
}

// The geometry of one call: input, output and window.
struct Geometry {
  std::int64_t batch, height, width, channels;
  std::int64_t kh, kw, sh, sw;
  detail::Window rows, cols;
  std::int64_t patch() const { return kh * kw * channels; }
  std::int64_t positions() const { return batch * rows.out * cols.out; }
};

// cols[(n, oy, ox), (ky, kx, c)] = x[n, oy·sh - top + ky, ox·sw - left + kx, c], 0 in the padding:
// the patch order of a [kh, kw, c, filters] kernel read as [kh·kw·c, filters].
template <class T>
void im2col(const T* x, T* out, const Geometry& g) {
  const std::int64_t c = g.channels;
  for (std::int64_t n = 0; n < g.batch; ++n) {
    for (std::int64_t oy = 0; oy < g.rows.out; ++oy) {
      for (std::int64_t ox = 0; ox < g.cols.out; ++ox) {
        T* dst = out + ((n * g.rows.out + oy) * g.cols.out + ox) * g.patch();
        for (std::int64_t ky = 0; ky < g.kh; ++ky) {
          const std::int64_t iy = oy * g.sh - g.rows.pad_before + ky;
          for (std::int64_t kx = 0; kx < g.kw; ++kx, dst += c) {
            const std::int64_t ix = ox * g.sw - g.cols.pad_before + kx;
            if (iy < 0 || iy >= g.height || ix < 0 || ix >= g.width) {
              std::fill(dst, dst + c, T(0));
            } else {
              std::memcpy(dst, x + ((n * g.height + iy) * g.width + ix) * c, static_cast<std::size_t>(c) * sizeof(T));
            }
          }
        }
      }
    }
  }
}

// The adjoint of im2col: every patch element added back to the input position it came from, in
// one fixed order (the same bits on every run).
template <class T>
void col2im(const T* cols, T* dx, const Geometry& g) {
  const std::int64_t c = g.channels;
  std::fill(dx, dx + g.batch * g.height * g.width * c, T(0));
  for (std::int64_t n = 0; n < g.batch; ++n) {
    for (std::int64_t oy = 0; oy < g.rows.out; ++oy) {
      for (std::int64_t ox = 0; ox < g.cols.out; ++ox) {
        const T* src = cols + ((n * g.rows.out + oy) * g.cols.out + ox) * g.patch();
        for (std::int64_t ky = 0; ky < g.kh; ++ky) {
          const std::int64_t iy = oy * g.sh - g.rows.pad_before + ky;
          for (std::int64_t kx = 0; kx < g.kw; ++kx, src += c) {
            const std::int64_t ix = ox * g.sw - g.cols.pad_before + kx;
            if (iy < 0 || iy >= g.height || ix < 0 || ix >= g.width) continue;
            T* to = dx + ((n * g.height + iy) * g.width + ix) * c;
            for (std::int64_t k = 0; k < c; ++k) to[k] += src[k];
          }
        }
      }
    }
  }
}

// A 1x1 kernel with stride 1 reads each input position once: its patches are the input itself.
bool patches_are_input(const Geometry& g) { return g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1; }

Tensor patches(const Tensor& x, const Geometry& g) {
  if (patches_are_input(g)) return x.reshape({g.positions(), g.patch()});
  Tensor out = Tensor::empty({g.positions(), g.patch()}, x.dtype());
  eigen::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    im2col(x.data<T>(), out.mutable_data<T>(), g);
  });
  return out;
}

}  // namespace

struct Conv2D::State {
  mutable std::mutex mutex;
  int channels = -1;
  std::optional<Variable> kernel;
  std::optional<Variable> bias;
};

Conv2D::Conv2D(int filters, Size2 kernel_size, Size2 strides, Padding padding, Activation activation,
               std::uint64_t seed, std::string name, DType dtype)
    : Layer(std::move(name)),
      filters_(detail::positive("Conv2D", filters, "filters")),
      kernel_size_(detail::positive("Conv2D", kernel_size, "kernel_size")),
      strides_(detail::positive("Conv2D", strides, "strides")),
      padding_(padding),
      activation_(activation),
      seed_(seed),
      dtype_(detail::float_dtype("Conv2D", dtype)),
      state_(std::make_shared<State>()) {}

Conv2D::Conv2D(int filters, Size2 kernel_size, Size2 strides, const std::string& padding, Activation activation,
               std::uint64_t seed, std::string name, DType dtype)
    : Conv2D(filters, kernel_size, strides, padding_from_name(padding, "Conv2D"), activation, seed, std::move(name),
             dtype) {}

void Conv2D::build(const Shape& input_shape) const {
  if (input_shape.size() != 4 || input_shape[3] <= 0) {
    throw std::invalid_argument(who() + ": input of shape " + shape_to_string(input_shape) +
                                " (expected [batch, height, width, channels] with the channels known)");
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->kernel) return;
  const int channels = static_cast<int>(input_shape[3]);
  state_->kernel.emplace(glorot_kernel(kernel_size_, channels, filters_, seed_, dtype_),
                         detail::variable_name(name(), "kernel"));
  state_->bias.emplace(Tensor::zeros({filters_}, dtype_), detail::variable_name(name(), "bias"));
  state_->channels = channels;
}

bool Conv2D::built() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->kernel.has_value();
}

int Conv2D::input_channels() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->channels;
}

const Variable& Conv2D::kernel() const {
  if (!built()) throw std::logic_error(who() + ".kernel: the layer is not built yet (its input channels come from its first input, or build())");
  return *state_->kernel;
}

const Variable& Conv2D::bias() const {
  if (!built()) throw std::logic_error(who() + ".bias: the layer is not built yet (its input channels come from its first input, or build())");
  return *state_->bias;
}

std::vector<std::pair<std::string, Variable>> Conv2D::weights() const {
  if (!built()) return {};
  return {{"kernel", *state_->kernel}, {"bias", *state_->bias}};
}

Shape Conv2D::input_shape() const { return {-1, -1, -1, input_channels()}; }

Shape Conv2D::output_shape(const Shape& input_shape) const {
  const int channels = input_channels();
  detail::check_input_shape(who(), input_shape, {-1, -1, -1, channels},
                            channels < 0 ? std::string("[batch, height, width, channels]")
                                         : "[batch, height, width, " + std::to_string(channels) + "]");
  const detail::Window rows = detail::window(input_shape[1], kernel_size_.height, strides_.height, padding_);
  const detail::Window cols = detail::window(input_shape[2], kernel_size_.width, strides_.width, padding_);
  if (rows.out == 0 || cols.out == 0) {
    throw std::invalid_argument(who() + ": input of shape " + shape_to_string(input_shape) + " is smaller than the " +
                                std::to_string(kernel_size_.height) + "x" + std::to_string(kernel_size_.width) +
                                " kernel (expected height and width at least the kernel's with valid padding)");
  }
  return {input_shape[0], rows.out, cols.out, filters_};
}

void Conv2D::check_input(const Tensor& x) const {
  detail::check_float_input(who(), x, &dtype_);
  output_shape(x.shape());
}

Tensor Conv2D::call(const Tensor& x_in, const CallContext&) const {
  check_input(x_in);
  const Tensor x = detail::on_host(x_in);
  const Shape out_shape = output_shape(x.shape());
  const Geometry g{x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3], kernel_size_.height, kernel_size_.width,
                   strides_.height, strides_.width,
                   detail::window(x.shape()[1], kernel_size_.height, strides_.height, padding_),
                   detail::window(x.shape()[2], kernel_size_.width, strides_.width, padding_)};
  const Tensor kernel = detail::on_host(this->kernel().value()).reshape({g.patch(), filters_});
  const Tensor out = dense_forward(patches(x, g), kernel, detail::on_host(bias().value()), activation_);
  return detail::like_device(out.reshape(out_shape), x_in);
}

LayerGradients Conv2D::gradients(const Tensor& x_in, const Tensor& output, const Tensor& grad_output,
                                 const CallContext&, bool need_input) const {
  check_input(x_in);
  detail::check_grad_output(who(), grad_output, output);
  if (output.shape() != output_shape(x_in.shape())) {
    throw std::invalid_argument(who() + ": output of shape " + shape_to_string(output.shape()) + " for input " +
                                shape_to_string(x_in.shape()) + " (expected " +
                                shape_to_string(output_shape(x_in.shape())) + ", what forward gives)");
  }
  const Tensor x = detail::on_host(x_in);
  const Geometry g{x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3], kernel_size_.height, kernel_size_.width,
                   strides_.height, strides_.width,
                   detail::window(x.shape()[1], kernel_size_.height, strides_.height, padding_),
                   detail::window(x.shape()[2], kernel_size_.width, strides_.width, padding_)};
  const Tensor kernel_value = detail::on_host(kernel().value());
  const Tensor kernel = kernel_value.reshape({g.patch(), filters_});
  DenseGradients d = dense_backward(patches(x, g), kernel, detail::on_host(output).reshape({g.positions(), filters_}),
                                    detail::on_host(grad_output).reshape({g.positions(), filters_}), activation_,
                                    need_input);
  LayerGradients out;
  out.variables.push_back(detail::like_device(d.kernel.reshape(kernel_value.shape()), grad_output));
  out.variables.push_back(detail::like_device(d.bias, grad_output));
  if (need_input) {
    if (patches_are_input(g)) {
      out.input = d.input.reshape(x.shape());
    } else {
      out.input = Tensor::empty(x.shape(), x.dtype());
      eigen::dispatch_float(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        col2im(d.input.data<T>(), out.input.mutable_data<T>(), g);
      });
    }
    out.input = detail::like_device(out.input, x_in);
  }
  return out;
}

std::string Conv2D::config_json() const {
  return nlohmann::json{{"filters", filters_},
                        {"kernel_size", {kernel_size_.height, kernel_size_.width}},
                        {"strides", {strides_.height, strides_.width}},
                        {"padding", padding_name(padding_)},
                        {"activation", activation_name(activation_)},
                        {"seed", seed_},
                        {"dtype", std::string(dtype_name(dtype_))}}
      .dump();
}

}  // namespace troupe::nn
